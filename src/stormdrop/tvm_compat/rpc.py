"""TVM's tracker client without its silent retries: ``TrackerSession`` connects through
``connect_with_retry``, which tries a refused port again for a minute, and a request tries five
times, reconnecting each time; a tracker that dies between a knock on its port and the connect
held a runner for minutes, past the device timeout of the run it was timing, which then stored
a spurious timeout."""

from __future__ import annotations

import socket
import struct
from typing import Any


def tracker_session(host: str, port: int, timeout: float = 5.0) -> Any:
    """A ``TrackerSession`` with the tracker at ``host:port`` whose connects fail at once
    (OSError) when the port does not answer, or after ``timeout`` seconds when it hangs."""
    from tvm.rpc import base
    from tvm.rpc.client import TrackerSession

    class _Session(TrackerSession):
        def _connect(self) -> None:
            self._sock = socket.create_connection(self._addr, timeout=timeout)
            self._sock.settimeout(None)  # a request waits in the tracker's queue as long as it takes
            self._sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(self._sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise RuntimeError(f"{self._addr!s} is not an RPC tracker")

    return _Session((host, port))
