"""Verification after the search (``verify.verify_bests``): each task's best records rebuilt and
measured again, falling back past failures, imported times not trusted, tasks of one gateway in
one batch a round. On a scripted gateway: no build, no run."""

from __future__ import annotations

import pytest
from dbutil import ScriptedGateway

from stormdrop.records import ErrorKind, Phase
from stormdrop.storage.database import Database
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json


def _ok(secs: float):
    from stormdrop.records import MeasureResult

    return MeasureResult(run_secs=(secs, secs))


def _stored(db, traces, secs: list[float]):
    """A 128 matmul's workload in ``db`` with the first of ``traces`` stored at ``secs``: (module, kernel)."""
    from dbutil import TARGET, matmul_mod

    from stormdrop.search.space import Candidate
    from stormdrop.tuning.task import TaskSession
    from stormdrop.workloads import Kernel

    mod = matmul_mod()
    kernel = Kernel("matmul_128", "matmul_128", "matmul", mod, 2 * 128**3)
    cands = [Candidate.from_schedule(schedule_from_trace_json(mod, t), Phase.STORM) for t in traces[:len(secs)]]
    TaskSession(db, ScriptedGateway([_ok(s) for s in secs]), kernel, TARGET, 0).evaluate(cands)
    return mod, kernel


def test_verification_falls_back_re_measures_and_is_never_claimed_unchecked(tmp_path, traces):
    """The best record fails its check: the next one is used, with its re-measured latency, and the
    result says how many better records failed; the failed record is stored as failed (a timeout is
    not). Outputs not checked: never "verified"."""
    from dbutil import TARGET

    from stormdrop.measure.gateway import MeasureConfig
    from stormdrop.records import MeasureResult
    from stormdrop.tuning.task import TaskSession
    from stormdrop.tuning.verify import verify_bests

    ok = _ok
    with Database(tmp_path / "v.db") as db:
        mod, kernel = _stored(db, traces, [1e-3, 2e-3, 3e-3])
        check = ScriptedGateway([MeasureResult.failure(ErrorKind.WRONG_RESULT, "differs"), ok(2.5e-3)])
        session = TaskSession(db, check, kernel, TARGET, 0)
        verify_bests([session])
        assert session.result.verified and session.result.fallbacks == 1
        assert session.result.latency_s == pytest.approx(2.5e-3)  # re-measured, not the stored 2e-3
        records = db.records(db.find_workload(mod).workload_id)
        assert session.result.trace_json == records[1].trace_json
        # the wrong one is stored as failed: never a best again, so the next run starts from record 2
        assert records[0].result.error == ErrorKind.WRONG_RESULT and records[0].attempts == 2
        assert [r.record_id for r in db.best(records[0].workload_id, records[0].target, k=3)] == [
            records[1].record_id, records[2].record_id]
        # a timeout may not happen again: the record is tried, passed over, and kept as it was
        flaky = ScriptedGateway([MeasureResult.failure(ErrorKind.RUN_TIMEOUT, "busy"), ok(3.1e-3)])
        session = TaskSession(db, flaky, kernel, TARGET, 0)
        verify_bests([session])
        assert session.result.fallbacks == 1 and session.result.trace_json == records[2].trace_json
        assert db.records(records[1].workload_id)[1].result.ok
        unchecked = ScriptedGateway([ok(1.1e-3)])
        unchecked.config = MeasureConfig(check_correctness=False)
        session = TaskSession(db, unchecked, kernel, TARGET, 0)
        verify_bests([session])
        assert not session.result.verified and session.result.latency_s == pytest.approx(1.1e-3)


def test_the_reported_latency_is_the_median_of_the_verifications_samples(tmp_path, traces):
    """One sample stalled (another process took the core): the report is the kernel's time, not
    the stall's share of the mean."""
    from dbutil import TARGET

    from stormdrop.records import MeasureResult
    from stormdrop.tuning.task import TaskSession
    from stormdrop.tuning.verify import verify_bests

    with Database(tmp_path / "m.db") as db:
        _, kernel = _stored(db, traces, [4e-6])
        stalled = ScriptedGateway([MeasureResult(run_secs=(1e-2, 4e-6, 4.1e-6, 3.9e-6, 4e-6))])
        session = TaskSession(db, stalled, kernel, TARGET, 0)
        verify_bests([session])
        assert session.result.latency_s == pytest.approx(4e-6)


