"""How big a local runner process is, and how big it may grow before the gateway restarts it.

TVM leaks the memory of a candidate library that allocates a large intermediate buffer when the
library is unloaded (see ``tvm_compat.runtime``' notes): a runner timing such candidates grows without end.
"""

from __future__ import annotations

import os


def process_rss_mb(pid: int) -> float:
    """Resident memory of a local process in MB (Linux ``/proc``; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def runner_memory_limit_mb() -> float:
    """How far a local runner process may grow (see the leak in the module docstring) before it is
    restarted: a quarter of the machine's memory, between 1.5 and 4 GB (a fresh runner holding
    TVM, the workloads' inputs and references takes under 1 GB)."""
    try:
        total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):
        total_mb = 16384.0
    return max(1536.0, min(4096.0, total_mb / 4))
