"""Raindrop: Droplet Search, coordinate descent from the best schedule.

From the incumbent position, the neighbours at radius 1 along every coordinate
(both directions) are measured in batches; a neighbour replaces the incumbent
only if it is faster *and* a one-sided Welch t-test on the repeated
measurements gives p <= ``pvalue`` (one sample each: the mean decides). The
incumbent is re-measured in every batch, so a drifting machine does not fake
an improvement. When no neighbour at a radius improves, the radius widens
(speculation) up to the longest coordinate; the search stops there, or when
the budget is spent. Neighbours are tried in the order the task's cost model
ranks them, when one is given, so the likely winners are measured first. A batch
that the current radius cannot fill is topped up with the next radius's neighbours
(measured now rather than in a short batch now and another later); after a move,
neighbours generated but not measured are forgotten, so they can come back as
neighbours of the new position.

Before the first neighbours, the raindrop may try a few *register tiles*
(``DecisionSpace.register_tiles``): jumps to micro-kernel shapes of the
innermost tiles that single steps reach only through slower intermediate
positions. They are told like neighbours (the t-test decides) and count
against the budget; the cost model picks which ``register_tiles`` to measure.
With ``RaindropConfig.unroll_jumps`` (off by default), before those the incumbent
at each other unroll depth (``DecisionSpace.unroll_depths``): a transferred tile
whose accumulators went through memory at its donor's depth can hold them in
registers two depths up, where a step of one changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy import stats

from stormdrop.records import MeasureResult
from stormdrop.search.space import Candidate, DecisionSpace

log = logging.getLogger("stormdrop")


@dataclass(frozen=True)
class RaindropConfig:
    pvalue: float = 0.05
    # Small batches for small budgets: neighbours come ranked by the cost model and the
    # search moves after each batch (first improvement), so 8 (4 per builder on 2 cores)
    # gives twice the steps of AutoTVM's 16 for the same trials.
    batch_size: int = 8
    remeasure_incumbent: bool = True
    register_tiles: int = 8  # register-tile jumps measured first (0: none)
    # the incumbent at every other unroll depth measured first too, before the register tiles
    # (``DecisionSpace.unroll_depths``); off: slower on held-out networks (docs/guide.md,
    # "Register tiles")
    unroll_jumps: bool = False
    # a model's tasks under a global trial cap: batches no larger than a task's share of the cap
    # (``tuning.budget.raindrop_batch``); off: mixed on held-out networks (RESULTS, "Raindrop batches
    # of a task's share")
    batch_by_share: bool = False


def significantly_faster(candidate: tuple[float, ...], incumbent: tuple[float, ...], pvalue: float) -> bool:
    """True if ``candidate`` times are lower than ``incumbent`` ones with p <= pvalue."""
    if not candidate or not incumbent:
        return False
    mean_c = sum(candidate) / len(candidate)
    mean_i = sum(incumbent) / len(incumbent)
    if mean_c >= mean_i:
        return False
    if len(candidate) < 2 or len(incumbent) < 2:
        return True
    if len(set(candidate)) == 1 and len(set(incumbent)) == 1:
        return True  # no variance at all: the means decide
    p = stats.ttest_ind(candidate, incumbent, equal_var=False, alternative="less").pvalue
    return bool(p <= pvalue)


class Raindrop:
    """Ask/tell Droplet Search over a ``DecisionSpace``."""

    def __init__(self, space: DecisionSpace, incumbent: Candidate, incumbent_times: tuple[float, ...], *,
                 budget: int, seed: int = 0, config: RaindropConfig | None = None,
                 rank: Callable[[list[Candidate]], list[float]] | None = None,
                 register_tiles: list[tuple] = (), unroll_depths: list[tuple] = ()) -> None:
        self.space = space
        self.config = config or RaindropConfig()
        self.budget = budget
        self.rank = rank
        self.rng = random.Random(seed)
        self.incumbent = incumbent
        self.incumbent_times = tuple(incumbent_times)
        self.position = space.start
        self.history: list[float] = [MeasureResult(run_secs=self.incumbent_times).mean] if incumbent_times else []
        self.radius = 1
        self.max_radius = max(1, space.max_radius)
        self.seen: set[str] = {incumbent.key}
        self.queue: list[Candidate] = []
        self.ahead: list[Candidate] | None = None  # the next radius's neighbours, drawn on to fill a batch
        self.moves = 0
        self.done = budget <= 0
        tiles = register_tiles if self.config.register_tiles > 0 else ()
        depths = unroll_depths if self.config.unroll_jumps else ()
        if (tiles or depths) and not self.done:
            self.queue = self._candidates(list(depths)) + self._candidates(list(tiles))[:self.config.register_tiles]
            self.radius = 0 if self.queue else 1  # radius 0: the jumps; none wins -> radius 1
            log.debug("raindrop: %d jumps first (unroll depths, register tiles)", len(self.queue))

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        """The next batch of at most ``limit`` neighbours (plus the incumbent, re-measured), or None when done."""
        while not self.done and not self.queue:
            if self.radius > self.max_radius:
                self.done = True
                break
            self.queue = self._expand(self.position, self.radius)
            if not self.queue:
                self.radius += 1
        if self.done:
            return None
        n = max(1, min(self.config.batch_size, self.budget, limit or self.budget))
        batch, self.queue = self.queue[:n], self.queue[n:]
        if len(batch) < n and self.radius + 1 <= self.max_radius:
            if self.ahead is None:
                self.ahead = self._expand(self.position, self.radius + 1)
            take = n - len(batch)
            batch, self.ahead = batch + self.ahead[:take], self.ahead[take:]
        if self.config.remeasure_incumbent:
            batch = [dataclasses.replace(self.incumbent, remeasure=True), *batch]
        return batch

    def _expand(self, position: tuple, radius: int) -> list[Candidate]:
        cands = self._candidates(self.space.neighbours(position, radius))
        log.debug("raindrop: %d new neighbours at radius %d", len(cands), radius)
        return cands

    def _candidates(self, positions: list[tuple]) -> list[Candidate]:
        """The unseen candidates at ``positions``, best-ranked first (shuffled without a cost model)."""
        cands = []
        for pos in positions:
            cand = self.space.apply(pos)
            if cand is None or cand.key in self.seen:
                continue
            self.seen.add(cand.key)
            cands.append(cand)
        self.rng.shuffle(cands)
        if self.rank is not None and cands:
            scores = self.rank(cands)
            order = sorted(range(len(cands)), key=lambda i: -scores[i])
            cands = [cands[i] for i in order]
        return cands

    def tell(self, candidates: list[Candidate], results: list[MeasureResult],
             fresh: Sequence[bool] | None = None) -> None:
        """Results of the last batch; moves to the best significantly faster neighbour. The budget
        pays for the ``fresh`` ones (measured for this batch; default: all), not for stored ones."""
        baseline = self.incumbent_times
        for c, r in zip(candidates, results):
            if c.remeasure and r.ok:
                baseline = tuple(r.run_secs)
        self.incumbent_times = baseline
        best: tuple[float, Candidate, MeasureResult] | None = None
        for j, (c, r) in enumerate(zip(candidates, results)):
            if c.remeasure:
                continue
            self.budget -= 1 if fresh is None or fresh[j] else 0
            if r.ok and significantly_faster(r.run_secs, baseline, self.config.pvalue):
                if best is None or r.mean < best[0]:
                    best = (r.mean, c, r)
        if best is not None:
            _, cand, result = best
            log.debug("raindrop: move to %.3f us (radius %d)", result.mean * 1e6, self.radius)
            self.incumbent, self.incumbent_times = cand, tuple(result.run_secs)
            self.position = self.space.rebase(cand)  # its own (TVM-repaired) trace is the new base
            self.radius = 1
            # unmeasured neighbours of the old position may be neighbours of the new one
            self.seen -= {c.key for c in (*self.queue, *(self.ahead or ()))}
            self.queue, self.ahead = [], None
            self.moves += 1
            self.history.append(result.mean)
        elif not self.queue:
            self.radius += 1
            self.queue, self.ahead = self.ahead or [], None
        if self.budget <= 0:
            self.done = True
