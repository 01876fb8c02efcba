"""The SQLite storage format: schema (versioned), opening and validating a file, column lists, row -> Record."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Any

from stormdrop.errors import DatabaseError, one_line
from stormdrop.records import ErrorKind, MeasureResult, Phase, Record

SCHEMA_VERSION = 2  # 2: records.attempts, claims (a version-1 file gains them when opened)

SQLITE_MAGIC = b"SQLite format 3\x00"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS workloads (
    workload_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT    NOT NULL,
    op_class    TEXT    NOT NULL,
    flops       INTEGER NOT NULL,
    shash       TEXT    NOT NULL,
    mod_json    TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS workloads_shash ON workloads (shash);
CREATE TABLE IF NOT EXISTS records (
    record_id      INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_id    INTEGER NOT NULL REFERENCES workloads (workload_id),
    target         TEXT    NOT NULL,
    candidate_key  TEXT    NOT NULL,
    trace_json     TEXT    NOT NULL,
    args_info_json TEXT    NOT NULL,
    run_secs       TEXT,
    mean_secs      REAL,
    error          TEXT,
    error_msg      TEXT    NOT NULL,
    phase          TEXT    NOT NULL,
    measured_at    REAL    NOT NULL,
    versions       TEXT    NOT NULL,
    attempts       INTEGER NOT NULL DEFAULT 1,
    UNIQUE (workload_id, target, candidate_key)
);
CREATE INDEX IF NOT EXISTS records_wl_target_mean ON records (workload_id, target, mean_secs);
CREATE TABLE IF NOT EXISTS claims (
    workload_id    INTEGER NOT NULL,
    target         TEXT    NOT NULL,
    candidate_key  TEXT    NOT NULL,
    owner          TEXT    NOT NULL,
    heartbeat      REAL    NOT NULL,
    PRIMARY KEY (workload_id, target, candidate_key)
);
"""

RECORD_COLS = (
    "record_id, workload_id, target, candidate_key, trace_json, args_info_json, "
    "run_secs, error, error_msg, phase, measured_at, versions, attempts"
)
WORKLOAD_COLS = "workload_id, name, op_class, flops, shash, mod_json"


def record_from_row(row: tuple) -> Record:
    """A records row as a ``Record``; ``ValueError``, ``TypeError``, ``OverflowError`` or
    ``RecursionError`` for a malformed one (``database.Database`` turns them into one line)."""
    (rid, wid, target, key, trace_json, args_json, run_secs, error, error_msg, phase, at, ver, attempts) = row
    if error is None:
        secs = tuple(float(x) for x in json.loads(run_secs or "[]"))
        if not secs or not all(math.isfinite(x) and x > 0 for x in secs):
            raise ValueError(f"run times {str(run_secs)[:40]} are not positive finite times")
        result = MeasureResult(run_secs=secs)
    else:
        result = MeasureResult(run_secs=None, error=ErrorKind(error), error_msg=error_msg or "")
    return Record(
        workload_id=int(wid),
        target=target,
        candidate_key=key,
        trace_json=trace_json,
        args_info_json=args_json,
        result=result,
        phase=Phase(phase),
        measured_at=float(at),
        versions=ver,
        record_id=int(rid),
        attempts=int(attempts),
    )


def open_connection(path: str, read_only: bool = False) -> sqlite3.Connection:
    """Open (or create, with the current schema) the database file; DatabaseError if it is not one of ours.

    ``read_only``: the file must exist and is never written (a donor database)."""
    p = Path(path)
    if p.is_dir():
        raise DatabaseError(f"database path is a directory: {path}")
    if read_only:
        return _open_read_only(p, path)
    fresh, version = not p.exists(), SCHEMA_VERSION
    if not fresh:
        try:
            with open(p, "rb") as f:
                header = f.read(len(SQLITE_MAGIC))
        except OSError as e:
            raise DatabaseError(f"cannot read database {path}: {one_line(e)}") from None
        fresh = header == b""
        if not fresh and header != SQLITE_MAGIC:
            raise DatabaseError(f"not an SQLite database: {path}")
        if not fresh:
            fresh, version = _check_existing(p, path)
    else:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DatabaseError(f"cannot create database {path}: {one_line(e)}") from None
    # Two tuners started together on a new file: SQLite may answer "database is locked" at
    # once, without its busy handler (switching to WAL), to one of them; wait and open again.
    deadline = time.monotonic() + 60.0
    while True:
        try:
            return _connect(path, fresh, version)
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) and "busy" not in str(e) or time.monotonic() > deadline:
                raise DatabaseError(f"cannot open database {path}: {one_line(e)}") from None
            time.sleep(0.05 + 0.1 * random.random())
        except sqlite3.Error as e:
            raise DatabaseError(f"cannot open database {path}: {one_line(e)}") from None


