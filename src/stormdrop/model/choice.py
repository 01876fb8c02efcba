"""The schedule each task deploys with: chosen among its best records by their time inside the model.

A kernel is tuned alone, run after run on warm caches; inside the compiled model its weights
and inputs come from further away, so records a few percent apart alone can be further apart,
or swap places, in the model (figures: README "In-model choice", RESULTS.md).

So after tuning, the model is compiled once per rank: the i-th time with every task's i-th
candidate (0: the best record as tuned and verified, then the next-best records). Every
kernel call is timed in place (``model.run.task_times``), the builds taking turns over
``rounds`` rounds in alternating order after a warm-up round that is not counted (a build's
first timings run slow: with the builds in a fixed order and no warm-up, the last rank won
most tasks), and each task keeps the candidate whose fastest round
was fastest in place. The model so
chosen is deployed only if it also runs faster as a whole than the rank-0 model, both timed in
turns: noise in the per-kernel times can cost nothing but the compiles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm.target import Target

from stormdrop.model.run import interleaved, model_timer, task_times

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Deployable:
    """One task's schedule that may be deployed: a stored record's trace and its time as tuned."""

    trace_json: str
    latency_s: float
    candidate_key: str


@dataclass
class Choice:
    """What ``choose`` decided: the candidate index of every task (all 0: the best records as
    tuned), the compiled model, and both models' latencies as timed in turns."""

    picks: list[int]
    executable: Any
    best_s: float | None = None  # the model with every task's rank-0 candidate
    chosen_s: float | None = None  # the model with the in-place choice (None: nothing to choose)

    @property
    def changed(self) -> int:
        return sum(p != 0 for p in self.picks)


def choose(names: Sequence[str], ranked: Sequence[Sequence[Deployable]], build: Callable[[list[int]], Any],
           inputs: dict[str, np.ndarray], target: Target, *, rounds: int = 2, runs: int = 10) -> Choice:
    """Pick, per task, the candidate whose kernel runs fastest inside the compiled model.

    ``names``: each task's kernel (function) name; ``ranked``: its candidates, rank 0 first;
    ``build(picks)``: the model compiled with candidate ``picks[i]`` of task ``i``.
    """
    depth = max((len(r) for r in ranked), default=0)
    base = build([0] * len(ranked))
    if depth < 2:
        return Choice([0] * len(ranked), base)
    variants = [base] + [build([min(rank, len(r) - 1) for r in ranked]) for rank in range(1, depth)]
    samples: list[list[list[float]]] = [[[] for _ in range(depth)] for _ in ranked]
    for rnd in range(rounds + 1):  # round 0 warms every build up and is not counted
        order = list(enumerate(variants))
        for rank, ex in order if rnd % 2 else order[::-1]:
            times = task_times(ex, inputs, target, runs if rnd else 2)
            for i, (name, cands) in enumerate(zip(names, ranked)):
                if rnd and rank < len(cands) and name in times:
                    samples[i][rank].append(times[name])
    picks = []
    for per_rank in samples:
        fastest = {rank: min(v) for rank, v in enumerate(per_rank) if v}
        picks.append(min(fastest, key=fastest.get) if fastest else 0)
    if not any(picks):
        return Choice(picks, base)
    chosen = build(picks)
    latency = interleaved({"best": model_timer(base, inputs, target), "chosen": model_timer(chosen, inputs, target)},
                          rounds=3)
    if latency["chosen"] < latency["best"]:
        return Choice(picks, chosen, latency["best"], latency["chosen"])
    log.info("in-model choice: %d task(s) would change, but the model ran slower (%.3f vs %.3f ms): "
             "keeping the best records", sum(p != 0 for p in picks), latency["chosen"] * 1e3, latency["best"] * 1e3)
    return Choice([0] * len(ranked), base, latency["best"], latency["chosen"])
