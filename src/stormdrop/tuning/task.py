"""One task's tuning: reuse, storm, then raindrop; every result committed as measured.

The loop asks a phase for candidates, looks each one up in the database (a
schedule already measured is never measured again, which is also how a killed
run resumes), measures the rest through the measurer (``measure.measurer``: the
gateway, or a replay), commits each record, and tells the phase. Then the best record is re-built from its stored trace and
checked against the reference (``verify``): only a verified kernel is reported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from tvm.target import Target

from stormdrop import stop
from stormdrop.measure.measurer import Measurer
from stormdrop.records import MeasureResult, Phase, Record
from stormdrop.report.history import Trial
from stormdrop.search.cost_model import CostModel
from stormdrop.search.options import SearchOptions
from stormdrop.search.phases import SearchPhase
from stormdrop.search.raindrop import Raindrop
from stormdrop.search.sketches import Sketches
from stormdrop.search.space import Candidate, DecisionSpace
from stormdrop.search.storm import Storm
from stormdrop.storage.database import Database, WorkloadEntry
from stormdrop.target import canonical, vector_lanes
from stormdrop.tuning.evaluation import Evaluation, evaluate_together
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json
from stormdrop.workloads import Kernel

log = logging.getLogger("stormdrop")


@dataclass
class TaskResult:
    """Outcome of tuning one task (kernel) on one target."""

    name: str
    workload: str
    flops: int
    latency_s: float | None
    verified: bool
    tuning_s: float
    trials: dict[str, int] = field(default_factory=lambda: {"reuse": 0, "storm": 0, "raindrop": 0, "failed": 0})
    trace_json: str | None = None
    history: list[Trial] = field(default_factory=list)  # this run's measured trials, in order
    weight: int = 1  # occurrences in a model
    fallbacks: int = 0  # better records that failed verification (0: the best record itself was verified)
    stored: dict[str, int] = field(default_factory=dict)  # the database's records of the task, this run's included

    @property
    def gflops(self) -> float | None:
        return self.flops / self.latency_s / 1e9 if self.latency_s else None

    def to_json(self) -> dict:
        return {"name": self.name, "workload": self.workload, "flops": int(self.flops),
                "latency_s": self.latency_s, "verified": self.verified, "fallbacks": self.fallbacks,
                "tuning_s": round(self.tuning_s, 3),
                "trials": dict(self.trials), "stored": dict(self.stored),
                "history": [t.to_json() for t in self.history]}


class TaskSession:
    """One workload on one target: the database, the measurer and the counters."""

    def __init__(self, db: Database, measurer: Measurer, kernel: Kernel, target: Target, seed: int,
                 progress: object = None) -> None:
        self.db, self.measurer, self.kernel, self.target = db, measurer, kernel, target
        self.target_key = canonical(target)
        self.entry: WorkloadEntry = db.commit_workload(kernel.mod, name=kernel.name, op_class=kernel.op_class,
                                                       flops=kernel.flops)
        self.seed = seed
        self.progress = progress
        self.result = TaskResult(kernel.name, self.entry.shash, kernel.flops, None, False, 0.0)
        self.best = min((r.mean for r in db.records(self.entry.workload_id, self.target_key) if r.ok),
                        default=float("inf"))
        self.started = time.monotonic()
        self.fresh: list[bool] = []  # which candidates of the last ``evaluate`` it measured
        measurer.prepare(self.entry.shash, kernel.mod, seed)

    def stored(self, phase: Phase | None = None) -> list[Record]:
        recs = self.db.records(self.entry.workload_id, self.target_key)
        return [r for r in recs if phase is None or r.phase == phase]

    def tally(self) -> dict[str, int]:
        """The task's stored records (every run's): measured per phase, imported, failed."""
        recs = self.stored()
        out = {p.value: sum(r.phase == p and not r.imported for r in recs) for p in Phase}
        out["imported"] = sum(r.imported for r in recs)
        out["failed"] = sum(not r.ok for r in recs)
        return out

    def spent(self, phase: Phase | None = None) -> int:
        """Trials earlier runs spent on this task (in ``phase``): the budget ledger. Records imported
        from MetaSchedule were measured by another tuner and spend nothing here."""
        return sum(not r.imported for r in self.stored(phase))

    def evaluate(self, cands: list[Candidate]) -> list[MeasureResult]:
        """Results for candidates: from the database when stored, else measured and committed.
        ``fresh`` says afterwards which of them this call measured: the budget ledger charges a
        phase for those only (a stored result, e.g. of a run that was killed, costs nothing again)."""
        return evaluate_together([self], [cands])[0]

    def begin(self, cands: list[Candidate]) -> Evaluation:
        """The first half of ``evaluate``: stored results looked up, the rest claimed; the
        ``Evaluation``'s ``mods`` are what is left to measure, its ``commit`` takes each result."""
        return Evaluation(self, cands)

    def _measured_elsewhere(self, cand: Candidate) -> tuple[MeasureResult, bool]:
        """The result another tuner is measuring: its record once committed, or, if its claim
        lapses without one (that tuner died), measured here (then True)."""
        wid, tgt = self.entry.workload_id, self.target_key
        while True:
            rec = self.db.lookup(wid, tgt, cand.key)
            if rec is not None and not rec.retry_due:
                return rec.result, False
            if not self.db.claimed(wid, tgt, cand.key):
                result = self.evaluate([cand])[0]
                return result, self.fresh[0]
            time.sleep(0.2)

    def status(self, phase: Phase) -> str:
        failed = self.result.trials["failed"]
        tail = f" {failed} failed" if failed else ""
        if self.best == float("inf"):
            return phase.value + tail
        return f"{phase.value} best {self.best * 1e6:.1f} us {self.kernel.flops / self.best / 1e9:.1f} GFLOPS{tail}"

    def candidate_of(self, record: Record, phase: Phase) -> Candidate:
        sch = schedule_from_trace_json(self.kernel.mod, record.trace_json)
        return Candidate.from_schedule(sch, phase)