def test_a_stored_time_is_not_trusted_over_its_re_measurement(tmp_path, traces):
    """An imported best record that checks out but re-measures more than twice its stored time (a
    fake-fast row) gets the re-measured time stored and the next record is tried: the faster of
    the two re-measured wins, and the next run starts from the honest order. stormdrop's own
    records keep their stored times."""
    from dbutil import TARGET

    from stormdrop.tuning.task import TaskSession
    from stormdrop.tuning.verify import verify_bests

    ok = _ok
    with Database(tmp_path / "v.db") as db:
        mod, kernel = _stored(db, traces, [1e-4, 2e-3, 3e-3])
        own = TaskSession(db, ScriptedGateway([ok(5e-3), ok(2.1e-3)]), kernel, TARGET, 0)
        verify_bests([own])  # its own record 0 at 50x: kept as stored, used
        assert own.result.latency_s == pytest.approx(5e-3) and own.result.fallbacks == 0
        assert db.records(db.find_workload(mod).workload_id)[0].result.mean == pytest.approx(1e-4)
        with db.transaction():
            db._c().execute("UPDATE records SET versions='imported:metaschedule tvm=0.27'")
        records = db.records(db.find_workload(mod).workload_id)
        assert all(r.imported for r in records)
        session = TaskSession(db, ScriptedGateway([ok(5e-3), ok(2.1e-3)]), kernel, TARGET, 0)
        verify_bests([session])  # record 0: 50x its stored time; record 1 as stored
        assert session.result.verified and session.result.latency_s == pytest.approx(2.1e-3)
        assert session.result.trace_json == records[1].trace_json
        assert db.records(records[0].workload_id)[0].result.mean == pytest.approx(5e-3)
        assert [r.record_id for r in db.best(records[0].workload_id, records[0].target, k=3)] == [
            records[1].record_id, records[2].record_id, records[0].record_id]
        session = TaskSession(db, ScriptedGateway([ok(4.5e-3), ok(5e-3)]), kernel, TARGET, 0)
        verify_bests([session])  # record 1: 2.25x its stored 2e-3; record 2 within 2x but slower still
        assert session.result.latency_s == pytest.approx(4.5e-3) and session.result.trace_json == records[1].trace_json
        assert session.result.fallbacks == 0


def test_the_tasks_of_a_gateway_are_verified_together_each_falling_back_alone(tmp_path, traces):
    """One batch a round: both tasks' bests are built side by side; the task whose best fails
    (a wrong result) tries its next record in a second round, the other is done."""
    from dbutil import TARGET

    from stormdrop.records import MeasureResult
    from stormdrop.tuning.task import TaskSession
    from stormdrop.tuning.verify import verify_bests

    ok = _ok
    with Database(tmp_path / "a.db") as a, Database(tmp_path / "b.db") as b:
        for db in (a, b):
            _, kernel = _stored(db, traces, [1e-3, 2e-3])
        check = ScriptedGateway([MeasureResult.failure(ErrorKind.WRONG_RESULT, "differs"), ok(1.5e-3), ok(2.5e-3)])
        tasks = [TaskSession(db, check, kernel, TARGET, 0) for db in (a, b)]
        verify_bests(tasks)
        assert check.batches == [2, 1]
        assert [t.result.fallbacks for t in tasks] == [1, 0] and all(t.result.verified for t in tasks)
        assert [t.result.latency_s for t in tasks] == [pytest.approx(2.5e-3), pytest.approx(1.5e-3)]


def test_a_kernel_reports_the_fastest_of_its_best_records_timed_in_turns(tmp_path, traces):
    """``fastest_in_turns``: the verified best and the next records by stored time, timed side by side
    in order and then in reverse (one batch); the fastest median wins, with that time. A record that
    fails there is passed over; nothing is written to the database; k = 1 leaves the result as it was."""
    from dbutil import TARGET

    from stormdrop.records import MeasureResult
    from stormdrop.tuning.task import TaskSession
    from stormdrop.tuning.verify import fastest_in_turns, verify_bests

    ok = _ok
    with Database(tmp_path / "t.db") as db:
        mod, kernel = _stored(db, traces, [1e-3, 1.1e-3, 1.2e-3, 1.3e-3])
        records = db.records(db.find_workload(mod).workload_id)
        # verification, then turns over records 0, 1, 2 and back: record 1 runs fastest now
        gateway = ScriptedGateway([ok(1e-3), ok(1.5e-3), ok(1.2e-3), ok(1.4e-3), ok(1.4e-3), ok(1.2e-3), ok(1.5e-3)])
        session = TaskSession(db, gateway, kernel, TARGET, 0)
        verify_bests([session])
        fastest_in_turns(session, 3)
        assert session.result.trace_json == records[1].trace_json
        assert session.result.latency_s == pytest.approx(1.2e-3)
        # record 1 fails in the turns: the faster of the others (record 2 here)
        wrong = MeasureResult.failure(ErrorKind.WRONG_RESULT, "differs")
        gateway = ScriptedGateway([ok(1e-3), ok(1.5e-3), wrong, ok(1.3e-3), ok(1.3e-3), wrong, ok(1.5e-3)])
        session = TaskSession(db, gateway, kernel, TARGET, 0)
        verify_bests([session])
        fastest_in_turns(session, 3)
        assert session.result.trace_json == records[2].trace_json
        assert session.result.latency_s == pytest.approx(1.3e-3)
        session = TaskSession(db, ScriptedGateway([ok(1e-3)]), kernel, TARGET, 0)
        verify_bests([session])
        fastest_in_turns(session, 1)
        assert session.result.trace_json == records[0].trace_json
        assert [r.result for r in db.records(records[0].workload_id)] == [r.result for r in records]
