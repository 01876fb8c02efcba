"""A measurer that builds and runs nothing (``measurer.Measurer``): each candidate's result is
an answer looked up or computed from the candidate's module, as Kernel Tuner's simulation runner
answers from a cache of earlier measurements. It lets the search, the driver and the budget run
end to end in milliseconds a candidate: tests drive real tuners with it, and a recorded database
can be replayed to study a search policy without the machine it was measured on.

Answers:
- ``recorded(db, target)``: the stored result of every record of every workload in ``db`` on
  ``target`` (its trace replayed onto its workload), keyed by (workload key, the candidate
  module's structural hash); a candidate never recorded gets ``missing`` (a run error unless
  said otherwise).
- ``synthetic(seed)``: a time drawn from the module's structural hash, the same for the same
  schedule in every run, with ``repeat`` slightly different samples (a t-test sees variance).

Time: with a ``SimClock``, each measured batch advances it as a gateway would take (builds on
``builders`` side by side, then each run alone), and ``candidate_s``/``batch_s``/``compile_s``
answer from those costs; pass the same clock to the ``Budget`` to test deadlines.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

import tvm
import tvm_ffi

from stormdrop.measure.costs import batch_s
from stormdrop.measure.gateway import MeasureConfig
from stormdrop.records import ErrorKind, MeasureResult

Answer = Callable[[str, tvm.IRModule], MeasureResult]


class SimClock:
    """A clock that moves only when told (``advance``); calling it reads the time."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def module_hash(mod: tvm.IRModule) -> int:
    """The structural hash of a candidate's module (the same schedule gives the same hash)."""
    return int(tvm_ffi.structural_hash(mod))


def synthetic(seed: int = 0, base_s: float = 1e-4, spread: float = 4.0, repeat: int = 5) -> Answer:
    """Times between ``base_s`` and ``spread`` x ``base_s`` drawn from the module's hash and
    ``seed``; ``repeat`` samples within 1% of their mean."""

    def answer(key: str, mod: tvm.IRModule) -> MeasureResult:
        digest = hashlib.sha256(f"{seed}:{key}:{module_hash(mod)}".encode()).digest()
        mean = base_s * (1.0 + (spread - 1.0) * int.from_bytes(digest[:4], "little") / 2**32)
        jitter = [(b - 127.5) / 127.5 * 0.01 for b in digest[4:4 + repeat]]
        return MeasureResult(run_secs=tuple(mean * (1.0 + j) for j in jitter))

    return answer


def recorded(db: object, target: str, missing: MeasureResult | None = None) -> Answer:
    """The results stored in ``db`` (a ``storage.store.RecordSource``) on canonical ``target``;
    ``missing`` for a candidate it has no record of (default: a run error saying so)."""
    from stormdrop.tvm_compat.trace_json import schedule_from_trace_json

    table: dict[tuple[str, int], MeasureResult] = {}
    for entry in db.workloads():
        for rec in db.records(entry.workload_id, target):
            try:
                mod = schedule_from_trace_json(entry.mod, rec.trace_json).mod
            except Exception:  # noqa: BLE001 - a trace that no longer replays is no candidate of a run
                continue
            table.setdefault((entry.shash, module_hash(mod)), rec.result)
    otherwise = missing or MeasureResult.failure(ErrorKind.RUN_ERROR, "replay: no recorded result")

    def answer(key: str, mod: tvm.IRModule) -> MeasureResult:
        return table.get((key, module_hash(mod)), otherwise)

    return answer


class ReplayMeasurer:
    """A ``Measurer`` whose results come from ``answer(workload key, module)``; see the module
    docstring. ``asked`` lists the workload key of every candidate measured, in order."""

    def __init__(self, answer: Answer, *, build_s: float = 0.0, run_s: float = 0.0, builders: int = 1,
                 clock: SimClock | None = None, config: MeasureConfig | None = None) -> None:
        self.answer, self.build_s, self.run_s = answer, build_s, run_s
        self.builders = max(1, builders)
        self.clock = clock
        self.config = config or MeasureConfig()
        self.prepared: dict[str, tvm.IRModule] = {}
        self.asked: list[str] = []

    def prepare(self, key: str, workload: tvm.IRModule, seed: int = 0) -> None:
        self.prepared.setdefault(key, workload)

    def measure(self, key: str | Sequence[str], mods: list[tvm.IRModule],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        keys = [key] * len(mods) if isinstance(key, str) else list(key)
        unknown = sorted(set(keys) - set(self.prepared))
        if unknown:
            raise KeyError(f"measured before prepare: {unknown[0]}")  # a gateway has no reference for it either
        if self.clock is not None:
            self.clock.advance(-(-len(mods) // self.builders) * self.build_s)
        results = []
        for i, (k, mod) in enumerate(zip(keys, mods)):
            result = self.answer(k, mod)
            if self.clock is not None:
                self.clock.advance(self.run_s)
            self.asked.append(k)
            results.append(result)
            if on_result is not None:
                on_result(i, result)
        return results

    def candidate_s(self) -> tuple[float, float]:
        return (self.build_s, self.run_s) if self.asked else (0.0, 0.0)

    def batch_s(self, n: int) -> float:
        return batch_s(n, self.builders, *self.candidate_s())

    def compile_s(self, kernels: int) -> float:
        return kernels * self.candidate_s()[0]

    def close(self) -> None:
        pass

    def __enter__(self) -> ReplayMeasurer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