class Retry:
    """The stored candidates whose failure may not recur (``Record.retry_due``), proposed once to
    be measured again before anything new (a phase whose results go to no one)."""

    def __init__(self, task: TaskSession) -> None:
        self.task, self.done = task, False

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        if self.done:
            return None
        self.done = True
        cands = []
        for rec in self.task.stored():
            if rec.retry_due and (limit is None or len(cands) < limit):
                try:
                    cands.append(self.task.candidate_of(rec, rec.phase))
                except Exception as err:  # noqa: BLE001 - a stored trace that no longer replays stays as it is
                    log.debug("cannot retry stored record %s: %s", rec.record_id, err)
        if not cands:
            return None
        log.info("%s: measuring %d earlier run timeouts/crashes once more", self.task.kernel.name, len(cands))
        return cands

    def tell(self, candidates: list[Candidate], results: list[MeasureResult],
             fresh: Sequence[bool] | None = None) -> None:
        pass


class TaskTuner:
    """One task's phases in order: earlier failures retried (``Retry``), reuse
    (``search.reuse_phase.Reuse``), the storm, then the raindrop from the best schedule.

    Each phase is a ``search.phases.SearchPhase``; one design space (``search.sketches``) and one
    cost model (``search.cost_model``) serve them all, made once for the task, and a storm is
    built only where one runs. ``step()`` measures one batch of the current
    phase (propose, evaluate, tell), starting the next phase where one is over, so that a
    scheduler can interleave tasks; a kernel tune simply steps one tuner until it is done. A phase
    is started only when it is reached: the raindrop starts from the best schedule stored then.
    """

    def __init__(self, task: TaskSession, *, trials: int, exploit_trials: int, search: SearchOptions | None = None,
                 first_batch: int | None = None, lead_batch: int | None = None,
                 donor_dbs: Sequence[Database] = ()) -> None:
        search = search or SearchOptions()
        self.phases = search.phases  # which phases run (always in the order reuse, storm, raindrop)
        self.task = task
        self.trials = trials if Phase.STORM in self.phases else 0
        self.exploit_trials = exploit_trials if Phase.RAINDROP in self.phases else 0
        self.first_batch = first_batch  # size of the task's first storm batch (default: the storm's batch)
        self.reuse_donors = search.reuse if Phase.REUSE in self.phases else 0  # at most this many same-class donors
        # the first storm batch instead where no donor gave the task a schedule (a lead: later tasks
        # of related classes will take its schedule, ``budget.lead_batch``); ``leading`` once it is one
        self.lead_batch = lead_batch if self.reuse_donors > 0 else None
        self.leading = False
        self.donor_dbs = tuple(donor_dbs)  # more databases to draw donors from (read only)
        # a raindrop without a storm starts from a transfer; where no donor gave one, this many
        # storm samples (the prior's pick of a random pool, where there is a prior) stand in
        self.stand_in = max(1, search.reuse) if Phase.RAINDROP in self.phases and Phase.STORM not in self.phases else 0
        self.storm_config = search.storm
        self.raindrop_config = search.raindrop
        self.sketches: Sketches | None = None  # the task's design space, made once (``_sketches``)
        self.model: CostModel | None = None  # the task's cost model, built once (``_cost_model``)
        self.storm: Storm | None = None
        self.drop: Raindrop | None = None
        self.current: SearchPhase | None = None  # the phase measuring now
        self._phase = Phase.STORM  # which one it is (``phase``)
        # the phases to start, in order, each with the Phase it measures (earlier failures' retry: none of its own)
        self.next: list[tuple[Phase | None, Callable[[], SearchPhase | None]]] = [
            (None, self._retry), (Phase.REUSE, self._reuse), *self._storm_then_raindrop()]
        self.done = False
        self.rounds = 0  # batches measured by reuse, storm and raindrop
        self.extensions = 0  # more budget after it was done (extend)
        self.second_chance = True  # new storm samples once if nothing valid was found (``_raindrop``)

    @property
    def phase(self) -> Phase:
        """The phase measuring now, or the last one started (the storm before any, and while
        earlier failures are retried)."""
        return self._phase

    def step(self, limit: int | None = None) -> bool:
        """Measure one batch of at most ``limit`` new candidates; False (and ``done``) once every phase is over."""
        cands = self.propose(limit)
        if cands is None:
            return False
        self.tell(cands, self.task.evaluate(cands))
        return True

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        """The current phase's next batch of at most ``limit`` candidates, starting the next phase
        where one is over; None (and ``done``) once every phase is over. ``tell`` takes its results."""
        if self.done:
            return None
        with stop.deferred():  # TVM calls the cost model and schedule rules back in C++ here: see stormdrop.stop
            while True:
                if self.current is None:
                    if not self.next:
                        self.finish()
                        return None
                    phase, start = self.next.pop(0)
                    self.current = start()  # None: a phase with nothing to do
                    if self.current is not None and phase is not None:
                        self._phase = phase
                    continue
                cands = self.current.propose(self._limit(limit))
                if cands is not None:
                    return cands
                self.current = None

    def tell(self, cands: list[Candidate], results: list[MeasureResult]) -> None:
        """The results of the batch ``propose`` gave, in its order (the session's ``fresh`` says
        which were measured for it)."""
        with stop.deferred():
            self.current.tell(cands, results, self.task.fresh)
        if not isinstance(self.current, Retry):
            self.rounds += 1

    def _limit(self, limit: int | None) -> int | None:
        """A batch's cap: ``limit``, and the first storm batch's size when the storm measures first."""
        first = (self.lead_batch if self.leading else self.first_batch) \
            if self.rounds == 0 and self.current is self.storm else None
        caps = [c for c in (limit, first) if c]
        return min(caps) if caps else None

    def finish(self) -> None:
        if not self.done and self.drop is not None and self.drop.moves:
            log.info("%s raindrop: %d moves -> %.1f us", self.task.kernel.name, self.drop.moves,
                     self.drop.history[-1] * 1e6)
        if self.storm is not None:
            self.storm.close()
        self.current, self.next = None, []
        self.done = True

    def extend(self, storm_trials: int, exploit_trials: int) -> None:
        """More budget for a finished task: another storm round (its cost model trained on
        everything measured so far), then a raindrop from the best schedule then."""
        if not self.done:
            self.finish()
        self.extensions += 1
        self.trials += storm_trials if Phase.STORM in self.phases else 0
        self.exploit_trials += exploit_trials if Phase.RAINDROP in self.phases else 0
        if Phase.RAINDROP in self.phases and Phase.STORM not in self.phases:
            # no storm to widen the search (a raindrop again from the same best mostly converges at
            # once): a few storm samples, then the raindrop from the best of everything
            self.stand_in = max(1, self.reuse_donors)
        self.storm = self.drop = None
        self.next = self._storm_then_raindrop()
        self._phase = Phase.STORM
        self.done = False

    def _storm_then_raindrop(self) -> list[tuple[Phase, Callable[[], SearchPhase | None]]]:
        """The last two phases to start: a tune's, and again after an extension or a second chance."""
        return [(Phase.STORM, self._storm), (Phase.RAINDROP, self._raindrop)]

    def _retry(self) -> Retry:
        return Retry(self.task)

    def _reuse(self) -> SearchPhase | None:
        """The storm, where one runs (its population and budget take the transfers), then reuse,
        ranked by the task's cost model: out of the storm's budget when there is a storm, else a
        budget of its own."""
        from stormdrop.search.reuse_phase import Reuse

        storm_runs = Phase.STORM in self.phases
        if storm_runs:
            self.storm = self._start_storm()
        if self.reuse_donors <= 0:
            return None
        room = self.storm.remaining if storm_runs else self.reuse_donors
        if storm_runs and self._cost_model().ranks:  # the prior's picks keep their trials
            room = max(min(room, 1), room - self.storm_config.prior_picks)
        task = self.task
        return Reuse(task.db, task.entry, task.target_key, self._sketches(), self._cost_model(),
                     storm=self.storm if storm_runs else None, budget=min(self.reuse_donors, room),
                     donors=self.donor_dbs, config=self.storm_config)

    def _storm(self) -> Storm | None:
        """The storm, where one runs; stand-in samples are drawn here where nothing valid is stored
        to start the raindrop from (a raindrop without a storm that reuse left nothing, a shrunk
        first round whose candidates all failed: ``_raindrop``) and after an extension."""
        if self.stand_in:
            trials, self.stand_in = self.stand_in, 0
            if self.extensions or not self.task.db.best(self.task.entry.workload_id, self.task.target_key, k=1):
                log.info("%s: %s: %d storm samples", self.task.kernel.name,
                         "extended" if self.extensions else "no valid schedule to start the raindrop from", trials)
                if self.storm is not None:
                    self.storm.close()
                self.storm = self._start_storm(trials)
                return self.storm
        if Phase.STORM not in self.phases:
            return None
        if self.storm is None:
            self.storm = self._start_storm()
        if self.lead_batch and self.rounds == 0 and self.trials < self.lead_batch and not self.task.stored():
            # reuse gave nothing and nothing is stored: a lead, whose first batch is a larger storm's
            self.leading, self.trials = True, self.lead_batch
            self.storm.close()
            self.storm = self._start_storm()
        return self.storm

    def _raindrop(self) -> Raindrop | None:
        self.drop = self._start_raindrop()
        if self.drop is None and self.second_chance and self.first_batch and Phase.STORM in self.phases \
                and self.exploit_trials > 0 \
                and not self.task.db.best(self.task.entry.workload_id, self.task.target_key, k=1):
            # every candidate of a shrunk first round failed: new storm samples once (``_storm``'s
            # stand-in), out of the raindrop's share (a task with no schedule runs as a naive loop nest)
            self.second_chance = False
            self.stand_in = self.first_batch
            self.exploit_trials -= self.first_batch
            self.next = self._storm_then_raindrop()
        return self.drop

    def _start_storm(self, trials: int | None = None) -> Storm:
        """The task's storm, told the stored measurements, with ``trials`` (default: what is left of
        the storm's budget after the storm's and reuse's stored trials)."""
        history = []
        for rec in self.task.stored():
            try:
                history.append((self.task.candidate_of(rec, rec.phase), rec.result))
            except Exception as err:  # noqa: BLE001 - a stored trace that no longer replays is skipped
                log.debug("skipping stored record %s: %s", rec.record_id, err)
        remaining = max(0, self.trials - self.task.spent(Phase.STORM) - self.task.spent(Phase.REUSE)) \
            if trials is None else trials
        return Storm(self.task.kernel.mod, self.task.target, trials=remaining, seed=self.task.seed,
                     config=self.storm_config, history=history, sketches=self._sketches(), model=self._cost_model())

    def _sketches(self) -> Sketches:
        """The task's design space, made at first use."""
        if self.sketches is None:
            self.sketches = Sketches(self.task.kernel.mod, self.task.target, self.task.seed,
                                     row_vectors=self.storm_config.row_vectors)
        return self.sketches

    def _cost_model(self) -> CostModel:
        """The task's cost model, built at first use and kept through every phase and extension
        (a restarted storm tells it only what it was not told before)."""
        if self.model is None:
            self.model = CostModel(self._sketches().context, self.storm_config)
        return self.model

    def _start_raindrop(self) -> Raindrop | None:
        task = self.task
        budget = max(0, self.exploit_trials - task.spent(Phase.RAINDROP))
        best = task.db.best(task.entry.workload_id, task.target_key, k=1)
        if not best or budget <= 0:
            return None
        incumbent = task.candidate_of(best[0], Phase.RAINDROP)
        space = DecisionSpace(task.kernel.mod, self._sketches().postprocs, incumbent.sch.trace,
                              num_cores=int(task.target.attrs.get("num-cores", 1)))
        lanes = vector_lanes(task.target)
        first = bool(lanes) and not task.stored(Phase.RAINDROP)  # jumps: on CPUs, from a task's first incumbent
        cfg = self.raindrop_config
        jumps = space.register_tiles(space.start, lanes) if first and cfg.register_tiles > 0 else []
        depths = [p for _, p in space.unroll_depths(space.start)] if first and cfg.unroll_jumps else []
        # without a storm the model knows the prior and a few transfers: it ranks as the prior does,
        # and retraining on those few (seconds a task) is left out
        model = self._cost_model()
        rank = model.predict if Phase.STORM in self.phases else partial(model.predict, learn=False)
        return Raindrop(space, incumbent, best[0].result.run_secs, budget=budget, seed=task.seed,
                        config=self.raindrop_config, rank=rank, register_tiles=jumps, unroll_depths=depths)
