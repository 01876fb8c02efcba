"""A tuning run read back from its records: each task's trials in order, the model's estimate over time.

Everything here is computed from stored records (each has its time and phase), so the
history of any run can be rebuilt, a killed one included.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from stormdrop.records import ErrorKind, Phase, Record


@dataclass(frozen=True)
class Trial:
    """One measured candidate of a task, in measurement order."""

    index: int  # 1-based, in the order the records were committed
    elapsed_s: float  # since the run's start (its first record, unless given)
    latency_s: float | None  # None: the candidate failed
    best_s: float | None  # the task's best latency up to and including this trial
    phase: Phase
    error: ErrorKind | None

    def to_json(self) -> dict:
        return {"trial": self.index, "elapsed_s": round(self.elapsed_s, 3), "latency_s": self.latency_s,
                "best_s": self.best_s, "phase": self.phase.value,
                "error": None if self.error is None else self.error.value}


def trials_of(records: Sequence[Record], start: float | None = None) -> list[Trial]:
    """The records of one task as trials, ordered by commit time; ``start``: the run's start (epoch s)."""
    recs = sorted(records, key=lambda r: (r.measured_at, r.record_id or 0))
    if not recs:
        return []
    t0 = recs[0].measured_at if start is None else start
    out, best = [], math.inf
    for i, r in enumerate(recs, 1):
        lat = r.result.mean if r.result.ok else None
        if lat is not None:
            best = min(best, lat)
        out.append(Trial(i, r.measured_at - t0, lat, best if math.isfinite(best) else None, r.phase,
                         r.result.error))
    return out


def trials_per_phase(trials: Sequence[Trial]) -> dict[str, int]:
    counts = {p.value: 0 for p in Phase}
    for t in trials:
        counts[t.phase.value] += 1
    counts["failed"] = sum(t.error is not None for t in trials)
    return counts


def model_estimate(tasks: Sequence[tuple[int, Sequence[Trial]]]) -> list[tuple[float, float]]:
    """(elapsed s, sum of weight x best latency) after each trial, from the moment every task has a
    valid latency (before that the sum would leave tasks out). ``tasks``: (weight, trials) each."""
    events = sorted((t.elapsed_s, i, t.best_s) for i, (_, trials) in enumerate(tasks) for t in trials
                    if t.best_s is not None)
    best: dict[int, float] = {}
    out: list[tuple[float, float]] = []
    for elapsed, i, b in events:
        best[i] = b
        if len(best) == len(tasks):
            out.append((elapsed, sum(tasks[j][0] * best[j] for j in best)))
    return out
