"""Measurement on a device registered at a TVM RPC tracker (loopback tracker + server)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from stormdrop.measure.gateway import MeasureConfig
from stormdrop.measure.tracker import RpcConfig
from stormdrop.model.options import ModelOptions
from stormdrop.storage.database import Database
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions

pytestmark = pytest.mark.slow  # builds, runs or spawns processes

KEY = "stormdrop-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_line(path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def _wait_free(rpc: RpcConfig, n: int, timeout: float = 60) -> None:
    from tvm import rpc as tvm_rpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = tvm_rpc.connect_tracker(rpc.host, rpc.port).summary()["queue_info"]
        if queue.get(rpc.key, {}).get("free", 0) >= n:
            return
        time.sleep(0.5)
    pytest.fail(f"{n} devices under {rpc.key} did not become free")


def _cluster(logs, key: str, servers: int):
    """A tracker and ``servers`` servers with ``key``, in their own process groups (their popen workers
    too); yields the tracker's address, the servers' log files and processes, and every process by
    name (``tracker``, ``server0``, ...: a test may replace one; all are killed at the end).

    If a process exits while we wait for the servers to register, this fails at once with that
    process's last output line (e.g. a missing module) instead of waiting a minute."""
    tport = _free_port()
    commands = {"tracker": ["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(tport),
                            "--port-end", str(tport + 1)]}
    for i in range(servers):
        sport = _free_port()
        commands[f"server{i}"] = ["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(sport),
                                  "--port-end", str(sport + 1), "--tracker", f"127.0.0.1:{tport}", "--key", key]
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
                if summary.get("queue_info", {}).get(key, {}).get("free", 0) >= servers:
                    break
            except Exception:  # noqa: BLE001 - not up yet
                pass
            if time.monotonic() > deadline:
                pytest.fail("the loopback RPC servers did not register at the tracker: "
                            f"{_last_line(logs / 'server0.log')}")
            time.sleep(0.5)
        yield (RpcConfig("127.0.0.1", tport, key), [logs / f"server{i}.log" for i in range(servers)],
               [procs[f"server{i}"] for i in range(servers)], procs)
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """A tracker and one server with key KEY, and the server's log file."""
    for rpc, logs, *_ in _cluster(tmp_path_factory.mktemp("rpc"), KEY, 1):
        yield rpc, logs


@pytest.fixture(scope="module")
def tracker(one_device):
    return one_device[0]


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """A tracker and two servers with one key, and the servers' log files."""
    for rpc, logs, *_ in _cluster(tmp_path_factory.mktemp("rpc2"), KEY + "-2", 2):
        yield rpc, logs


def test_kernel_tuned_through_the_rpc_tracker_is_verified(tmp_path, tracker):
    result = tune_kernel("matmul:M=32,N=32,K=32",
                         KernelOptions(trials=4, exploit_trials=0, seed=0, measure=MeasureConfig(rpc=tracker)),
                         db=tmp_path / "rpc.db")
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
    """The tracker ends a session after its timeout (3 s here); the runner renews it before then,
    so candidates measured after the first session's end are measured, not stored as failures."""
    result = tune_kernel("matmul:M=32,N=32,K=32",
                         KernelOptions(trials=40, exploit_trials=0, seed=0,
                                       measure=MeasureConfig(rpc=dataclasses.replace(tracker, session_timeout_s=3))),
                         db=tmp_path / "long.db")
    assert result.tasks[0].verified
    with Database(tmp_path / "long.db") as db:
        recs = db.records(db.workloads()[0].workload_id)
    span = max(r.measured_at for r in recs) - min(r.measured_at for r in recs)
    assert span > 6, f"the run ({span:.1f} s) did not outlast two sessions: nothing was tested"
    assert len(recs) == 40 and [r.result.error for r in recs if not r.ok] == []


