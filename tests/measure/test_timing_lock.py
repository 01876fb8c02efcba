"""One timing at a time on a machine: the lock file every stormdrop process takes around a timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from stormdrop.storage.database import Database

HOLDER = textwrap.dedent("""
    import json, sys, time
    from stormdrop.measure.timing_lock import timing
    spans = []
    for _ in range(5):
        with timing():
            with timing():  # re-entrant within a process
                t0 = time.time(); time.sleep(0.1); spans.append((t0, time.time()))
    print(json.dumps(spans))
""")


def test_two_processes_never_time_at_the_same_moment(tmp_path, monkeypatch):
    monkeypatch.setenv("STORMDROP_TIMING_LOCK", str(tmp_path / "t.lock"))
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    spans = sorted(s for p in procs for s in json.loads(p.communicate(timeout=120)[0]))
    assert len(spans) == 10
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two timings overlapped"


@pytest.mark.slow
def test_a_tuner_waits_for_another_processs_timing(tmp_path, monkeypatch):
    """While another process holds the timing lock, a tune builds but does not time: its first
    record is committed only after the lock is released."""
    lock = tmp_path / "t.lock"
    monkeypatch.setenv("STORMDROP_TIMING_LOCK", str(lock))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from stormdrop.measure.timing_lock import timing
        with timing():
            print("held", flush=True); time.sleep(25)
        print(time.time(), flush=True)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    db = tmp_path / "w.db"
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--kernel", "matmul:M=32,N=32,K=32",
                        "--trials", "2", "--exploit-trials", "0", "--db", str(db), "--no-progress"],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    released = float(holder.communicate(timeout=60)[0].strip())
    assert r.returncode == 0, r.stderr
    with Database(db) as d:
        first = min(rec.measured_at for w in d.workloads() for rec in d.records(w.workload_id))
    assert first >= released - 0.05, f"a candidate was timed {released - first:.1f} s before the lock was free"
    assert time.time() >= released


def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path, monkeypatch):
    import pytest

    from stormdrop.errors import MeasureError
    from stormdrop.measure.timing_lock import timing

    victim = tmp_path / "victim"
    victim.write_text("mine")
    victim.chmod(0o600)
    link = tmp_path / "t.lock"
    link.symlink_to(victim)
    monkeypatch.setenv("STORMDROP_TIMING_LOCK", str(link))
    with pytest.raises(MeasureError, match="symbolic link") as info:
        with timing():
            pass
    assert "\n" not in str(info.value)
    assert victim.read_text() == "mine" and (victim.stat().st_mode & 0o777) == 0o600
