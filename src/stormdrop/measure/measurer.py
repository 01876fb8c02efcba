"""The measurer interface: what tuning asks of whatever times its candidates. ``Gateway`` (builds
and runs on this machine or RPC devices) is the real one; ``measure.replay.ReplayMeasurer``
answers from recorded or synthetic results without building anything, so that the search, the
driver and the budget can be exercised in milliseconds.

Contracts:
- ``prepare(key, workload, seed)``: called once per workload before its candidates are measured
  (the gateway makes the reference outputs a candidate is checked against before the workload's
  first candidate is timed; ``Gateway.make_references`` makes many side by side).
- ``measure(key, mods, on_result)``: one ``MeasureResult`` per module, in order; ``key`` is the
  workload's key, or one key per module. ``on_result(i, result)`` hears each result as soon as it
  is known, so a caller commits it at once. A failure is a typed result, never an exception.
- ``candidate_s()``, ``batch_s(n)``, ``compile_s(kernels)``: wall-second estimates from what was
  measured so far ((0, 0) / 0 before anything), read by the budget to keep time for the finish.
- ``builders``: how many candidates it builds side by side (a batch of fewer leaves some idle).
- ``config``: the ``MeasureConfig`` it measures with (``check_correctness`` says whether a
  verified result was checked against the reference).
- ``close()``: stop its processes; a measurer is a context manager too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import tvm

from stormdrop.records import MeasureResult


@runtime_checkable
class Measurer(Protocol):
    """Times candidates of prepared workloads; see the module docstring."""

    config: object
    builders: int

    def prepare(self, key: str, workload: tvm.IRModule, seed: int = 0) -> None: ...

    def measure(self, key: str | Sequence[str], mods: list[tvm.IRModule],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]: ...

    def candidate_s(self) -> tuple[float, float]: ...

    def batch_s(self, n: int) -> float: ...

    def compile_s(self, kernels: int) -> float: ...

    def close(self) -> None: ...