def test_every_free_device_under_the_key_measures(tmp_path, two_devices):
    """Two servers under one key: the gateway starts a runner per free device and both time
    candidates (each server's log shows the modules it loaded); all results are committed."""
    rpc, logs = two_devices
    from stormdrop.measure.gateway import Gateway
    from stormdrop.target import host_target

    with Gateway(host_target(), MeasureConfig(rpc=rpc)) as g:
        assert len(g._runners) == 2
    with Gateway(host_target(), MeasureConfig(rpc=rpc, rpc_devices=1)) as g:
        assert len(g._runners) == 1  # --rpc-devices caps it
    _wait_free(rpc, 2)  # the gateways' sessions are over: both devices back at the tracker
    result = tune_kernel("matmul:M=32,N=32,K=32",
                         KernelOptions(trials=16, exploit_trials=0, seed=0, measure=MeasureConfig(rpc=rpc)),
                         db=tmp_path / "two.db")
    assert result.tasks[0].verified
    with Database(tmp_path / "two.db") as db:
        recs = db.records(db.workloads()[0].workload_id)
    assert len(recs) == 16 and all(r.ok for r in recs)
    loads = [log.read_text(errors="replace").count("load_module") for log in logs]
    assert all(n > 0 for n in loads), f"modules loaded per server: {loads}"


def test_a_model_tuned_through_the_tracker_is_timed_on_the_device(tmp_path, one_device):
    """`tune --model` with an RPC device times the compiled model there (and the untuned build):
    the server loads the model's library; ONNX Runtime still runs here."""
    from test_model import tiny_net

    from stormdrop.model.tune import tune_model

    rpc, (log,) = one_device
    result = tune_model(tiny_net(str(tmp_path / "tiny.onnx")),
                        ModelOptions(trials=6, trials_per_task=2, seed=0, measure=MeasureConfig(rpc=rpc),
                                     untuned=True),
                        db=tmp_path / "m.db")
    assert result.latency_s["tuned"] > 0 and result.latency_s["untuned"] > 0
    assert result.max_abs_error < 1e-3
    import re

    assert len(re.findall(r"load_module \S*model_", log.read_text(errors="replace"))) >= 2  # untuned, tuned


def test_a_models_remote_timings_outlive_the_rpc_session(tmp_path, one_device):
    """A benchmark times a model on the device in rounds; the tracker ends sessions after 3 s here:
    a sample after that opens a new session (the model uploaded again), and a session that died
    early is replaced once after the failed request."""
    import re

    import tvm
    from test_model import tiny_net

    from stormdrop.model import run as model_run
    from stormdrop.target import host_target
    from stormdrop.workloads.models import load_model

    rpc, (log,) = one_device
    rpc = dataclasses.replace(rpc, session_timeout_s=3)
    model = load_model(tiny_net(str(tmp_path / "tiny.onnx")))
    target = host_target()
    ex = tvm.compile(model.mod, target=target)
    inputs = model_run.random_inputs(model, 0)
    loads = len(re.findall(r"load_module \S*model_", log.read_text(errors="replace")))
    sample = model_run.model_timer(ex, inputs, target, rpc)
    assert sample() > 0
    time.sleep(3.5)  # the tracker's session is over
    assert sample() > 0
    key = (rpc.host, rpc.port, rpc.key)
    time.sleep(3.5)
    session, _ = model_run._SESSIONS[key]
    model_run._SESSIONS[key] = (session, time.monotonic())  # looks fresh, is over: its request fails
    outs, latency = model_run.run_model(ex, inputs, target, rpc=rpc)
    assert latency > 0 and outs[0].shape == (1, 10)
    assert len(re.findall(r"load_module \S*model_", log.read_text(errors="replace"))) - loads >= 3
    model_run._SESSIONS.pop(key)


