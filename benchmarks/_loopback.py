"""A TVM RPC tracker and servers on this machine (loopback) for the RPC benchmarks: each process in
its own process group, logs in a folder; a server can be replaced and the tracker restarted (faults)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from stormdrop.measure.tracker import RpcConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


class Loopback:
    """A tracker on a free port and ``servers`` servers under ``key``, registered and free (else
    SystemExit after a minute); ``rpc`` is the address the tuner's ``MeasureConfig`` takes."""

    def __init__(self, logs: str, key: str, servers: int) -> None:
        self.logs, self.key, self.port, self.n = logs, key, free_port(), 0
        self.tracker = self._start(["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(self.port),
                                    "--port-end", str(self.port + 1)], "tracker")
        self.servers = [self.server() for _ in range(servers)]
        self.wait_free(servers)

    @property
    def rpc(self) -> RpcConfig:
        return RpcConfig("127.0.0.1", self.port, self.key)

    def _start(self, cmd: list[str], name: str) -> subprocess.Popen:
        with open(os.path.join(self.logs, f"{name}.log"), "ab") as log:
            return subprocess.Popen([sys.executable, "-m", *cmd], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def server(self) -> subprocess.Popen:
        """A new server on a new port (it joins the tracker when it is up)."""
        self.n += 1
        port = free_port()
        return self._start(["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port), "--port-end",
                            str(port + 1), "--tracker", f"127.0.0.1:{self.port}", "--key", self.key],
                           f"server{self.n}")

    def wait_free(self, n: int, timeout: float = 60) -> None:
        from stormdrop.measure.tracker import (
            free_devices,  # (knocks on the port first: TVM's connect retries a minute)
        )

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (free_devices(self.rpc) or 0) >= n:
                return
            time.sleep(0.5)
        self.close()
        raise SystemExit(f"the {n} loopback RPC servers did not register (logs: {self.logs})")

    def replace_server(self, i: int, down: float) -> None:
        stop([self.servers[i]])
        time.sleep(down)
        self.servers[i] = self.server()

    def restart_tracker(self, down: float) -> None:
        stop([self.tracker])
        time.sleep(down)
        self.tracker = self._start(self.tracker.args[2:], "tracker")

    def close(self) -> None:
        stop([self.tracker, *self.servers])

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
