# ruff: noqa: F811 - the imported fixture is a test parameter
"""--phases and --reuse-from: transfer only, transfer then raindrop, extensions without a storm, bad input."""

from __future__ import annotations

import pytest
from test_reuse import _digest, donor_db  # noqa: F401 - the fixture, shared

from stormdrop.records import Phase
from stormdrop.search.options import SearchOptions
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions
from stormdrop.workloads import parse_kernel

pytestmark = pytest.mark.slow  # builds, runs or spawns processes


def test_phases_reuse_only_and_donors_from_another_database_left_unchanged(tmp_path, donor_db):
    """--phases reuse is transfer only (no storm, no raindrop); --reuse-from draws donors from another
    database, read only: its file is byte for byte the same afterwards."""
    import json
    import subprocess
    import sys

    before = _digest(donor_db)
    js = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--kernel", "matmul:M=48,N=80,K=64",
                        "--phases", "reuse", "--reuse-from", str(donor_db), "--db", str(tmp_path / "new.db"),
                        "--json", str(js), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    task = json.loads(js.read_text())["tasks"][0]
    # two donors, each transferred and moved into the sketches: up to the 8 of --reuse's default
    assert 2 <= task["trials"]["reuse"] <= 8 and task["trials"]["storm"] == 0 and task["trials"]["raindrop"] == 0
    assert task["verified"]
    assert f" {task['trials']['reuse']}+0+0 " in r.stdout  # the table counts the transfers (reuse+storm+drop)
    assert _digest(donor_db) == before
    with Database(tmp_path / "new.db") as d:
        assert {r.phase for w in d.workloads() for r in d.records(w.workload_id)} == {Phase.REUSE}


def test_reuse_then_raindrop_without_a_storm(tmp_path, donor_db, monkeypatch):
    """Transfers then Droplet Search; the raindrop ranks neighbours with the cost model as it
    stands (the prior), never retrained on the few transfers (seconds a task with a prior)."""
    from tvm.s_tir.meta_schedule.cost_model import XGBModel

    trained, update = [], XGBModel.update
    monkeypatch.setattr(XGBModel, "update", lambda self, *a: (trained.append(1), update(self, *a))[1])
    task = tune_kernel("matmul:M=48,N=80,K=64",
                       KernelOptions(trials=8, exploit_trials=6, seed=0,
                                     search=SearchOptions(phases=(Phase.REUSE, Phase.RAINDROP), reuse_from=[donor_db])),
                       db=tmp_path / "rr.db").tasks[0]
    assert task.trials["storm"] == 0 and 2 <= task.trials["reuse"] <= 8 and 1 <= task.trials["raindrop"] <= 6
    assert task.verified
    assert trained == []


def test_reuse_then_raindrop_where_no_donor_exists_starts_from_storm_samples(tmp_path):
    """No donor of the task's class: instead of leaving the task untuned (naive loops in a model:
    a max-pool with no donor in a ResNet), --reuse's count of storm samples gives the raindrop its
    start, counted as storm trials; a task a transfer reached gets none (the test above)."""
    task = tune_kernel("matmul:M=48,N=80,K=64",
                       KernelOptions(trials=8, exploit_trials=4, seed=0,
                                     search=SearchOptions(phases=(Phase.REUSE, Phase.RAINDROP), reuse=3)),
                       db=tmp_path / "none.db").tasks[0]
    assert task.trials["reuse"] == 0 and task.trials["storm"] == 3 and 1 <= task.trials["raindrop"] <= 4
    assert task.verified and task.latency_s > 0


def test_an_extension_without_a_storm_phase_starts_with_storm_samples(tmp_path, donor_db):
    """Under --phases reuse,raindrop a task given more time (``extend``: a time budget with time left)
    first measures --reuse's count of storm samples, then a raindrop from the best of everything: a
    raindrop again from the same best mostly converged at once, so the extension measured nothing."""
    from stormdrop.measure.gateway import Gateway, MeasureConfig
    from stormdrop.tuning.task import TaskSession, TaskTuner

    with Database(tmp_path / "ext.db") as db, Database(donor_db) as donors, \
            Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1)) as gw:
        session = TaskSession(db, gw, parse_kernel("matmul:M=48,N=80,K=64"), host_target(), seed=0)
        tuner = TaskTuner(session, trials=8, exploit_trials=4,
                          search=SearchOptions(reuse=3, phases=(Phase.REUSE, Phase.RAINDROP)), donor_dbs=[donors])
        while tuner.step():
            pass
        first = dict(session.result.trials)
        assert first["storm"] == 0 and first["reuse"] >= 1  # a transfer started the raindrop
        tuner.extend(16, 16)
        tuner.step()
        assert session.result.trials["storm"] == 3 and session.result.trials["raindrop"] == first["raindrop"]


@pytest.mark.parametrize("args, needle", [
    (["--phases", "raindrop,storm"], "--phases: a comma list of reuse, storm, raindrop in that order"),
    (["--phases", "drizzle"], "--phases"),
    (["--reuse-from", "{tmp}/none.db"], "--reuse-from: no database at"),
])
def test_bad_phases_or_donor_database_is_one_error_line(tmp_path, args, needle):
    import subprocess
    import sys

    args = [a.format(tmp=tmp_path) for a in args]
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--kernel", "matmul:M=48,N=80,K=64", *args,
                        "--db", str(tmp_path / "x.db"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "x.db").exists()
