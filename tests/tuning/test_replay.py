"""The measurer interface (measure.measurer) and its replay implementation: real tuners (reuse,
storm, raindrop), the driver and the budget run end to end with no build and no run, from
synthetic answers or from a recorded database, on a simulated clock."""

from __future__ import annotations

import inspect
import math

import pytest

from stormdrop.measure.measurer import Measurer
from stormdrop.measure.replay import ReplayMeasurer, SimClock, recorded, synthetic
from stormdrop.records import ErrorKind, MeasureResult, Phase
from stormdrop.search.options import SearchOptions
from stormdrop.storage.database import Database
from stormdrop.target import canonical, host_target
from stormdrop.tuning.budget import Budget
from stormdrop.tuning.driver import drive, measured
from stormdrop.tuning.task import TaskSession, TaskTuner
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json
from stormdrop.workloads import parse_kernel

SPECS = ("matmul:M=32,N=48,K=64", "matmul:M=64,N=32,K=32")


def _members(cls) -> dict[str, inspect.Signature]:
    names = [n for n in vars(Measurer) if not n.startswith("_") and callable(getattr(Measurer, n))]
    return {n: inspect.signature(getattr(cls, n)) for n in names}


def test_the_gateway_and_the_replay_measurer_have_the_measurers_methods():
    from stormdrop.measure.gateway import Gateway

    protocol = _members(Measurer)
    assert set(protocol) == {"prepare", "measure", "candidate_s", "batch_s", "compile_s", "close"}
    for cls in (Gateway, ReplayMeasurer):
        assert {n: list(s.parameters) for n, s in _members(cls).items()} == \
            {n: list(s.parameters) for n, s in protocol.items()}, cls
    assert isinstance(ReplayMeasurer(synthetic()), Measurer)


def _tune(db, measurer, *, trials=8, exploit=8, budget=None, specs=SPECS, search=None):
    """Every kernel of ``specs`` tuned by one driver on ``measurer``: (sessions, why it stopped)."""
    target = host_target()
    sessions = [TaskSession(db, measurer, parse_kernel(s), target, seed=0) for s in specs]
    tuners = [TaskTuner(s, trials=trials, exploit_trials=exploit, search=search or SearchOptions(reuse=0))
              for s in sessions]
    stopped = drive(tuners, sessions, [1] * len(sessions), budget or Budget(), seed=0)
    return sessions, stopped


def test_a_tune_on_the_replay_measurer_splits_its_trials_commits_and_verifies(tmp_path):
    """Storm for its trials, then a raindrop from the best; each result committed; the best
    re-measured (verified) at the time its answer gives."""
    answer = synthetic(seed=1)
    measurer = ReplayMeasurer(answer)
    with Database(tmp_path / "r.db") as db:
        sessions, stopped = _tune(db, measurer)
        assert stopped == "every task done"
        for s in sessions:
            tally = s.tally()
            assert tally["storm"] == 8 and 1 <= tally["raindrop"] <= 8, tally
            assert s.result.trials["storm"] == 8 and s.result.trials["raindrop"] == tally["raindrop"]
            best = db.best(s.entry.workload_id, canonical(host_target()), k=1)[0]
            assert s.result.verified and s.result.trace_json == best.trace_json
            stored = {r.mean for r in s.stored()}
            assert best.mean == min(stored)  # the raindrop moved only to faster schedules than it had
        # every candidate measured is a stored record (the raindrop's re-timed incumbents and the
        # verifications are measured too, and stored nowhere)
        assert sum(len(s.stored()) for s in sessions) == sum(measured(s) for s in sessions)
        assert len(measurer.asked) > sum(measured(s) for s in sessions) + len(sessions)


def test_a_resumed_tune_on_the_same_database_measures_nothing_again(tmp_path):
    with Database(tmp_path / "r.db") as db:
        _tune(db, ReplayMeasurer(synthetic(seed=2)))
        again = ReplayMeasurer(synthetic(seed=2))
        sessions, _ = _tune(db, again)
        assert [measured(s) for s in sessions] == [0, 0]
        assert len(again.asked) == len(sessions)  # the verifications only


