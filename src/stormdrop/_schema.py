"""The SQLite storage format: schema (versioned), column lists, row -> Record."""

from __future__ import annotations

import json

from .records import ErrorKind, MeasureResult, Phase, Record

SCHEMA_VERSION = 1

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
    UNIQUE (workload_id, target, candidate_key)
);
CREATE INDEX IF NOT EXISTS records_wl_target_mean ON records (workload_id, target, mean_secs);
"""

RECORD_COLS = (
    "record_id, workload_id, target, candidate_key, trace_json, args_info_json, "
    "run_secs, error, error_msg, phase, measured_at, versions"
)
WORKLOAD_COLS = "workload_id, name, op_class, flops, shash, mod_json"


def record_from_row(row: tuple) -> Record:
    (rid, wid, target, key, trace_json, args_json, run_secs, error, error_msg, phase, at, ver) = row
    if error is None:
        result = MeasureResult(run_secs=tuple(float(x) for x in json.loads(run_secs or "[]")))
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
    )
