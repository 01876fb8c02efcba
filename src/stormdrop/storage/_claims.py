"""Claims: concurrent tuners on one database never measure one candidate twice.

A tuner claims the candidates it is about to measure (owner ``host:pid:nonce``, a
heartbeat); another tuner skips a candidate a live owner holds, and a dead owner's claims
lapse. A claiming owner's heartbeat is refreshed every ``HEARTBEAT_S`` by a thread while its
database is open, so that a live tuner's claims hold through a long build, an RPC wait or a
wait for the timing lock. ``Database`` inherits these methods (they use its ``_query``,
``transaction`` and ``_lock``).
"""

from __future__ import annotations

import os
import socket
import threading
import time

from stormdrop.records import ErrorKind

CLAIM_STALE_S = 300.0  # a claim not refreshed for this long belongs to a dead tuner
HEARTBEAT_S = 60.0  # how often a live owner's claims are refreshed


def _alive(owner: str, heartbeat: float, now: float) -> bool:
    """Whether a claim's owner (``host:pid:nonce``) may still be measuring: on this host, while its
    process exists; elsewhere, while its heartbeat is recent."""
    host, _, rest = owner.partition(":")
    if host == socket.gethostname():
        try:
            os.kill(int(rest.partition(":")[0]), 0)
        except ProcessLookupError:
            return False
        except (ValueError, PermissionError):
            pass
    return now - float(heartbeat) < CLAIM_STALE_S


class Claims:
    """The ``claims`` table's operations, mixed into ``Database``."""

    def claim(self, workload_id: int, target: str, keys: list[str], owner: str) -> set[str]:
        """Claim candidates for ``owner`` before measuring them; returns the keys not to measure: held
        by another live owner (wait for their records) or measured meanwhile. A claim whose owner
        has not been heard of for ``CLAIM_STALE_S`` seconds (a killed tuner) is taken over."""
        now, taken = time.time(), set()
        with self.transaction():
            for key in keys:
                row = self._query("SELECT owner, heartbeat FROM claims WHERE workload_id=? AND target=? AND"
                                  " candidate_key=?", (int(workload_id), target, key))
                if row and row[0][0] != owner and _alive(*row[0], now):
                    taken.add(key)
                    continue
                done = self._query("SELECT error, attempts FROM records WHERE workload_id=? AND target=? AND"
                                   " candidate_key=?", (int(workload_id), target, key))
                if done and not (done[0][0] and ErrorKind(done[0][0]).retryable and int(done[0][1]) < 2):
                    taken.add(key)  # committed since the caller looked: its record is the result
                    continue
                self._query("INSERT OR REPLACE INTO claims (workload_id, target, candidate_key, owner, heartbeat)"
                            " VALUES (?, ?, ?, ?, ?)", (int(workload_id), target, key, owner, now))
        self._keep_alive(owner)
        return taken

    def _keep_alive(self, owner: str) -> None:
        """Start ``owner``'s heartbeat thread, once per open database and owner."""
        with self._lock:
            beating = self.__dict__.setdefault("_heartbeats", set())
            if owner in beating:
                return
            beating.add(owner)
        threading.Thread(target=self._beat, args=(owner,), daemon=True, name="claims-heartbeat").start()

    def _beat(self, owner: str) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                if self._conn is None:  # closed: the owner is done with this database
                    return
                try:
                    self._query("UPDATE claims SET heartbeat=? WHERE owner=?", (time.time(), owner))
                except Exception:  # noqa: BLE001 - a busy or failing database: the next beat tries again
                    pass

    def claimed(self, workload_id: int, target: str, key: str) -> bool:
        """Whether a live owner holds this candidate."""
        row = self._query("SELECT owner, heartbeat FROM claims WHERE workload_id=? AND target=? AND candidate_key=?",
                          (int(workload_id), target, key))
        return bool(row) and _alive(*row[0], time.time())

    def release(self, workload_id: int, target: str, key: str, owner: str) -> None:
        """Drop ``owner``'s claim (after its record is committed) and keep its other claims alive."""
        with self.transaction():
            self._query("DELETE FROM claims WHERE workload_id=? AND target=? AND candidate_key=? AND owner=?",
                        (int(workload_id), target, key, owner))
            self._query("UPDATE claims SET heartbeat=? WHERE owner=?", (time.time(), owner))
