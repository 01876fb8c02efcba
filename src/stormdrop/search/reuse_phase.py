"""The reuse phase as a search phase (``search.phases.SearchPhase``): the transfers that
``search.reuse`` makes from same-class donor workloads into the task's sketches, proposed once,
before the storm; the task's cost model ranks and vets them. Told their results, it hands them
to the storm, whose population starts from them and whose budget pays for them (without a storm:
to the cost model). It reads donors' records and measures and stores nothing."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import partial

from stormdrop.records import MeasureResult
from stormdrop.search.cost_model import CostModel
from stormdrop.search.sketches import Sketches
from stormdrop.search.space import Candidate
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.storage.database import Database, WorkloadEntry
from stormdrop.target import vector_lanes

log = logging.getLogger("stormdrop")

SPILL_SPARE = 3  # StormConfig.spill_veto: transfers made beyond the budget, to stand in for spilling ones
REGISTER_TILES = 4  # and the register-blocked variants of a spilling one tried (each compiled once)


class Reuse:
    """At most ``budget`` transfers to ``entry`` from the same-class workloads of ``db`` and
    ``donors`` on ``target_key``, chosen as ``config`` says (the donors' order, a pool ranked by
    the task's cost ``model`` when it has a prior, moves into the task's ``sketches``); proposed
    once. ``storm``: the task's storm, if one runs, which takes the transfers (``tell``) and whose
    own picks vet them (``_vetted``)."""

    def __init__(self, db: Database, entry: WorkloadEntry, target_key: str, sketches: Sketches, model: CostModel, *,
                 storm: Storm | None = None, budget: int, donors: Sequence[Database] = (),
                 config: StormConfig | None = None) -> None:
        self.db, self.entry, self.target_key = db, entry, target_key
        self.sketches, self.model, self.storm = sketches, model, storm
        self.budget, self.donors = budget, tuple(donors)
        self.config = config or StormConfig()
        self.done = False
        self._spill_counts: dict[str, int | None] = {}  # candidate key -> its kernel's vector spills

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        """The chosen transfers (at most ``limit``), or None: proposed already, no budget, or no
        donor whose schedules transfer."""
        from stormdrop.search.reuse import chosen_transfers, fastest_transfers, transfers

        if self.done:
            return None
        self.done = True
        budget = min(self.budget, limit or self.budget)
        if budget <= 0:
            return None
        cfg, sketches = self.config, self.sketches
        pool = max(1, cfg.transfer_pool) if self.model.ranks else 1
        in_sketches = cfg.transfer_sketches
        ranked = cfg.transfer_ranked if self.model.ranks and in_sketches and pool == 1 else 0
        exact: set[str] = set()
        lanes = (vector_lanes(sketches.target) or 0) if cfg.whole_vectors else 0

        def made(spare: int) -> list[list[Candidate]]:  # the transfers, ``spare`` more than the budget
            return transfers(self.db, self.entry, self.target_key, sketches.postprocs,
                             limit=max(budget * pool, ranked) + spare, others=self.donors,
                             per_donor=2 if pool > 1 else 1,
                             order=cfg.donor_order, spaces=sketches.spaces() if in_sketches else (),
                             enough=max(budget, ranked) + spare if in_sketches and pool == 1 else 0,
                             sketch_donors=cfg.sketch_donors, exact=exact, exact_sources=not cfg.hub_transfers,
                             fastest_of=cfg.fastest_donors, exact_too=cfg.fastest_exact,
                             lanes=lanes)

        groups = made(0)
        if not groups:
            return None
        if ranked:
            return self._vetted(fastest_transfers(groups, budget, partial(self.model.predict, learn=False), exact), exact)
        rank = partial(self.model.predict, learn=False) if pool > 1 else None
        picks = chosen_transfers(groups, budget, rank, whole=in_sketches)
        vetoed = cfg.vector_veto and self._unvectorized(picks, exact)
        if vetoed or (cfg.spill_veto > 0 and self._spilling(picks, exact)):  # SPILL_SPARE more to stand in
            pool = chosen_transfers(made(SPILL_SPARE), budget + SPILL_SPARE, rank, whole=in_sketches)
            if cfg.vector_veto:
                pool = self._vectorized_first(pool, exact)
            picks = self._unspilled(pool, budget, exact) if cfg.spill_veto > 0 else pool[:budget]
        if vetoed:
            picks = [self._with_vectors(c, exact) for c in picks]
        if cfg.unroll_spills > 0:
            picks = [c if c.key in exact else self._unroll_fitted(c) for c in picks]
        return self._vetted(picks, exact)

    def _unroll_fitted(self, candidate: Candidate) -> Candidate:
        """``candidate``, or where its kernel spills more than ``StormConfig.unroll_spills`` vector
        registers more than at another unroll depth, the deepest depth that spills at most that much
        more than the least: a refitted tile's accumulators can go through memory at the donor's
        depth and stay in registers at another one (docs/guide.md, "Reuse")."""
        own, margin = self._spills(candidate), self.config.unroll_spills
        if own is None or own <= margin:
            return candidate
        space = self._space(candidate)
        depths = [(0, candidate)]  # (depth relative to the transfer's, candidate)
        for change, position in space.unroll_depths(space.start):
            other = space.apply(position, phase=candidate.phase)
            if other is not None and self._spills(other) is not None:
                depths.append((change, other))
        least = min(self._spills(c) for _, c in depths)
        if own <= least + margin:
            return candidate
        deepest = max((d for d in depths if self._spills(d[1]) <= least + margin), key=lambda d: d[0])[1]
        log.debug("reuse: a transfer to %s spills %d at its depth, %d at another: %d taken", self.entry.name, own,
                  least, self._spills(deepest))
        return deepest

    def _space(self, candidate: Candidate):
        """The decision space around ``candidate`` (its trace's decisions the start), to step its
        unroll depths and register tiles in."""
        from stormdrop.search.space import DecisionSpace
        from stormdrop.target import num_cores

        return DecisionSpace(self.sketches.mod, self.sketches.postprocs, candidate.sch.trace,
                             num_cores(self.sketches.target))

    def _spills(self, candidate: Candidate) -> int | None:
        """``search.spills.vector_spills`` of a candidate, compiled once a task."""
        from stormdrop.search.spills import vector_spills

        if candidate.key not in self._spill_counts:
            self._spill_counts[candidate.key] = vector_spills(candidate.mod, self.sketches.target)
        return self._spill_counts[candidate.key]

    def _unvectorized(self, picks: list[Candidate], exact: set[str]) -> bool:
        """Whether, on an LLVM CPU target, a pick that is not this very workload's schedule runs a
        reduction in no vector loop along its output (``search.vectors``)."""
        from stormdrop.search.vectors import unvectorized

        if self.sketches.target.kind.name != "llvm":
            return False
        return any(c.key not in exact and unvectorized(c.mod) for c in picks)

    def _vectorized_first(self, pool: list[Candidate], exact: set[str]) -> list[Candidate]:
        """``pool`` with the transfers whose reductions all run as vectors (and this very workload's
        schedules) first, each part in its order."""
        from stormdrop.search.vectors import unvectorized

        scalar = {c.key for c in pool if c.key not in exact and unvectorized(c.mod)}
        if scalar and len(scalar) < len(pool):
            log.debug("reuse: %d of %d transfers to %s run a reduction without vectors and give way", len(scalar),
                      len(pool), self.entry.name)
        return [c for c in pool if c.key not in scalar] + [c for c in pool if c.key in scalar]

    def _with_vectors(self, candidate: Candidate, exact: set[str]) -> Candidate:
        """``candidate``, or where a reduction of it runs without vectors (``search.vectors``), the
        first of its register-blocked micro-kernel shapes (``DecisionSpace.register_tiles``, whole
        vectors on the output's last axis, its parallel factors kept as far as they divide) whose
        reductions all run as vectors; ``candidate`` where none does. This very workload's
        schedules (``exact``) are kept as they are."""
        from stormdrop.search.vectors import unvectorized

        lanes = vector_lanes(self.sketches.target) or 0
        if candidate.key in exact or not lanes or not unvectorized(candidate.mod):
            return candidate
        space = self._space(candidate)
        for position in space.register_tiles(space.start, lanes, nearest_parallel=True):
            other = space.apply(position, phase=candidate.phase)
            if other is not None and not unvectorized(other.mod):
                log.debug("reuse: a transfer to %s runs a reduction without vectors: its tiles %s taken",
                          self.entry.name, position)
                return other
        return candidate

    def _spilling(self, picks: list[Candidate], exact: set[str]) -> bool:
        """Whether a pick that is not this very workload's schedule spills more than the veto."""
        return any(c.key not in exact and (self._spills(c) or 0) > self.config.spill_veto for c in picks)

    def _unspilled(self, pool: list[Candidate], budget: int, exact: set[str]) -> list[Candidate]:
        """``budget`` of the transfers ``pool`` (in its order), passing over each whose kernel spills more
        than ``StormConfig.spill_veto`` vector registers (``search.spills``) while others are left;
        where too few are, the least spilling ones fill up, each unrolled less (``_unrolled_less``).
        This very workload's schedules (``exact``) are kept as they are."""
        kept: list[Candidate] = []
        spilled: list[tuple[int, int, Candidate]] = []
        for i, c in enumerate(pool):
            if len(kept) == budget:
                break
            n = None if c.key in exact else self._spills(c)
            if n is None or n <= self.config.spill_veto:
                kept.append(c)
            else:
                spilled.append((n, i, c))
        if spilled:
            log.debug("reuse: %d transfers to %s spill (%s vector stack moves) and give way", len(spilled),
                      self.entry.name, "/".join(str(n) for n, _, _ in spilled))
        for n, _, c in sorted(spilled)[:budget - len(kept)]:  # too few left: the least spilling, unrolled less
            kept.append(self._unrolled_less(c, n))
        return kept

    def _unrolled_less(self, candidate: Candidate, spills: int) -> Candidate:
        """``candidate`` with its unroll depths (the categorical decisions) stepped down one at a time,
        then with its innermost tiles made a register-blocked micro-kernel (``DecisionSpace.register_tiles``,
        the first ``REGISTER_TILES``), until its kernel spills no more than ``StormConfig.spill_veto``:
        the one of those that spills least (``candidate`` itself where none spills less)."""
        from stormdrop.target import vector_lanes

        space = self._space(candidate)
        start, lanes = space.start, vector_lanes(self.sketches.target) or 0
        less_unrolled = [position for change, position in space.unroll_depths(start) if change < 0]
        tiles = space.register_tiles(start, lanes)[:REGISTER_TILES] if lanes else []
        best = (spills, candidate)
        for position in less_unrolled + tiles:
            other = space.apply(position, phase=candidate.phase)
            n = self._spills(other) if other is not None else None
            if n is not None and n < best[0]:
                best = (n, other)
                if n <= self.config.spill_veto:
                    break
        return best[1]

    def _vetted(self, picks: list[Candidate], exact: set[str] = frozenset()) -> list[Candidate]:
        """The transfers, where a storm runs and the cost model's prior ranks
        (``StormConfig.transfer_vetting``), with each one it scores below that share of one of its
        own picks among random samples (``Storm.rivals``) replaced by that pick: a sibling tuned as
        briefly can hand on a schedule many times slower than a random one. Schedules of this very
        workload (``exact``: the hub's, another database's) are never replaced."""
        share, storm = self.config.transfer_vetting, self.storm
        if storm is None or share <= 0 or not self.model.ranks or not picks or all(c.key in exact for c in picks):
            return picks
        rivals = storm.rivals(sum(c.key not in exact for c in picks))
        scores = self.model.predict(picks + rivals, learn=False)

        def merit(i: int) -> float:  # a pick must score above a transfer's score / share
            if i < len(picks):
                return math.inf if picks[i].key in exact else scores[i]
            return share * scores[i]

        ranked = sorted(range(len(scores)), key=merit, reverse=True)
        chosen = sorted(ranked[:len(picks)])  # the transfers first, in their order
        if any(i >= len(picks) for i in chosen):
            log.debug("reuse: %d of %d transfers to %s give way to the prior's picks (scored %s against %s)",
                      sum(i >= len(picks) for i in chosen), len(picks), self.entry.name,
                      "/".join(f"{s:.2f}" for s in scores[:len(picks)]), "/".join(f"{s:.2f}" for s in scores[len(picks):]))
        return [(picks + rivals)[i] for i in chosen]

    def tell(self, candidates: list[Candidate], results: list[MeasureResult],
             fresh: Sequence[bool] | None = None) -> None:
        """The transfers' results: to the storm (``Storm.absorb``), else to the cost model."""
        if self.storm is not None:
            self.storm.absorb(candidates, results, fresh)
        else:
            self.model.tell(candidates, results)
