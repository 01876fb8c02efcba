"""Remote devices under an RPC tracker: where they are (``RpcConfig``) and what the tracker says of
the devices under a key (its summary's queue), asked without TVM's minute of silent retries."""

from __future__ import annotations

import dataclasses
import json
import socket
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RpcConfig:
    """Candidates and models timed on the devices registered under ``key`` at the tracker
    ``host:port``. ``retry_s``: how long a lost session is tried again (a tracker or server
    restarted) before its device counts as lost; ``session_timeout_s``: the session length asked
    of the tracker, renewed before it ends (0: no end); ``join_every_s``: how often the tracker is
    asked for devices freed since the start; ``join``: a runner that joined after the start,
    which gives up at once when no device is free any more."""

    host: str
    port: int
    key: str
    retry_s: float = 120.0
    session_timeout_s: float = 600.0
    join_every_s: float = 60.0
    join: bool = False

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RpcConfig | None:
        """The config ``to_json`` wrote (``None`` for JSON null)."""
        fields = json.loads(text)
        return None if fields is None else cls(**fields)


def knock(rpc: RpcConfig, timeout: float = 5.0) -> None:
    """Connect to the tracker's port and leave (OSError if it does not answer): seconds, not the
    minute TVM's own connect retries silently."""
    socket.create_connection((rpc.host, rpc.port), timeout=timeout).close()


def connect_tracker(rpc: RpcConfig, timeout: float = 5.0) -> Any:
    """A session with the tracker whose connects fail at once (OSError) when the port does not
    answer (see ``tvm_compat.rpc``)."""
    from stormdrop.tvm_compat.rpc import tracker_session

    return tracker_session(rpc.host, rpc.port, timeout)


def renewal_due(opened: float, session_timeout: float) -> bool:
    """Whether a session opened at ``opened`` (``time.monotonic()``) is in the last fifth, or last
    minute, of the tracker's ``session_timeout`` (0: never ends), when it is renewed."""
    return bool(session_timeout) and time.monotonic() - opened > session_timeout - min(60.0, session_timeout / 5)


def free_devices(rpc: RpcConfig) -> int | None:
    """The devices free under the key now (the tracker's summary); None if the tracker does not answer."""
    try:
        info = connect_tracker(rpc).summary().get("queue_info", {})
        return int(info.get(rpc.key, {}).get("free", 0))
    except Exception:  # noqa: BLE001 - the runners' own set-up and retries say what is wrong
        return None


def devices_to_start(rpc: RpcConfig, cap: int) -> int:
    """How many runners to start: the devices free under the key now, at most ``cap`` (0: no cap),
    at least one (whose set-up then reports any problem)."""
    free = free_devices(rpc) or 1
    return max(1, min(free, cap) if cap > 0 else free)
