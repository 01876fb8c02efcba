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


def _signal_self(sig: int) -> None:
    """Send ``sig`` to this process and go on for a second (its handler runs at the next instruction)."""
    os.kill(os.getpid(), sig)
    for _ in range(200):
        time.sleep(0.005)


def _signal_inside_tvm(sig: int):
    """Call into TVM, which calls back Python code that gets ``sig`` (as the cost model inside the
    evolutionary search does when Ctrl-C comes); what TVM raises comes out."""
    tvm_ffi.convert(lambda: _signal_self(sig))()


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
            _signal_self(signal.SIGTERM)
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
            _signal_self(signal.SIGINT)
            finished = True
    assert finished


_CTRL_C_DURING_THE_SEARCH = r"""
import os, random, signal, sys, tempfile, threading
sys.path.insert(0, {tests!r})
from dbutil import SPEC
from stormdrop import stop
from stormdrop.records import MeasureResult
from stormdrop.search.options import SearchOptions
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.tuning.task import TaskSession, TaskTuner
from stormdrop.workloads import parse_kernel

class Timings:  # every candidate measured at once, at a random time
    def prepare(self, key, mod, seed=0):
        pass

    def measure(self, key, mods, on_result=None):
        out = [MeasureResult(run_secs=(random.uniform(1e-5, 1e-4),) * 3) for _ in mods]
        for i, r in enumerate(out):
            if on_result is not None:
                on_result(i, r)
        return out

random.seed(0)
kernel = parse_kernel(SPEC)
with Database(os.path.join(tempfile.mkdtemp(), "t.db")) as db:
    for attempt in range({attempts}):
        stop.install()
        tuner = TaskTuner(TaskSession(db, Timings(), kernel, host_target(), attempt), trials=10**6, exploit_trials=0,
                          search=SearchOptions(reuse=0))
        tuner.step()  # the storm built and its first (random) batch measured: the evolution runs next
        threading.Timer(random.uniform(0.0, 0.5), os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            while True:
                tuner.step()
        except KeyboardInterrupt:
            print("stopped", flush=True)
"""


@pytest.mark.slow  # processes of their own: without the deferral one aborts
def test_ctrl_c_at_any_moment_of_the_evolutionary_search_stops_it_with_keyboard_interrupt(tmp_path):
    """The search calls Python back from C++ (the cost model, and MetaSchedule's logger from a
    destructor, where an exception aborts the process in std::terminate): Ctrl-C at random
    moments of it, eight times, is a ``KeyboardInterrupt`` each time, never another error or an abort."""
    import subprocess
    import sys
    from pathlib import Path

    script = _CTRL_C_DURING_THE_SEARCH.format(tests=str(Path(__file__).parents[1]), attempts=8)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.split() == ["stopped"] * 8, (r.returncode, r.stdout, r.stderr[-2000:])
