"""The gateway's worker processes, seen from the gateway: persistent children (TVM imported
once) that build or time candidates over a pipe (``_worker`` is their side); a crash or hang
kills only its worker, which starts again on the next request."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from stormdrop.errors import MeasureError, one_line
from stormdrop.measure.tracker import RpcConfig
from stormdrop.tvm_compat.runtime import runtime_threads_env


def child_entry(module: str, function: str) -> str:
    """``python -c`` code calling ``stormdrop.MODULE.FUNCTION(sys.argv[1:])`` without the working
    directory on sys.path (``-m`` puts it first: a ``tvm.py`` there would be imported), and with
    ``torch`` unimportable: TVM-FFI imports PyTorch whenever it is installed, which would triple
    every worker's start-up, and no child process uses it (``tvm_compat/runtime.py``)."""
    return (f"import sys; del sys.path[0]; sys.modules.setdefault('torch', None); "
            f"from stormdrop.{module} import {function}; {function}(sys.argv[1:])")


def child_env() -> dict[str, str]:
    """This process's environment for a child stormdrop process: this package first on its path
    (no empty entry, which would be the working directory)."""
    env = dict(os.environ)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # src/, above stormdrop/measure/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


_ENTRY = child_entry("measure._worker", "main")


class Worker:
    """A persistent child process serving requests over a pipe."""

    def __init__(self, role: str, target_json: str, rpc: RpcConfig | None) -> None:
        self.role, self.target_json, self.rpc = role, target_json, rpc
        self.proc: Any = None
        self.conn: Any = None
        self.started_at = 0.0
        self.generation = 0  # bumped on every (re)start: a new process holds no state
        self.jobs = 0  # jobs this process did (its first pays its warm-up)

    def start(self) -> None:
        # A plain subprocess, not multiprocessing's spawn: spawn re-imports the
        # user's __main__ module, which breaks scripts without a main guard.
        parent, child = socket.socketpair()
        fd = child.fileno()
        # The parent's pid: a worker exits when its tuner is gone.
        rpc_json = self.rpc.to_json() if self.rpc else "null"
        cmd = [sys.executable, "-c", _ENTRY, str(fd), self.role, self.target_json, rpc_json,
               str(os.getpid())]
        env = child_env()
        if self.role == "runner":  # timed on the target's cores, not TVM's default half (see tvm_compat.runtime)
            runtime_threads_env(int(json.loads(self.target_json).get("num-cores", 0)), env)
        self.proc = subprocess.Popen(cmd, pass_fds=(fd,), env=env, stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())
        self.generation, self.jobs = self.generation + 1, 0

    def ensure(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def send(self, command: str, payload: tuple) -> None:
        self.ensure()
        self.conn.send((command, payload))
        self.started_at = time.monotonic()

    def receive(self) -> tuple[str, Any]:
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            code = self.proc.poll() if self.proc is not None else None
            self.kill()
            return ("crash", f"worker died (exit code {code})")

    def call(self, command: str, payload: tuple, timeout: float) -> tuple[str, Any]:
        self.send(command, payload)
        if not self.conn.poll(timeout):
            self.kill()
            return ("timeout", f"no answer within {timeout:.0f} s")
        return self.receive()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def ask_to_stop(self) -> None:
        """Tell the worker to exit (``stop`` waits for it): several workers exit at once."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.conn.send(("stop", ()))
            except OSError:
                pass

    def stop(self) -> None:
        """Ask the worker to exit, give it 2 s, then kill it."""
        self.ask_to_stop()
        if self.proc is not None:
            try:
                self.proc.wait(2)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class DeviceGone(MeasureError):
    """An RPC device that could not be reached again (the worker's ``DeviceLost``)."""


class Runner:
    """A runner worker and the workloads whose inputs and reference outputs it holds."""

    def __init__(self, worker: Worker, joined: bool = False) -> None:
        self.worker = worker
        self.references: set[str] = set()
        self.generation = 0
        self.joined = joined  # a device that joined mid-run: one that fails its set-up is left out

    def holds(self, key: str) -> bool:
        """Whether the runner process has ``key``'s inputs and reference outputs (it is started if it
        is not running; a restarted one has none)."""
        self.worker.ensure()
        if self.worker.generation != self.generation:  # restarted: references are gone
            self.references.clear()
            self.generation = self.worker.generation
        return key in self.references

    def ensure_reference(self, key: str, workload: tuple[str, int], run_timeout_s: float,
                         lib: tuple[str, str] | None = None) -> None:
        """``key``'s inputs and reference outputs made, unless held: its untuned build, ``lib``'s
        (library, function), loaded and run (a builder compiled it), or without one compiled by
        the runner itself."""
        if self.holds(key):
            return
        status, value = self.worker.call("reference", (key, *workload, *(lib or (None, "main"))),
                                         timeout=max(600.0, run_timeout_s))
        if status == "lost" or (status != "ok" and self.joined and self.generation == 1 and not self.references):
            raise DeviceGone(one_line(value))  # (a joined device taken by another meanwhile, say)
        if status != "ok":
            reason = one_line(value) if str(value).strip() else status
            raise MeasureError(f"cannot compute the reference output of {key}: {reason}")
        self.references.add(key)
