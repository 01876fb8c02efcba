"""The reuse phase as a search phase (``search.phases.SearchPhase``): the transfers that
``search.reuse`` makes from same-class donor workloads, proposed once, before the storm; told
their results, it hands them to the storm, whose cost model learns them, whose population
starts from them and whose budget pays for them. It reads donors' records and measures and
stores nothing."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from stormdrop.records import MeasureResult
from stormdrop.search.space import Candidate
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.storage.database import Database, WorkloadEntry


class Reuse:
    """At most ``budget`` transfers to ``entry`` from the same-class workloads of ``db`` and
    ``donors`` on ``target_key``, chosen as ``config`` says (the donors' order, a pool ranked by
    ``storm``'s cost model when it has a prior, moves into the sketches); proposed once."""

    def __init__(self, db: Database, entry: WorkloadEntry, target_key: str, storm: Storm, *, budget: int,
                 donors: Sequence[Database] = (), config: StormConfig | None = None) -> None:
        self.db, self.entry, self.target_key, self.storm = db, entry, target_key, storm
        self.budget, self.donors = budget, tuple(donors)
        self.config = config or StormConfig()
        self.done = False

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        """The chosen transfers (at most ``limit``), or None: proposed already, no budget, or no
        donor whose schedules transfer."""
        from stormdrop.search.reuse import chosen_transfers, transfers

        if self.done:
            return None
        self.done = True
        budget = min(self.budget, limit or self.budget)
        if budget <= 0:
            return None
        cfg, storm = self.config, self.storm
        pool = max(1, cfg.transfer_pool) if storm.ranks else 1
        sketches = cfg.transfer_sketches
        groups = transfers(self.db, self.entry, self.target_key, storm.ctx.space_generator.postprocs,
                           limit=budget * pool, others=self.donors, per_donor=2 if pool > 1 else 1,
                           order=cfg.donor_order, spaces=storm.design_spaces() if sketches else (),
                           enough=budget if sketches and pool == 1 else 0, sketch_donors=cfg.sketch_donors)
        if not groups:
            return None
        rank = partial(storm.predict, learn=False) if pool > 1 else None
        return chosen_transfers(groups, budget, rank, whole=sketches)

    def tell(self, candidates: list[Candidate], results: list[MeasureResult],
             fresh: Sequence[bool] | None = None) -> None:
        """The transfers' results: to the storm (``Storm.absorb``)."""
        self.storm.absorb(candidates, results, fresh)
