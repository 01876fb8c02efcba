from __future__ import annotations

import sys

from stormdrop.cli.main import main

sys.exit(main())
