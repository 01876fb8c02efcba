"""The record store interfaces: what tuning reads from and writes to stored records, as two
protocols. ``RecordSource`` is the read side every donor gives (a ``--reuse-from`` database
opened read only, the schedule hub); ``RecordStore`` adds what a run's own database does
(``storage.database.Database``). ``tests/storage/test_record_store.py`` runs one conformance test
against every implementation: a writable database, its read-only view and the hub.

Contracts of the read side, on one target key:
- ``find_workload(mod)``: the stored workload structurally equal to ``mod`` with the same block
  names, or None; ``workloads(keep)`` every workload, or those whose op class ``keep`` accepts
  (a hub decodes those for it).
- ``best(workload_id, target, k)``: at most ``k`` valid records (no failure), fastest first.
- ``lookup(workload_id, target, key)``: the record of that candidate, or None.
- ``records(workload_id, target)``: the records in the order they were stored; ``targets``: the
  targets a workload has records on; ``count``: how many records (failures too).
- ``exact_only``: True where reuse looks the source up for a task's very workload rather than
  listing it (the hub: its related workloads are listed only with ``StormConfig.hub_transfers``).

The write side commits workloads and records (each its own transaction, a duplicate candidate
returns the stored record), re-measures, claims candidates for concurrent tuners, and keeps a
model run's note; nothing else in stormdrop writes a database.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol, runtime_checkable

import tvm

from stormdrop.records import MeasureResult, Record
from stormdrop.storage.database import WorkloadEntry


@runtime_checkable
class RecordSource(Protocol):
    """Stored workloads and records, read only (a donor of reuse)."""

    exact_only: bool

    def find_workload(self, mod: tvm.IRModule) -> WorkloadEntry | None: ...

    def workloads(self, keep: Callable[[str], bool] | None = None) -> list[WorkloadEntry]: ...

    def best(self, workload_id: int, target: str, k: int = 1, checked: bool = False) -> list[Record]: ...

    def lookup(self, workload_id: int, target: str, candidate_key: str) -> Record | None: ...

    def records(self, workload_id: int, target: str | None = None) -> list[Record]: ...

    def targets(self, workload_id: int) -> list[str]: ...

    def count(self, workload_id: int, target: str) -> int: ...

    def close(self) -> None: ...


@runtime_checkable
class RecordStore(RecordSource, Protocol):
    """A run's own database: the read side, and every write a tune makes."""

    def transaction(self) -> AbstractContextManager[None]: ...

    def commit_workload(self, mod: tvm.IRModule, *, name: str, op_class: str, flops: int) -> WorkloadEntry: ...

    def commit_record(self, record: Record) -> Record: ...

    def commit_record_new(self, record: Record) -> tuple[Record, bool]: ...

    def commit_remeasure(self, record: Record, result: MeasureResult, measured_at: float,
                         versions: str) -> Record: ...

    def failures(self, workload_id: int, target: str) -> tuple[int, int]: ...

    def claim(self, workload_id: int, target: str, keys: list[str], owner: str) -> set[str]: ...

    def claimed(self, workload_id: int, target: str, key: str) -> bool: ...

    def release(self, workload_id: int, target: str, key: str, owner: str) -> None: ...

    def note_model(self, name: str, note: dict) -> None: ...

    def model_notes(self) -> dict[str, dict]: ...


__all__ = ["RecordSource", "RecordStore"]
