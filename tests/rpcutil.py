"""A loopback TVM RPC cluster for the tests: a tracker and servers in their own process groups."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from stormdrop.measure.tracker import RpcConfig

KEY = "stormdrop-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_line(path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


def wait_free(rpc: RpcConfig, n: int, timeout: float = 60) -> None:
    from tvm import rpc as tvm_rpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = tvm_rpc.connect_tracker(rpc.host, rpc.port).summary()["queue_info"]
        if queue.get(rpc.key, {}).get("free", 0) >= n:
            return
        time.sleep(0.5)
    pytest.fail(f"{n} devices under {rpc.key} did not become free")


def cluster(logs, key: str, servers: int):
    """A tracker and ``servers`` servers with ``key``, in their own process groups (their popen workers
    too); yields the tracker's address, the servers' log files and processes, and every process by
    name (``tracker``, ``server0``, ...: a test may replace one; all are killed at the end).

    If a process exits while we wait for the servers to register, this fails at once with that
    process's last output line (e.g. a missing module) instead of waiting a minute."""
    tport = free_port()
    commands = {"tracker": ["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(tport),
                            "--port-end", str(tport + 1)]}
    for i in range(servers):
        sport = free_port()
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
                                f"{last_line(logs / f'{name}.log')}")
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
                            f"{last_line(logs / 'server0.log')}")
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

