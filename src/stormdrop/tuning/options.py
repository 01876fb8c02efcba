"""What a kernel tune is asked to do (``KernelOptions``), as one value built once and only read
below; how its task is searched is a ``SearchOptions`` inside it. Where the target and the
database go are arguments of their own, not options."""

from __future__ import annotations

from dataclasses import dataclass, field

from stormdrop.measure.gateway import MeasureConfig
from stormdrop.search.options import SearchOptions


@dataclass(frozen=True)
class KernelOptions:
    """``tune_kernel``: reuse + storm for ``trials`` candidates, then the raindrop for at most
    ``exploit_trials`` (None: as many as ``trials``); ``time_budget`` seconds at most (None: no
    limit). ``measure`` None: the kernel defaults (``MeasureConfig.for_kernels``). ``final_candidates``:
    the kernel reported is the fastest of the best this many records timed side by side in turns
    (``tuning.verify.fastest_in_turns``; 1, the default: the verified best as stored; not the default
    because it did not pay where it was measured, benchmarks/RESULTS.md "Final pick")."""

    trials: int = 64
    exploit_trials: int | None = None
    time_budget: float | None = None
    seed: int = 0
    search: SearchOptions = field(default_factory=SearchOptions)
    measure: MeasureConfig | None = None
    progress: bool = False
    final_candidates: int = 1
