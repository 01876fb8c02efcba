"""stormdrop: explore as a storm, exploit as a raindrop.

An auto-scheduler for deep-learning kernels on Apache TVM: Ansor-style exploration
(MetaSchedule's design space, evolutionary search, learned cost model), Droplet
Search exploitation, and a persistent SQLite database of every measurement.
"""

from __future__ import annotations

__version__ = "0.1.0"