def test_a_model_timer_renewing_a_live_session_lets_go_of_the_old_one(tmp_path):
    """One device, 600-s sessions: when the process's session is due for renewal while a timer still
    has the model loaded on it, the timer lets go first, so the old session closes and the new
    request is granted at once (holding it, the request would wait out the old session's 600 s)."""
    import threading

    import tvm
    from test_model import tiny_net

    from stormdrop.model import run as model_run
    from stormdrop.target import host_target
    from stormdrop.workloads.models import load_model

    model = load_model(tiny_net(str(tmp_path / "tiny.onnx")))
    target = host_target()
    ex = tvm.compile(model.mod, target=target)
    inputs = model_run.random_inputs(model, 0)
    for rpc, _, _, _ in _cluster(tmp_path, KEY + "-renew", 1):
        rpc = dataclasses.replace(rpc, session_timeout_s=600)
        key = model_run._key(rpc)
        sample = model_run.model_timer(ex, inputs, target, rpc)
        assert sample() > 0
        model_run._SESSIONS[key] = (model_run._SESSIONS[key][0], time.monotonic() - 590)  # due, still alive
        result = []
        t = threading.Thread(target=lambda s=sample, r=result: r.append(s()), daemon=True)
        t.start()
        t.join(timeout=60)
        assert result and result[0] > 0, "the renewed session's request waited for the old session"
        assert model_run._SESSIONS[key][1] > time.monotonic() - 60  # a new session
        model_run._SESSIONS.pop(key)


def test_a_server_killed_mid_run_leaves_its_candidates_to_the_other(tmp_path):
    """Two devices; one server is killed once a few records are committed: its candidate in flight
    goes to the other device, the run finishes verified and stores no failure."""
    import threading

    def count():
        try:
            with Database(tmp_path / "k.db") as db:
                return sum(len(db.records(w.workload_id)) for w in db.workloads())
        except Exception:  # noqa: BLE001 - not created yet
            return 0

    for rpc, _, procs, _ in _cluster(tmp_path, KEY + "-kill", 2):
        def killer(victim):
            deadline = time.monotonic() + 300
            while count() < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            os.killpg(victim.pid, signal.SIGKILL)

        t = threading.Thread(target=killer, args=(procs[1],), daemon=True)
        t.start()
        # (the lost device's runner tries for a new session for retry_s: 10 s here, 120 by default)
        result = tune_kernel("matmul:M=32,N=32,K=32",
                             KernelOptions(trials=24, exploit_trials=0, seed=0,
                                           measure=MeasureConfig(rpc=dataclasses.replace(rpc, retry_s=10))),
                             db=tmp_path / "k.db")
        t.join(timeout=5)
        assert procs[1].poll() is not None, "the server was not killed during the run"
        assert result.tasks[0].verified
        with Database(tmp_path / "k.db") as db:
            recs = db.records(db.workloads()[0].workload_id)
        assert len(recs) == 24 and [r.result.error for r in recs if not r.ok] == []


def _records(path):
    """The records of the one workload in ``path`` (none while it does not exist yet)."""
    try:
        with Database(path) as db:
            return [r for w in db.workloads() for r in db.records(w.workload_id)]
    except Exception:  # noqa: BLE001 - not created yet
        return []


