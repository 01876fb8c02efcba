"""The user's stop (Ctrl-C, SIGTERM) is not lost where TVM runs Python code: tvm-ffi carries a
``KeyboardInterrupt`` raised there back out as a ``RuntimeError``."""

from __future__ import annotations

import os
import signal
import time

import pytest
import tvm_ffi

from stormdrop import stop
from stormdrop.cli import main as cli


@pytest.fixture
def handlers(monkeypatch):
    """This test's stop handlers and stop request, the process's own again afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(stop, "_requested", None)
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def _signal_inside_tvm(sig: int):
    """Call into TVM, which calls back Python code that gets ``sig`` (as the cost model inside the
    evolutionary search does when Ctrl-C comes); what TVM raises comes out."""
    def callback():
        os.kill(os.getpid(), sig)
        for _ in range(200):  # the handler runs at the next instruction
            time.sleep(0.005)

    tvm_ffi.convert(callback)()


def test_ctrl_c_inside_a_tvm_callback_comes_out_as_another_error_and_check_raises_it_again(handlers):
    stop.install()
    with pytest.raises(RuntimeError):  # what a caller skipping a failed candidate catches
        _signal_inside_tvm(signal.SIGINT)
    assert stop.requested() == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        stop.check()


def test_sigterm_is_not_an_exception_a_caller_skipping_failures_catches(handlers):
    stop.install()
    with pytest.raises(stop.Terminated):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(200):
                time.sleep(0.005)
        except Exception:  # noqa: BLE001 - as such a caller does
            pass
    with pytest.raises(stop.Terminated):
        stop.check()


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_stop_that_comes_out_of_tvm_as_an_error_ends_the_command_as_a_stop(handlers, monkeypatch, capsys, sig, code,
                                                                            word):
    monkeypatch.setitem(cli.COMMANDS, "ops", lambda args: _signal_inside_tvm(sig))
    assert cli.main(["ops"]) == code
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"stormdrop: {word}; every measured record is kept in the database"]


def test_without_a_stop_an_error_from_tvm_is_still_an_error(handlers, monkeypatch, capsys):
    def fails(args):
        raise RuntimeError("a TVM failure")

    monkeypatch.setitem(cli.COMMANDS, "ops", fails)
    assert cli.main(["ops"]) == 1
    assert "RuntimeError: a TVM failure" in capsys.readouterr().err


def test_a_stop_inside_a_deferred_block_is_raised_as_the_block_ends(handlers):
    stop.install()
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(200):
                time.sleep(0.005)
            finished = True
    assert finished


_CTRL_C_IN_THE_EVOLUTION = r"""
import os, signal, sys, tempfile
sys.path.insert(0, {tests!r})
from dbutil import SPEC, ScriptedGateway
from tvm.s_tir import meta_schedule as ms
from stormdrop import stop
from stormdrop.search.options import SearchOptions
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.tuning.task import TaskSession, TaskTuner
from stormdrop.workloads import parse_kernel

predict, told = ms.cost_model.XGBModel.predict, []

def ctrl_c_then_predict(self, context, candidates):  # the cost model, called back by the C++ search
    if not told:
        told.append(1)
        os.kill(os.getpid(), signal.SIGINT)
    return predict(self, context, candidates)

ms.cost_model.XGBModel.predict = ctrl_c_then_predict
stop.install()
gateway = ScriptedGateway([])
with Database(os.path.join(tempfile.mkdtemp(), "t.db")) as db:
    session = TaskSession(db, gateway, parse_kernel(SPEC), host_target(), 0)
    tuner = TaskTuner(session, trials=16, exploit_trials=0, search=SearchOptions(reuse=0))
    try:
        tuner.step()
    except KeyboardInterrupt:
        print("stopped", len(told), gateway.calls)
"""


@pytest.mark.slow  # a process of its own: without the deferral it aborts
def test_ctrl_c_while_the_evolution_calls_the_cost_model_stops_the_tune_after_the_search_returns(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = _CTRL_C_IN_THE_EVOLUTION.format(tests=str(Path(__file__).parents[1]))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["stopped", "1", "0"], (r.returncode, r.stdout, r.stderr[-2000:])