@pytest.mark.slow  # no build, no run, but two searches of 48 candidates a task (about 10 s)
def test_a_recorded_database_replays_the_same_search(tmp_path, monkeypatch):
    """The same seeds on the recorded results make the same search: every candidate a second run
    asks for is in the first run's records, and it ends at the same bests (one search thread:
    MetaSchedule's threads draw in no fixed order)."""
    import stormdrop.search.sketches as sketches

    monkeypatch.setattr(sketches, "physical_cores", lambda: 1)
    with Database(tmp_path / "first.db") as first:
        sessions, _ = _tune(first, ReplayMeasurer(synthetic(seed=3)), trials=24)
        bests = [s.result.latency_s for s in sessions]
        answer = recorded(first, canonical(host_target()))
        for s in sessions:  # each record answered with its own result (schedules of one module: one answer)
            for rec in s.stored():
                mod = schedule_from_trace_json(s.kernel.mod, rec.trace_json).mod
                assert answer(s.entry.shash, mod) == rec.result
    with Database(tmp_path / "second.db") as second:
        sessions, _ = _tune(second, ReplayMeasurer(answer), trials=24)
        assert all(r.ok for s in sessions for r in s.stored())  # no candidate missing from the record
        assert [s.result.latency_s for s in sessions] == pytest.approx(bests)


@pytest.mark.slow  # no build, no run, but a search until the simulated deadline (about 10 s)
def test_a_deadline_on_the_simulated_clock_reaches_every_task_and_leaves_the_finish(tmp_path):
    """Builds of 0.5 s and runs of 0.25 s on a simulated clock (a 16-candidate step: 12 s), a
    100-s deadline: the search stops with time kept for verifying every task and compiling the
    model, and every task had its first round."""
    clock = SimClock()
    measurer = ReplayMeasurer(synthetic(seed=4), build_s=0.5, run_s=0.25, clock=clock)
    specs = (*SPECS, "matmul:M=16,N=64,K=48")
    with Database(tmp_path / "d.db") as db:
        sessions, stopped = _tune(db, measurer, trials=64, exploit=64, specs=specs,
                                  budget=Budget(deadline=100.0, builds_after=len(specs), clock=clock))
    assert stopped == "the time budget"
    assert min(measured(s) for s in sessions) >= 1
    assert 100.0 - 12.0 - 3.0 <= clock() <= 100.0 - measurer.compile_s(len(specs))
    assert all(s.result.verified for s in sessions)


def test_measuring_a_workload_never_prepared_is_refused():
    from dbutil import matmul_mod

    with pytest.raises(KeyError):
        ReplayMeasurer(synthetic()).measure("nothing", [matmul_mod()])


def test_the_phases_a_search_names_are_the_only_ones_measured(tmp_path):
    with Database(tmp_path / "p.db") as db:
        sessions, _ = _tune(db, ReplayMeasurer(synthetic(seed=5)), specs=SPECS[:1],
                            search=SearchOptions(reuse=0, phases=(Phase.STORM,)))
        assert sessions[0].tally()["raindrop"] == 0 and sessions[0].tally()["storm"] == 8


@pytest.mark.parametrize("picks", [0, 1])
def test_the_priors_picks_keep_their_trials_beside_the_transfers(tmp_path, picks):
    """At a share of two trials a task with a donor: both go to transfers by default; with
    ``prior_picks=1`` one transfer and one storm sample (the prior's pick)."""
    from dataclasses import replace

    from stormdrop.search.storm import StormConfig

    measurer = ReplayMeasurer(synthetic(seed=5))
    target = host_target()
    with Database(tmp_path / "p.db") as db:
        donor, task = (TaskSession(db, measurer, parse_kernel(s), target, seed=0) for s in SPECS)
        drive([TaskTuner(donor, trials=4, exploit_trials=0)], [donor], [1], Budget(), seed=0)
        search = SearchOptions(storm=replace(StormConfig(), prior_picks=picks))
        tuner = TaskTuner(task, trials=2, exploit_trials=0, search=search)
        assert tuner.step() and tuner.model.ranks  # the x86 prior
        while tuner.step():
            pass
        tally = task.tally()
    assert (tally["reuse"], tally["storm"]) == ((2, 0) if picks == 0 else (1, 1)), tally


