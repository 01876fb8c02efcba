"""A killed tune loses nothing: SIGKILL mid-storm and mid-raindrop, a kill in the middle of a batch."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
from dbutil import SPEC
from dbutil import stored_rows as _rows
from dbutil import stormdrop_cli as _stormdrop

from stormdrop.search.storm import Storm
from stormdrop.storage.database import Database
from stormdrop.workloads import parse_kernel


@pytest.mark.slow
def test_kill_9_loses_nothing_and_the_rerun_measures_nothing_twice(tmp_path):
    db, out = tmp_path / "k.db", tmp_path / "k.json"
    args = ["-m", "stormdrop", "tune", "--kernel", SPEC, "--trials", "24", "--exploit-trials", "0",
            "--batch-size", "4", "--db", str(db), "--no-progress"]
    proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if db.exists() and len(_safe_rows(db)) >= 8:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _rows(db)
    assert 8 <= len(before) < 24, "the kill came too late to test anything"
    result = _stormdrop("tune", "--kernel", SPEC, "--trials", "24", "--exploit-trials", "0", "--batch-size", "4",
                        "--db", str(db), "--json", str(out), "--no-progress")
    assert result.returncode == 0, result.stderr
    after = _rows(db)
    assert after[: len(before)] == before, "records committed before the kill changed"
    new = json.loads(out.read_text())["tasks"][0]["trials"]
    assert new["storm"] == len(after) - len(before) <= 24 - len(before)
    with Database(db) as d:
        (entry,) = d.workloads()
        keys = [r.candidate_key for r in d.records(entry.workload_id)]
    assert len(keys) == len(set(keys)), "a schedule was measured twice"


@pytest.mark.slow
def test_a_kernel_killed_in_its_raindrop_resumes_it_and_measures_nothing_twice(tmp_path):
    """SIGKILL once the raindrop has committed a few neighbours: the re-run keeps every record, runs
    no storm again (its 8 trials are stored), goes on with the raindrop within its budget, and no
    schedule is measured twice."""
    db = tmp_path / "r.db"
    args = ["tune", "--kernel", SPEC, "--trials", "8", "--exploit-trials", "12", "--batch-size", "4",
            "--db", str(db), "--no-progress"]
    _kill_once(args, db, "raindrop", 2)
    before = _rows(db)
    phases = [p for _, p in _phases(db)]
    assert phases.count("storm") == 8 and 2 <= phases.count("raindrop") < 12, phases
    after, trials = _rerun(args, db, tmp_path / "r.json", before)
    assert trials["storm"] == 0 and trials["raindrop"] == len(after) - len(before)
    phases = [p for _, p in _phases(db)]
    assert phases.count("storm") == 8 and phases.count("raindrop") <= 12
    keys = [k for k, _ in _phases(db)]
    assert len(keys) == len(set(keys)), "a schedule was measured twice"


def _donor_db(path, shapes):
    """A database of matmuls of ``shapes``, one (fake-timed) design-space sample each: reuse donors."""
    from stormdrop.records import MeasureResult, Phase, Record
    from stormdrop.search.sketches import make_context
    from stormdrop.search.space import Candidate
    from stormdrop.target import canonical, host_target

    with Database(path) as db:
        for shape in shapes:
            k = parse_kernel(f"matmul:{shape}")
            entry = db.commit_workload(k.mod, name=k.name, op_class=k.op_class, flops=k.flops)
            cand = Candidate.from_schedule(make_context(k.mod, host_target(), seed=0).generate_design_space()[0],
                                           Phase.STORM)
            db.commit_record(Record(entry.workload_id, canonical(host_target()), cand.key, cand.trace_json, "[]",
                                    MeasureResult(run_secs=(1e-4,) * 3), Phase.STORM, 0.0))
    return path


@pytest.mark.slow
def test_a_kernel_killed_in_its_reuse_phase_resumes_it_and_measures_nothing_twice(tmp_path):
    """SIGKILL once two of the transfers (from eight donors) are committed: the re-run keeps every
    record, measures the transfers left (not those stored), then the storm, and ends with what an
    uninterrupted run stores; no schedule is measured twice."""
    donors = _donor_db(tmp_path / "donors.db", [f"M={m},N={n},K=64" for m, n in
                                                ((32, 32), (48, 48), (96, 96), (128, 64), (64, 32), (32, 96),
                                                 (96, 48), (128, 128))])
    db = tmp_path / "u.db"
    args = ["tune", "--kernel", SPEC, "--trials", "12", "--exploit-trials", "0", "--batch-size", "4",
            "--reuse", "8", "--reuse-from", str(donors), "--no-progress"]
    assert _stormdrop(*args, "--db", str(tmp_path / "ref.db")).returncode == 0
    ref = [p for _, p in _phases(tmp_path / "ref.db")]
    assert ref.count("reuse") >= 4 and len(ref) == 12, ref
    args += ["--db", str(db)]
    _kill_once(args, db, "reuse", 2)
    before = _rows(db)
    phases = [p for _, p in _phases(db)]
    assert 2 <= phases.count("reuse") < ref.count("reuse") and "storm" not in phases, phases
    after, trials = _rerun(args, db, tmp_path / "u.json", before)
    phases = [p for _, p in _phases(db)]
    assert sorted(phases) == sorted(ref)  # as many transfers and storm candidates as uninterrupted
    assert trials["reuse"] == ref.count("reuse") - len(before) and trials["storm"] == ref.count("storm")
    keys = [k for k, _ in _phases(db)]
    assert len(keys) == len(set(keys)), "a schedule was measured twice"


def _rerun(args, db, out, before):
    """The killed command run again to the end: it succeeds and leaves every record committed before
    the kill as it was; returns the records after it and its --json trial counts."""
    result = _stormdrop(*args, "--json", str(out))
    assert result.returncode == 0, result.stderr
    after = _rows(db)
    assert after[: len(before)] == before, "records committed before the kill changed"
    return after, json.loads(out.read_text())["tasks"][0]["trials"]


def _kill_once(args, db, phase: str, n: int) -> None:
    """Start ``stormdrop *args`` and SIGKILL it (its process group) once ``db`` holds ``n`` records of ``phase``."""
    proc = subprocess.Popen([sys.executable, "-m", "stormdrop", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if sum(r[-1] == phase for r in _phases(db)) >= n:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _phases(db):
    """(candidate key, phase) of every stored record, in order."""
    try:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT candidate_key, phase FROM records ORDER BY record_id").fetchall()
    except sqlite3.Error:
        return []


class _KilledGateway:
    """A gateway whose process dies (KeyboardInterrupt stands in for the kill) after it has
    timed ``survive`` candidates of a batch; the results it had are real ones."""

    def __init__(self, survive: int) -> None:
        self.survive = survive

    def prepare(self, key, workload, seed=0):
        pass

    def measure(self, key, mods, on_result=None):
        from stormdrop.records import MeasureResult

        for i in range(self.survive):
            if on_result is not None:
                on_result(i, MeasureResult(run_secs=(1e-3 * (i + 1),) * 3))
        raise KeyboardInterrupt


def test_a_kill_mid_batch_keeps_every_result_measured_before_it(tmp_path):
    """Results are committed as they arrive, not once the batch is done: a kill after 3 of a
    batch of 8 leaves those 3 in the database (it used to leave none of the 8)."""
    from stormdrop.target import host_target
    from stormdrop.tuning.task import TaskSession

    kernel = parse_kernel(SPEC)
    storm = Storm(kernel.mod, host_target(), trials=8, seed=0)
    cands = storm.propose()
    storm.close()
    assert len(cands) == 8
    with Database(tmp_path / "m.db") as db:
        task = TaskSession(db, _KilledGateway(survive=3), kernel, host_target(), seed=0)
        with pytest.raises(KeyboardInterrupt):
            task.evaluate(cands)
    with Database(tmp_path / "m.db") as db:
        (entry,) = db.workloads()
        stored = db.records(entry.workload_id)
    assert sorted(r.candidate_key for r in stored) == sorted(c.key for c in cands[:3])
    assert [r.mean for r in sorted(stored, key=lambda r: r.mean)] == pytest.approx([1e-3, 2e-3, 3e-3])


def _safe_rows(db):
    try:
        return _rows(db)
    except (sqlite3.Error, IndexError):
        return []