def _connect(path: str, fresh: bool, version: int) -> sqlite3.Connection:
    """One try at connecting, in WAL mode, with the schema (created or upgraded in place)."""
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        if fresh:
            conn.execute("BEGIN IMMEDIATE")
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            conn.execute("COMMIT")
        elif version == 1:  # upgrade in place: one column, every old record measured once
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == "1":
                # (not upgraded by another process since this one looked)
                conn.execute("ALTER TABLE records ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1")
                conn.execute(SCHEMA[SCHEMA.index("CREATE TABLE IF NOT EXISTS claims"):].rstrip().rstrip(";"))
                conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
    except BaseException:
        conn.close()
        raise
    return conn


def _open_read_only(p: Path, path: str) -> sqlite3.Connection:
    if not p.exists():
        raise DatabaseError(f"no database at {path}")
    with open(p, "rb") as f:
        if f.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise DatabaseError(f"not a stormdrop database: {path}")
    empty, version = _check_existing(p, path, read_only=True)
    if empty:
        raise DatabaseError(f"not a stormdrop database (no tables): {path}")
    if version != SCHEMA_VERSION:
        raise DatabaseError(f"database {path} has schema version {version}: a tune with this --db upgrades it")
    try:
        return _connect_read_only(p, timeout=60.0, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {one_line(e)}") from None


def _connect_read_only(p: Path, **kw: Any) -> sqlite3.Connection:
    """A connection that writes nothing, not even beside the file. Without a ``-wal`` file (no
    tuner has the database open), ``immutable=1``: SQLite's ``mode=ro`` on a WAL database leaves
    ``-wal`` and ``-shm`` files behind, and cannot open it where the directory is read-only.
    With one, ``mode=ro``, so that the writer's last commits are read, then ``immutable=1`` if
    that cannot open (a read-only mount after a crash: the records up to the last checkpoint)."""
    base = "file:" + urllib.parse.quote(str(p.resolve()))
    if not Path(str(p) + "-wal").exists():
        return sqlite3.connect(base + "?immutable=1", uri=True, **kw)
    try:
        conn = sqlite3.connect(base + "?mode=ro", uri=True, **kw)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        return sqlite3.connect(base + "?immutable=1", uri=True, **kw)


def _check_existing(p: Path, path: str, read_only: bool = False) -> tuple[bool, int]:
    """Validate an existing SQLite file read-only: (whether it holds no tables yet, its schema version).
    ``read_only``: with a connection that leaves nothing beside the file (``_connect_read_only``)."""
    uri = "file:" + urllib.parse.quote(str(p.resolve())) + "?mode=ro"
    try:
        conn = _connect_read_only(p, timeout=60.0) if read_only else sqlite3.connect(uri, uri=True, timeout=60.0)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {one_line(e)}") from None
    try:
        tables = {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        if not tables:
            return True, SCHEMA_VERSION
        if not {"meta", "workloads", "records"} <= tables:
            raise DatabaseError(f"not a stormdrop database (missing tables): {path}")
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or row[0] not in (str(SCHEMA_VERSION), "1"):
            found = "none" if row is None else row[0]
            raise DatabaseError(
                f"database {path} has schema version {found}, expected {SCHEMA_VERSION}"
            )
        return False, int(row[0])
    except sqlite3.Error as e:
        raise DatabaseError(f"corrupt database {path}: {one_line(e)}") from None
    finally:
        conn.close()
