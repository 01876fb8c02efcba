"""Measurement on a device registered at a TVM RPC tracker (loopback tracker + server): kernels and
models tuned and timed there, sessions renewed. Faults (servers and trackers killed, devices
joining) are in test_rpc_faults.py."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
from rpcutil import KEY, cluster, free_port, wait_free

from stormdrop.measure.gateway import MeasureConfig
from stormdrop.model.options import ModelOptions
from stormdrop.storage.database import Database
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions

pytestmark = pytest.mark.slow  # builds, runs or spawns processes


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
    """A tracker and one server with key KEY, and the server's log file."""
    for rpc, logs, *_ in cluster(tmp_path_factory.mktemp("rpc"), KEY, 1):
        yield rpc, logs


@pytest.fixture(scope="module")
def tracker(one_device):
    return one_device[0]


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """A tracker and two servers with one key, and the servers' log files."""
    for rpc, logs, *_ in cluster(tmp_path_factory.mktemp("rpc2"), KEY + "-2", 2):
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
    port = free_port()  # nothing listens there
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--kernel", "matmul:M=16,N=16,K=16",
                        "--trials", "2", "--exploit-trials", "1", "--db", str(tmp_path / "x.db"),
                        "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", KEY],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stormdrop: error:"), r.stderr


def test_a_tracker_that_dies_fails_its_connects_in_seconds_not_minutes():
    """A tracker that accepts, answers the handshake and dies: the session's request (TVM's: five
    tries of a minute each) and a new connect (TVM's: a minute) fail at once, so a runner renewing
    its session as the tracker dies gives up within the run's device timeout."""
    import socket
    import struct
    import threading

    from tvm.rpc import base

    from stormdrop.measure.tracker import RpcConfig, connect_tracker

    listener = socket.create_server(("127.0.0.1", 0))
    rpc = RpcConfig("127.0.0.1", listener.getsockname()[1], KEY)

    def serve_once():
        conn, _ = listener.accept()
        base.recvall(conn, 4)
        conn.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        listener.close()
        conn.close()

    t = threading.Thread(target=serve_once, daemon=True)
    t.start()
    session = connect_tracker(rpc)
    t.join(timeout=10)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Cannot request"):
        session.request(KEY, session_timeout=3)
    with pytest.raises(OSError):
        connect_tracker(rpc)
    assert time.monotonic() - start < 5


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
    wait_free(rpc, 2)  # the gateways' sessions are over: both devices back at the tracker
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
    for rpc, _, _, _ in cluster(tmp_path, KEY + "-renew", 1):
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

