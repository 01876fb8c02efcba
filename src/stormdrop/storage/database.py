"""The persistent tuning database: one SQLite file with workloads and every measured record.

Every ``commit_*`` call is its own transaction, committed before it returns, so a
killed process loses nothing already committed. The file uses WAL journaling, so
other processes (or connections) see a record as soon as ``commit_record`` returns.

MetaSchedule JSON databases are read and written by ``storage.metaschedule``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.errors import DatabaseError, one_line
from stormdrop.records import IMPORTED, ErrorKind, MeasureResult, Phase, Record
from stormdrop.storage._claims import Claims
from stormdrop.storage._schema import RECORD_COLS, WORKLOAD_COLS, open_connection, record_from_row
from stormdrop.storage.identity import as_module, same_workload
from stormdrop.target import canonical, from_canonical
from stormdrop.tvm_compat.trace_json import load_object_json


def canonical_target(target: tvm.target.Target | dict | str) -> str:
    """The canonical string stored for a target: sorted-key JSON of ``Target(...).export()``.

    Accepts a ``Target``, a target dict, or a target string (JSON text or a bare kind).
    """
    if isinstance(target, str):
        text = target.strip()
        target = json.loads(text) if text.startswith("{") else text
    if not isinstance(target, tvm.target.Target):
        target = from_canonical(json.dumps(target)) if isinstance(target, dict) else tvm.target.Target(target)
    return canonical(target)


def default_db_path() -> str:
    """The per-user database: ``$STORMDROP_DB`` or ``<user data dir>/stormdrop/stormdrop.db``."""
    env = os.environ.get("STORMDROP_DB")
    if env:
        return env
    from platformdirs import user_data_dir

    return os.path.join(user_data_dir("stormdrop", appauthor=False), "stormdrop.db")


def candidate_key(trace_json: str) -> str:
    """The identity of a candidate schedule: SHA-1 hex of its trace JSON text."""
    return hashlib.sha1(trace_json.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class WorkloadEntry:
    """A tuned workload: an IRModule plus its display name, reuse class and FLOP count."""

    workload_id: int
    name: str
    op_class: str
    flops: int
    shash: str
    mod: tvm.IRModule = field(compare=False, repr=False)


class Database(Claims):
    """A stormdrop SQLite database (created with its schema if the file is new): a ``RecordStore``
    (``storage.store``), or read only a ``RecordSource``."""

    exact_only = False  # as a donor, related workloads count too (reuse lists them)

    def __init__(self, path: str | os.PathLike, *, read_only: bool = False) -> None:
        self.path: str = os.fspath(path)
        self.read_only = read_only  # a donor or a report: the file must exist and is never written
        self._lock = threading.RLock()
        self._depth = 0
        self._mods: dict[int, tvm.IRModule] = {}
        self._conn: sqlite3.Connection | None = None
        self._conn = open_connection(self.path, read_only)

    # -- connection management ------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (everything committed is already on disk)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise DatabaseError(f"database is closed: {self.path}")
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Group several commits into one transaction (nested calls join the outer one)."""
        with self._lock:
            conn = self._c()
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise DatabaseError(f"database {self.path}: {one_line(e)}") from None
            self._depth = 1
            try:
                yield
            except BaseException:
                self._depth = 0
                self._rollback()
                raise
            self._depth = 0
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._rollback()
                raise DatabaseError(f"database {self.path}: {one_line(e)}") from None

    def _rollback(self) -> None:
        self._mods.clear()  # ids of rolled-back workloads may be reused
        conn = self._conn
        if conn is not None and conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._c().execute(sql, params).fetchall()
            except sqlite3.Error as e:
                raise DatabaseError(f"database {self.path}: {one_line(e)}") from None

    # -- workloads ------------------------------------------------------------------------

    @contextmanager
    def _decoding(self, what: str) -> Iterator[None]:
        """Stored values decoded inside: a damaged or crafted row becomes one ``DatabaseError``."""
        try:
            yield
        except (ValueError, TypeError, OverflowError, RecursionError, KeyError) as e:
            raise DatabaseError(f"database {self.path}: {what} is malformed: {one_line(e)}") from None

    def _record(self, row: tuple) -> Record:
        with self._decoding(f"record {str(row[0])[:20]}"):
            return record_from_row(row)

    def _entry(self, row: tuple) -> WorkloadEntry:
        wid, name, op_class, flops, shash, mod_json = row
        if not (isinstance(name, str) and isinstance(op_class, str) and isinstance(flops, int)
                and isinstance(shash, str) and isinstance(mod_json, str)):
            raise DatabaseError(f"database {self.path}: workload {str(wid)[:20]} is malformed (a column of the "
                                "wrong type)")
        mod = self._mods.get(wid)
        if mod is None:
            try:
                mod = self._mods[wid] = load_object_json(mod_json)
            except ValueError as e:  # crafted or damaged: TVM would crash on some of it
                raise DatabaseError(f"database {self.path}: workload {wid} ({str(name)[:60]!r}) is not a module: "
                                    f"{one_line(e)}") from None
        return WorkloadEntry(wid, name, op_class, int(flops), shash, mod)

    def find_workload(self, mod: tvm.IRModule) -> WorkloadEntry | None:
        """The stored workload structurally equal to ``mod`` with the same block names, or None."""
        mod = as_module(mod)
        shash = ms.utils.shash2hex(mod)
        rows = self._query(
            f"SELECT {WORKLOAD_COLS} FROM workloads WHERE shash=? ORDER BY workload_id", (shash,)
        )
        for row in rows:
            entry = self._entry(row)
            if same_workload(entry.mod, mod):
                return entry
        return None

    def commit_workload(
        self, mod: tvm.IRModule, *, name: str, op_class: str, flops: int, mod_json: str | None = None
    ) -> WorkloadEntry:
        """Store ``mod`` (idempotent: a structurally equal module returns the stored entry).
        ``mod_json``: the JSON ``mod`` was just decoded from, stored as it is (not written again)."""
        mod = as_module(mod)
        with self.transaction():
            found = self.find_workload(mod)
            if found is not None:
                return found
            shash = ms.utils.shash2hex(mod)
            try:
                cur = self._c().execute(
                    "INSERT INTO workloads (name, op_class, flops, shash, mod_json)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (name, op_class, int(flops), shash, mod_json or tvm.ir.save_json(mod)),
                )
            except sqlite3.Error as e:
                raise DatabaseError(f"database {self.path}: {one_line(e)}") from None
            wid = int(cur.lastrowid)
            self._mods[wid] = mod
            return WorkloadEntry(wid, name, op_class, int(flops), shash, mod)

    def workloads(self, keep: Callable[[str], bool] | None = None) -> list[WorkloadEntry]:
        """All workloads, in insertion order; ``keep``: only those whose op class it accepts (the
        others' modules are not loaded; a malformed row is refused as without it)."""
        rows = self._query(f"SELECT {WORKLOAD_COLS} FROM workloads ORDER BY workload_id")
        return [self._entry(r) for r in rows if keep is None or not isinstance(r[2], str) or keep(r[2])]

    def modules_of_class(self, word: str) -> list[tvm.IRModule]:
        """The modules of the workloads whose op class (the names of their blocks) contains ``word``."""
        rows = self._query(f"SELECT {WORKLOAD_COLS} FROM workloads WHERE instr(op_class, ?) > 0 ORDER BY workload_id",
                           (word,))
        return [self._entry(r).mod for r in rows]

    def workload(self, workload_id: int) -> WorkloadEntry:
        """The workload with this id (DatabaseError if unknown)."""
        rows = self._query(
            f"SELECT {WORKLOAD_COLS} FROM workloads WHERE workload_id=?", (int(workload_id),)
        )
        if not rows:
            raise DatabaseError(f"no workload with id {workload_id} in {self.path}")
        return self._entry(rows[0])

    # -- records --------------------------------------------------------------------------

    def _commit_record(self, record: Record) -> tuple[Record, bool]:
        """Insert ``record``; returns (stored record, whether it was new)."""
        res = record.result
        run_secs = None if res.run_secs is None else json.dumps([float(x) for x in res.run_secs])
        mean = res.mean if res.ok and math.isfinite(res.mean) else None
        error = None if res.error is None else ErrorKind(res.error).value
        with self.transaction():
            try:
                cur = self._c().execute(
                    "INSERT OR IGNORE INTO records (workload_id, target, candidate_key, trace_json,"
                    " args_info_json, run_secs, mean_secs, error, error_msg, phase, measured_at,"
                    " versions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        int(record.workload_id),
                        record.target,
                        record.candidate_key,
                        record.trace_json,
                        record.args_info_json,
                        run_secs,
                        mean,
                        error,
                        res.error_msg,
                        Phase(record.phase).value,
                        float(record.measured_at),
                        record.versions,
                    ),
                )
            except sqlite3.IntegrityError as e:
                raise DatabaseError(
                    f"cannot store record for workload {record.workload_id}: {one_line(e)}"
                ) from None
            except sqlite3.Error as e:
                raise DatabaseError(f"database {self.path}: {one_line(e)}") from None
            if cur.rowcount == 1:
                return replace(record, record_id=int(cur.lastrowid)), True
            stored = self.lookup(record.workload_id, record.target, record.candidate_key)
            assert stored is not None
            return stored, False

    def commit_record(self, record: Record) -> Record:
        """Store and commit one record; a duplicate candidate returns the stored record."""
        return self._commit_record(record)[0]

    def commit_record_new(self, record: Record) -> tuple[Record, bool]:
        """``commit_record``, and whether the candidate was new (False: it was already stored)."""
        return self._commit_record(record)

    def commit_remeasure(self, record: Record, result: MeasureResult, measured_at: float, versions: str) -> Record:
        """Store a re-measurement of a stored record (a retryable failure measured once more, or a best
        record that failed its verification for good): its result replaces the stored one, its
        attempts go up by one, committed before this returns."""
        run_secs = None if result.run_secs is None else json.dumps([float(x) for x in result.run_secs])
        mean = result.mean if result.ok and math.isfinite(result.mean) else None
        error = None if result.error is None else ErrorKind(result.error).value
        with self.transaction():
            try:
                self._c().execute(
                    "UPDATE records SET run_secs=?, mean_secs=?, error=?, error_msg=?, measured_at=?, versions=?,"
                    " attempts=attempts+1 WHERE record_id=?",
                    (run_secs, mean, error, result.error_msg, float(measured_at), versions, int(record.record_id)))
            except sqlite3.Error as e:
                raise DatabaseError(f"database {self.path}: {one_line(e)}") from None
            stored = self.lookup(record.workload_id, record.target, record.candidate_key)
        assert stored is not None
        return stored

    def failures(self, workload_id: int, target: str) -> tuple[int, int]:
        """Failed records of a workload on a target: (final, to be retried by the next run)."""
        rows = self._query("SELECT error, attempts, COUNT(*) FROM records WHERE workload_id=? AND target=?"
                           " AND error IS NOT NULL GROUP BY error, attempts", (int(workload_id), target))
        with self._decoding(f"a failure of workload {workload_id}"):
            retry = sum(int(n) for e, a, n in rows if ErrorKind(e).retryable and int(a) < 2)
            return sum(int(n) for *_, n in rows) - retry, retry

    def lookup(self, workload_id: int, target: str, candidate_key: str) -> Record | None:
        """The record of this candidate, or None if it was never measured."""
        rows = self._query(
            f"SELECT {RECORD_COLS} FROM records"
            " WHERE workload_id=? AND target=? AND candidate_key=?",
            (int(workload_id), target, candidate_key),
        )
        return self._record(rows[0]) if rows else None

    def records(self, workload_id: int, target: str | None = None) -> list[Record]:
        """All records of a workload (optionally one target), in measurement order."""
        if target is None:
            rows = self._query(
                f"SELECT {RECORD_COLS} FROM records WHERE workload_id=? ORDER BY record_id",
                (int(workload_id),),
            )
        else:
            rows = self._query(
                f"SELECT {RECORD_COLS} FROM records WHERE workload_id=? AND target=?"
                " ORDER BY record_id",
                (int(workload_id), target),
            )
        return [self._record(r) for r in rows]

    def best(self, workload_id: int, target: str, k: int = 1, checked: bool = False) -> list[Record]:
        """The ``k`` valid records with the lowest mean time (failures never count); ``checked``:
        only those whose output stormdrop checked, not records imported from another tuner and
        never re-measured here (a re-measure stores stormdrop's versions over the import's)."""
        own = " AND versions NOT LIKE ?" if checked else ""
        rows = self._query(
            f"SELECT {RECORD_COLS} FROM records WHERE workload_id=? AND target=?"
            f" AND error IS NULL AND mean_secs IS NOT NULL{own}"
            " ORDER BY mean_secs, record_id LIMIT ?",
            (int(workload_id), target, *([f"{IMPORTED}%"] if checked else []), int(k)),
        )
        return [self._record(r) for r in rows]

    def targets(self, workload_id: int) -> list[str]:
        """The targets this workload has records for, in order of first measurement."""
        rows = self._query(
            "SELECT target FROM records WHERE workload_id=? GROUP BY target ORDER BY MIN(record_id)",
            (int(workload_id),),
        )
        return [r[0] for r in rows]

    def count(self, workload_id: int, target: str) -> int:
        """Number of records (failures included) of a workload on a target."""
        rows = self._query(
            "SELECT COUNT(*) FROM records WHERE workload_id=? AND target=?",
            (int(workload_id), target),
        )
        return int(rows[0][0])

    # -- model runs -----------------------------------------------------------------------

    def note_model(self, name: str, note: dict) -> None:
        """Keep what a model run knows beyond its records (its tasks and weights, its latencies):
        the ``meta`` row ``model:<name>``, replaced by the model's next run."""
        try:
            with self._lock:
                self._c().execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                  (f"model:{name}", json.dumps(note)))
        except sqlite3.Error as e:
            raise DatabaseError(f"database {self.path}: {one_line(e)}") from None

    def model_notes(self) -> dict[str, dict]:
        """Every model run's note, by model name (``note_model``)."""
        rows = self._query("SELECT key, value FROM meta WHERE key LIKE 'model:%' ORDER BY key")
        with self._decoding("a model note"):
            notes = {key.removeprefix("model:"): json.loads(value) for key, value in rows}
        if not all(isinstance(n, dict) for n in notes.values()):
            raise DatabaseError(f"database {self.path}: a model note is malformed (not a JSON object)")
        return notes