def _kill_tracker_after(path, procs, n: int, logs=None, down_s: float = 0.0):
    """A thread that kills the tracker once ``n`` records are committed (and, with ``logs``, starts a
    new one on the same port after ``down_s`` seconds); returns it and the records seen at the kill."""
    import threading

    seen = []

    def run():
        deadline = time.monotonic() + 300
        while len(_records(path)) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(procs["tracker"].pid, signal.SIGKILL)
        procs["tracker"].wait(timeout=10)
        seen.extend(_records(path))
        if logs is not None:
            time.sleep(down_s)
            with open(logs / "tracker2.log", "wb") as log:
                procs["tracker"] = subprocess.Popen([sys.executable, *procs["tracker"].args[1:]], stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, seen


def test_a_tracker_restarted_mid_run_costs_a_wait_not_a_record(tmp_path):
    """The tracker is killed once a few records are committed and started again 3 s later on its
    port; the session expires meanwhile (3-s sessions): the runner waits for the tracker, the
    server registers again, and the run finishes with every record measured and no failure."""
    for rpc, _, _, procs in _cluster(tmp_path, KEY + "-restart", 1):
        t, seen = _kill_tracker_after(tmp_path / "t.db", procs, 4, logs=tmp_path, down_s=3.0)
        result = tune_kernel("matmul:M=32,N=32,K=32",
                             KernelOptions(trials=24, exploit_trials=0, seed=0,
                                           measure=MeasureConfig(rpc=dataclasses.replace(rpc, session_timeout_s=3, retry_s=90))),
                             db=tmp_path / "t.db")
        t.join(timeout=5)
        assert seen, "the tracker was not killed during the run"
        assert result.tasks[0].verified
        recs = _records(tmp_path / "t.db")
        assert len(recs) == 24 and [r.result.error for r in recs if not r.ok] == []
        assert max(r.measured_at for r in recs) - max(r.measured_at for r in seen) > 3  # measured after the restart


def test_a_tracker_gone_for_good_stops_the_run_with_one_line_and_keeps_every_record(tmp_path):
    """The tracker is killed for good: the session runs out, the runner tries again for 4 s
    (``--rpc-retry``), then the run stops with one error line naming the tracker; every record
    committed before stays, and the candidate in flight is not stored as a failure."""
    for rpc, _, _, procs in _cluster(tmp_path, KEY + "-gone", 1):
        t, seen = _kill_tracker_after(tmp_path / "g.db", procs, 4)
        r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--kernel", "matmul:M=32,N=32,K=32",
                            "--trials", "400", "--exploit-trials", "0", "--db", str(tmp_path / "g.db"),
                            "--rpc-tracker", f"{rpc.host}:{rpc.port}", "--rpc-key", rpc.key,
                            "--rpc-retry", "4", "--rpc-session-timeout", "3", "--no-progress"],
                           capture_output=True, text=True, timeout=600)
        t.join(timeout=5)
        assert seen, "the tracker was not killed during the run"
        lines = r.stderr.strip().splitlines()
        # one line naming the tracker: "does not answer", or, when the kill races the session's
        # renewal, "no free device under key ... at HOST:PORT" (seen once on AMD znver5, session 31)
        assert r.returncode != 0 and len(lines) == 1 and f"{rpc.host}:{rpc.port}" in lines[0], r.stderr
        recs = _records(tmp_path / "g.db")
        assert {x.candidate_key for x in seen} <= {x.candidate_key for x in recs} and len(recs) < 400
        assert [x.result.error for x in recs if not x.ok] == []


def test_a_device_that_registers_mid_run_joins_it(tmp_path):
    """One device at the start; a second server registers under the key once a few records are
    committed: the gateway, asking the tracker between batches, starts a runner for it, and both
    devices time candidates; every record is measured, none failed."""
    import threading

    for rpc, logs, _, procs in _cluster(tmp_path, KEY + "-join", 1):
        late_log = tmp_path / "server_late.log"

        def start_late(rpc=rpc, procs=procs, late_log=late_log):
            deadline = time.monotonic() + 300
            while len(_records(tmp_path / "j.db")) < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            sport = _free_port()
            with open(late_log, "wb") as log:
                procs["late"] = subprocess.Popen(
                    [sys.executable, "-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(sport),
                     "--port-end", str(sport + 1), "--tracker", f"127.0.0.1:{rpc.port}", "--key", rpc.key],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        t = threading.Thread(target=start_late, daemon=True)
        t.start()
        from stormdrop.cli.main import main

        code = main(["tune", "--kernel", "matmul:M=32,N=32,K=32", "--trials", "40", "--exploit-trials", "0",
                     "--db", str(tmp_path / "j.db"), "--seed", "0", "--json", str(tmp_path / "j.json"),
                     "--rpc-tracker", f"{rpc.host}:{rpc.port}", "--rpc-key", rpc.key,
                     "--rpc-join-every", "1", "--no-progress"])
        t.join(timeout=5)
        assert "late" in procs, "the second server was not started during the run"
        assert code == 0 and json.loads((tmp_path / "j.json").read_text())["tasks"][0]["verified"]
        recs = _records(tmp_path / "j.db")
        assert len(recs) == 40 and [r.result.error for r in recs if not r.ok] == []
        assert late_log.read_text(errors="replace").count("load_module") > 0, "the late device timed nothing"
        assert logs[0].read_text(errors="replace").count("load_module") > 0
