"""Measurement on a device registered at a TVM RPC tracker (loopback tracker + server)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from stormdrop.database import Database
from stormdrop.measure import MeasureConfig
from stormdrop.tune import tune_kernel

KEY = "stormdrop-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


@pytest.fixture(scope="module")
def tracker(tmp_path_factory):
    """A tracker and one server with key KEY, in their own process group (their popen workers too).

    If either process exits while we wait for the server to register, the fixture fails at once
    with that process's last output line (e.g. a missing module) instead of waiting a minute."""
    logs = tmp_path_factory.mktemp("rpc")
    tport, sport = _free_port(), _free_port()
    commands = {
        "tracker": ["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(tport),
                    "--port-end", str(tport + 1)],
        "server": ["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(sport),
                   "--port-end", str(sport + 1), "--tracker", f"127.0.0.1:{tport}", "--key", KEY],
    }
    procs = {}
    try:
        for name, args in commands.items():
            with open(logs / f"{name}.log", "wb") as log:
                procs[name] = subprocess.Popen([sys.executable, "-m", *args], stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        from tvm import rpc

        deadline = time.monotonic() + 60
        while True:
            for name, p in procs.items():
                if p.poll() is not None:
                    pytest.fail(f"the RPC {name} exited ({p.returncode}): "
                                f"{_last_line(logs / f'{name}.log')}")
            try:
                # connect_tracker itself retries for a minute: knock on the port first
                socket.create_connection(("127.0.0.1", tport), timeout=1).close()
                summary = rpc.connect_tracker("127.0.0.1", tport).summary()
                if any(KEY in str(s.get("key", "")) for s in summary.get("server_info", [])):
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                pytest.fail("the loopback RPC server did not register at the tracker: "
                            f"{_last_line(logs / 'server.log')}")
            time.sleep(0.5)
        yield {"host": "127.0.0.1", "port": tport, "key": KEY}
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def test_kernel_tuned_through_the_rpc_tracker_is_verified(tmp_path, tracker):
    result = tune_kernel("matmul:M=32,N=32,K=32", trials=4, exploit_trials=0, db=tmp_path / "rpc.db", seed=0,
                         measure=MeasureConfig(rpc=tracker))
    task = result.tasks[0]
    assert task.verified and task.latency_s > 0
    with Database(tmp_path / "rpc.db") as db:
        entry = db.workloads()[0]
        recs = db.records(entry.workload_id)
    assert len(recs) == 4 and sum(r.ok for r in recs) >= 3


def test_unreachable_tracker_is_one_error_line(tmp_path):
    port = _free_port()  # nothing listens there
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--kernel", "matmul:M=16,N=16,K=16",
                        "--trials", "2", "--exploit-trials", "1", "--db", str(tmp_path / "x.db"),
                        "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", KEY],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stormdrop: error:"), r.stderr


def test_a_run_longer_than_the_rpc_session_timeout_stores_no_failure(tmp_path, tracker):
    """The tracker ends a session after its timeout (4 s here); the runner renews it before then,
    so candidates measured after the first session's end are measured, not stored as failures."""
    result = tune_kernel("matmul:M=32,N=32,K=32", trials=32, exploit_trials=0, db=tmp_path / "long.db", seed=0,
                         measure=MeasureConfig(rpc={**tracker, "session_timeout": 4}))
    assert result.tasks[0].verified
    with Database(tmp_path / "long.db") as db:
        recs = db.records(db.workloads()[0].workload_id)
    span = max(r.measured_at for r in recs) - min(r.measured_at for r in recs)
    assert span > 8, f"the run ({span:.1f} s) did not outlast two sessions: nothing was tested"
    assert len(recs) == 32 and [r.result.error for r in recs if not r.ok] == []
