"""What an RPC tracker says of the devices under a key (its summary's queue), asked without TVM's
minute of silent retries: the port is knocked on first."""

from __future__ import annotations

import socket
import time


def knock(rpc: dict, timeout: float = 5.0) -> None:
    """Connect to the tracker's port and leave (OSError if it does not answer): seconds, not the
    minute TVM's own connect retries silently."""
    socket.create_connection((rpc["host"], int(rpc["port"])), timeout=timeout).close()


def renewal_due(opened: float, session_timeout: float) -> bool:
    """Whether a session opened at ``opened`` (``time.monotonic()``) is in the last fifth, or last
    minute, of the tracker's ``session_timeout`` (0: never ends), when it is renewed."""
    return bool(session_timeout) and time.monotonic() - opened > session_timeout - min(60.0, session_timeout / 5)


def free_devices(rpc: dict) -> int | None:
    """The devices free under the key now (the tracker's summary); None if the tracker does not answer."""
    try:
        knock(rpc)
        from tvm import rpc as tvm_rpc

        info = tvm_rpc.connect_tracker(rpc["host"], int(rpc["port"])).summary().get("queue_info", {})
        return int(info.get(rpc["key"], {}).get("free", 0))
    except Exception:  # noqa: BLE001 - the runners' own set-up and retries say what is wrong
        return None


def devices_to_start(rpc: dict, cap: int) -> int:
    """How many runners to start: the devices free under the key now, at most ``cap`` (0: no cap),
    at least one (whose set-up then reports any problem)."""
    free = free_devices(rpc) or 1
    return max(1, min(free, cap) if cap > 0 else free)
