"""A tuner's workers: isolated from the working directory, gone when their tuner is, and quiet
on Ctrl-C; the tuner stops on Ctrl-C and SIGTERM with one line."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dbutil import SPEC, stored_rows

SCRIPT = Path(sys.executable).with_name("stormdrop")  # the console script: no working directory on sys.path
pytestmark = [pytest.mark.slow,  # spawns processes
              pytest.mark.skipif(not SCRIPT.exists() or not sys.platform.startswith("linux"),
                                 reason="the stormdrop console script and /proc")]


def _workers(parent: int) -> list[int]:
    """The pids of ``parent``'s worker processes."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == parent and b"stormdrop.measure._worker" in cmdline:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rows_so_far(db: Path) -> list:
    """The records a running tune has committed; none while its database or schema is not there yet."""
    try:
        return stored_rows(db) if db.exists() else []
    except (sqlite3.Error, IndexError):
        return []


def _start(tmp_path: Path, cwd: Path | None = None) -> tuple[subprocess.Popen, list[int]]:
    """A long kernel tune, once its workers have measured something."""
    db = tmp_path / "t.db"
    proc = subprocess.Popen([str(SCRIPT), "tune", "--kernel", SPEC, "--trials", "2000", "--time-budget", "300",
                             "--db", str(db), "--no-progress"], cwd=cwd or tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-600:]
        if len(_rows_so_far(db)) >= 2 and len(_workers(proc.pid)) >= 2:
            return proc, _workers(proc.pid)
        time.sleep(0.5)
    proc.kill()
    raise AssertionError("the tune measured nothing in 240 s")


def test_workers_do_not_import_from_the_working_directory(tmp_path: Path) -> None:
    """A ``tvm.py`` in the directory the user runs from is not imported by any process."""
    (tmp_path / "tvm.py").write_text("raise SystemExit('the working directory was imported')\n")
    r = subprocess.run([str(SCRIPT), "tune", "--kernel", SPEC, "--trials", "4", "--exploit-trials", "0",
                        "--db", str(tmp_path / "t.db"), "--no-progress"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-600:]


def test_workers_exit_when_their_tuner_is_killed(tmp_path: Path) -> None:
    proc, workers = _start(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + 15
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [w for w in workers if _alive(w)]


@pytest.mark.alone
@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_stop_the_tune_with_one_line_and_keep_its_records(tmp_path: Path, sig, code,
                                                                              word) -> None:
    proc, workers = _start(tmp_path)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # as a terminal does: the whole foreground group, workers included
    else:
        proc.send_signal(sig)
    # a signal waits for the call into TVM in progress (a build, the evolution's ranking) to return:
    # seconds alone, longer on a loaded machine
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:  # seen rarely: where it is stuck (every thread's stack), then stop it
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        raise AssertionError(f"no exit 180 s after the signal; its threads:\n{proc.communicate()[1][-6000:]}") from None
    assert proc.returncode == code, err[-600:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and word in err, err[-600:]
    assert len(stored_rows(tmp_path / "t.db")) >= 2
    deadline = time.monotonic() + 15
    while any(_alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [w for w in workers if _alive(w)]


def test_sigusr1_prints_where_a_tune_is_and_the_tune_goes_on(tmp_path: Path) -> None:
    """`kill -USR1` on a running tune writes every thread's Python stack to stderr; the tune is not
    stopped by it (a stuck run can be located before it is stopped)."""
    proc, _ = _start(tmp_path)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-600:]
    assert "most recent call first" in err and "stormdrop" in err, err[-600:]
