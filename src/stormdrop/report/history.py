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


def time_to_beat(curve: Sequence[tuple[float, float]], final_s: float | None, peer_s: float | None) -> float | None:
    """The tuning time (s, from ``curve``'s clock, at least 0) at which the model's estimate
    (``model_estimate``), scaled so that its last point is ``final_s`` (the compiled model as
    measured: the estimate leaves out the untuned operators), first fell below ``peer_s`` (another
    runtime's latency); None when it never did (the tuned model is not faster) or nothing is known."""
    if not curve or not final_s or not peer_s or curve[-1][1] <= 0:
        return None
    scale = final_s / curve[-1][1]
    return next((max(0.0, t) for t, est in curve if est * scale < peer_s), None)


PEERS = ("onnxruntime", "openvino")  # the runtimes a model's time to fast is read against


def run_estimate(db, tasks: Sequence[tuple[int, int]], target_key: str, start: float,
                 until: float = math.inf) -> list[tuple[float, float]]:
    """The estimate curve (``model_estimate``) of one model run: ``tasks`` as (workload id,
    weight), their records on ``target_key`` (from ``db``, a ``storage.store.RecordSource``)
    measured up to ``until`` (epoch s; a later run of another model sharing a workload is not
    this run's), on a clock from ``start`` (epoch s)."""
    return model_estimate([(w, trials_of([r for r in db.records(wid, target_key) if r.measured_at <= until], start))
                           for wid, w in tasks])


def faster_after(curve: Sequence[tuple[float, float]], latency_s: dict) -> dict[str, float | None]:
    """Time to fast against each peer runtime in ``latency_s`` (a model's measured latencies, its
    own under ``tuned``): ``time_to_beat`` for each of ``PEERS`` timed."""
    return {peer: time_to_beat(curve, latency_s.get("tuned"), latency_s[peer]) for peer in PEERS
            if latency_s.get(peer)}
