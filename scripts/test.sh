#!/usr/bin/env bash
# Install stormdrop with its test extras, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test,models]"
python -m ruff check src tests benchmarks
python -m pytest -q tests "$@"