@pytest.mark.parametrize("builders", [1, 2])
def test_first_rounds_of_a_candidate_share_the_builders(tmp_path, builders):
    """A cap of one trial a task (first rounds of one candidate): on two builders two tasks' first
    rounds are built side by side in one batch, so the search takes half the builds' time; on one
    builder each is a batch of its own. The cap holds either way and every task is reached."""
    clock = SimClock()
    measurer = ReplayMeasurer(synthetic(seed=6), build_s=1.0, run_s=0.01, builders=builders, clock=clock)
    batches = []
    measure = measurer.measure
    measurer.measure = lambda key, mods, on_result=None: batches.append(len(mods)) or measure(key, mods, on_result)
    specs = (*SPECS, "matmul:M=16,N=64,K=48", "matmul:M=48,N=16,K=32")
    with Database(tmp_path / "g.db") as db:
        sessions, stopped = _tune(db, measurer, specs=specs, budget=Budget(trials=len(specs), clock=clock))
    assert stopped == "the trial budget"
    assert [measured(s) for s in sessions] == [1] * len(specs)
    search = batches[:-1]  # the last batch verifies every task's best
    assert search == ([2, 2] if builders == 2 else [1, 1, 1, 1]), batches
    assert all(s.result.verified for s in sessions)


def test_a_task_whose_one_first_candidate_failed_gets_new_storm_samples(tmp_path):
    """Under a cap of under four trials a task, first rounds are one candidate each
    (``budget.first_batch_size``). Where it fails, the scheduler gives the task a second round
    and its tuner new storm samples out of the raindrop's share, so that the task still gets a
    schedule (without: a naive loop nest in the model)."""
    good, seen = synthetic(seed=7), set()

    def answer(key, mod):
        if key not in seen:  # every task's first candidate fails
            seen.add(key)
            return MeasureResult.failure(ErrorKind.RUN_ERROR, "the first candidate fails")
        return good(key, mod)

    target = host_target()
    with Database(tmp_path / "d.db") as db:
        sessions = [TaskSession(db, ReplayMeasurer(answer), parse_kernel(s), target, seed=0) for s in SPECS]
        tuners = [TaskTuner(s, trials=1, exploit_trials=7, search=SearchOptions(reuse=0), first_batch=1)
                  for s in sessions]
        assert drive(tuners, sessions, [1, 1], Budget(trials=4), seed=0) == "the trial budget"
        for s in sessions:
            tally = s.tally()
            assert tally["failed"] == 1 and tally["storm"] == 2, tally
            assert math.isfinite(s.best) and s.result.verified


def test_a_task_makes_its_sketches_and_cost_model_once_and_a_storm_only_where_one_runs(tmp_path, monkeypatch):
    """Every phase of a task shares one design space and one cost model, through an extension
    (a new storm round) too; under --phases reuse,raindrop no storm is built at all, yet reuse
    transfers and the raindrop moves, ranked by the cost model, and the tuner says which measures."""
    from stormdrop.search.cost_model import CostModel
    from stormdrop.search.sketches import Sketches
    from stormdrop.search.storm import Storm

    made = {"sketches": 0, "model": 0, "storm": 0}
    for name, cls in (("sketches", Sketches), ("model", CostModel), ("storm", Storm)):
        init = cls.__init__

        def counted(self, *a, _init=init, _name=name, **kw):
            made[_name] += 1
            _init(self, *a, **kw)

        monkeypatch.setattr(cls, "__init__", counted)
    measurer = ReplayMeasurer(synthetic(seed=7))
    target = host_target()
    with Database(tmp_path / "s.db") as db:
        donor, task = (TaskSession(db, measurer, parse_kernel(s), target, seed=0) for s in SPECS)
        tuner = TaskTuner(donor, trials=8, exploit_trials=4, search=SearchOptions(reuse=0))
        while tuner.step():
            pass
        tuner.extend(4, 2)
        while tuner.step():
            pass
        assert donor.tally()["storm"] == 12 and made == {"sketches": 1, "model": 1, "storm": 2}
        ranked = []
        predict = CostModel.predict
        monkeypatch.setattr(CostModel, "predict", lambda self, c, learn=True: ranked.append(len(c)) or predict(self, c, learn))
        tuner = TaskTuner(task, trials=8, exploit_trials=4, search=SearchOptions(phases=(Phase.REUSE, Phase.RAINDROP)))
        phases = []  # what the live display shows after each batch
        while tuner.step():
            phases.append(tuner.phase)
        tally = task.tally()
    assert phases[0] is Phase.REUSE and phases[-1] is Phase.RAINDROP and Phase.STORM not in phases
    assert tally["reuse"] >= 1 and tally["storm"] == 0 and 1 <= tally["raindrop"] <= 4, tally
    assert made == {"sketches": 2, "model": 2, "storm": 2} and tuner.storm is None
    assert ranked  # the raindrop's moves ranked by the task's cost model
