"""Adapters between a stormdrop ``Database`` and MetaSchedule's JSON database directory.

A MetaSchedule JSON database is two files in one directory: ``database_workload.json``
(one workload a line) and ``database_tuning_record.json`` (one record a line).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.errors import DatabaseError, one_line
from stormdrop.records import IMPORTED, ErrorKind, MeasureResult, Phase, Record
from stormdrop.storage.database import Database, WorkloadEntry, candidate_key, canonical_target
from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics
from stormdrop.tvm_compat.trace_json import (
    check_trace_json,
    check_workload_json,
    schedule_from_trace_json,
    to_py,
    trace_to_json,
)

logger = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
_MS_FAILURE_SECS = 1e9  # MetaSchedule stores a failed run as run_secs=[1e10]


def _target_kind(target_text: str) -> str:
    try:
        kind = json.loads(target_text).get("kind", "llvm")
    except (ValueError, AttributeError):
        return "llvm"
    return str(kind)


def _args_info(text: str, mod: tvm.IRModule) -> list[Any]:
    """Rebuild ``ArgInfo`` objects from stored JSON, or derive them from the module."""
    try:
        return [ms.arg_info.ArgInfo.from_json(x) for x in json.loads(text)]
    except Exception:  # old/empty args_info: derive it
        return list(ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True))


def export_metaschedule(db: Database, out_dir: str, *, target: str | None = None,
                        progress: Callable[[str], None] | None = None, scratch: str | None = None) -> int:
    """Write every valid record (optionally of one target) as a MetaSchedule JSON database.
    ``progress``: told each record before TVM replays it (``isolated``). ``scratch``: the name of
    the folder in ``out_dir`` the files are written in first (default: a fresh temporary name), for
    a caller that removes it when this process is killed.

    Every workload is written; failed records are skipped. Existing database files in
    ``out_dir`` are replaced (the new files are written aside and moved in at the end).
    Returns the number of records written.
    """
    want = None if target is None else canonical_target(target)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        if scratch:
            (tmp := out / scratch).mkdir()
        else:
            tmp = Path(tempfile.mkdtemp(prefix=".stormdrop-export-", dir=out))
    except OSError as e:
        raise DatabaseError(
            f"cannot write MetaSchedule database {out_dir}: {one_line(e)}"
        ) from None
    written = 0
    try:
        jdb = ms.database.JSONDatabase(work_dir=str(tmp))
        targets: dict[str, tvm.target.Target] = {}
        for wl in db.workloads():
            ms_wl = jdb.commit_workload(wl.mod)
            for rec in db.records(wl.workload_id, want):
                if not rec.ok or not rec.result.run_secs:
                    continue
                if progress:
                    progress(f"{db.path} record {rec.record_id}")
                try:  # a stale trace or a damaged row must not stop the export
                    if rec.target not in targets:
                        load_tensor_intrinsics(_target_kind(rec.target))
                        targets[rec.target] = tvm.target.Target(json.loads(rec.target))
                    trace = schedule_from_trace_json(wl.mod, rec.trace_json).trace
                    ms_rec = ms.database.TuningRecord(trace, ms_wl, run_secs=[float(x) for x in rec.result.run_secs],
                                                      target=targets[rec.target],
                                                      args_info=_args_info(rec.args_info_json, wl.mod))
                except Exception as e:  # noqa: BLE001 - TVM raises assorted errors
                    logger.warning("skipping record %s of %s: %s", rec.record_id, wl.name, one_line(e))
                    continue
                jdb.commit_tuning_record(ms_rec)
                written += 1
        del jdb
        for name in (WORKLOAD_FILE, RECORD_FILE):
            os.replace(tmp / name, out / name)
    except OSError as e:
        raise DatabaseError(
            f"cannot write MetaSchedule database {out_dir}: {one_line(e)}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return written


def _read_json_lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, [a, b] pair) for every non-empty line of a MetaSchedule JSON file."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatabaseError(f"cannot read {path}: {one_line(e)}") from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's limit
            raise DatabaseError(f"malformed JSON in {path} line {lineno}: {one_line(e)}") from None
        if not isinstance(obj, list) or len(obj) != 2:
            raise DatabaseError(f"malformed MetaSchedule entry in {path} line {lineno}")
        out.append((lineno, obj))
    return out


MIN_RUN_SECS = 1e-9  # no kernel runs in less than a nanosecond: a smaller time is not a measurement


def checked_run_secs(secs: Any) -> tuple[float, ...]:
    """``secs`` as run times (``ValueError`` unless a non-empty list of finite numbers of at least
    ``MIN_RUN_SECS``): what an imported file or a hub may say a kernel took."""
    if not (isinstance(secs, list) and secs and all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s >= MIN_RUN_SECS
            for s in secs)):
        raise ValueError(f"run times {str(secs)[:60]} are not finite times of at least {MIN_RUN_SECS:g} s")
    return tuple(float(s) for s in secs)


def _check_run_secs(rec: Any) -> None:
    """``ValueError`` unless the record ``[trace, run_secs, ...]`` has a non-empty trace and finite
    run times of at least ``MIN_RUN_SECS`` (MetaSchedule's failure marker, 1e9 s and up, included)."""
    if not (isinstance(rec, list) and len(rec) >= 2 and rec[0][0]):
        raise ValueError("an empty trace")
    if rec[1] is not None:
        checked_run_secs(rec[1])


def read_metaschedule(in_dir: str, progress: Callable[[str], None] | None = None) -> list[Any]:
    """The ``TuningRecord``s of a MetaSchedule JSON database directory, in file order.
    ``progress``: told each entry before TVM reads it (``isolated``).

    (``JSONDatabase.get_all_tuning_records`` would return them sorted by time instead.)
    Raises ``DatabaseError`` for a missing directory or file and for malformed content.
    """
    d = Path(in_dir)
    if not d.is_dir():
        raise DatabaseError(f"MetaSchedule database directory not found: {in_dir}")
    path_wl, path_rec = d / WORKLOAD_FILE, d / RECORD_FILE
    for p in (path_wl, path_rec):
        if not p.is_file():
            raise DatabaseError(f"MetaSchedule database file missing: {p}")
    wl_lines = _read_json_lines(path_wl)
    rec_lines = _read_json_lines(path_rec)
    where = path_wl
    try:
        workloads = []
        for lineno, obj in wl_lines:
            where = f"{path_wl} line {lineno}"
            if progress:
                progress(where)
            check_workload_json(obj)
            workloads.append(ms.database.Workload.from_json(obj))
        for lineno, (_, rec) in rec_lines:
            where = f"{path_rec} line {lineno}"
            load_tensor_intrinsics(str(rec[2]["kind"]))
        records = []
        for lineno, (index, rec) in rec_lines:
            where = f"{path_rec} line {lineno}"
            if not isinstance(index, int) or not 0 <= index < len(workloads):
                raise ValueError(f"workload index {index!r} out of range")
            check_trace_json(rec[0] if isinstance(rec, list) and rec else None)
            _check_run_secs(rec)
            if progress:
                progress(where)
            records.append(ms.database.TuningRecord.from_json(rec, workloads[index]))
    except Exception as e:  # TVM raises assorted errors for bad entries
        raise DatabaseError(f"malformed MetaSchedule entry in {where}: {one_line(e)}") from None
    return records


def _flops(mod: tvm.IRModule) -> int:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops

        return int(estimate_tir_flops(mod))
    except Exception:  # FLOPs are informative only
        return 0


def import_metaschedule(db: Database, in_dir: str) -> int:
    """``import_records`` of the MetaSchedule JSON database directory ``in_dir``."""
    return import_records(db, read_metaschedule(in_dir))


def import_records(db: Database, ms_records: list[Any]) -> int:
    """Import MetaSchedule ``TuningRecord``s (``read_metaschedule``) into ``db`` in one transaction.

    Workloads are named ``imported_<shash>`` (op class ``imported``); MetaSchedule's
    failure marker (run_secs >= 1e9) becomes a ``RUN_ERROR`` record. Returns the number
    of records imported (candidates already in ``db`` are skipped).
    """
    prepared: list[tuple[tvm.IRModule, Record]] = []
    now = time.time()
    for rec in ms_records:
        if rec.target is None:
            logger.warning("skipping a MetaSchedule record without target")
            continue
        mod = rec.workload.mod
        trace_json = trace_to_json(rec.trace)
        secs = [float(x) for x in to_py(list(rec.run_secs or []))]
        if secs and all(s < _MS_FAILURE_SECS for s in secs):
            result = MeasureResult(run_secs=tuple(secs))
        else:
            result = MeasureResult.failure(ErrorKind.RUN_ERROR, "imported failure")
        infos = rec.args_info
        if infos is None:
            infos = ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True)
        record = Record(
            workload_id=-1,
            target=canonical_target(rec.target),
            candidate_key=candidate_key(trace_json),
            trace_json=trace_json,
            args_info_json=json.dumps([to_py(a.as_json()) for a in infos]),
            result=result,
            phase=Phase.STORM,
            measured_at=now,
            versions=f"{IMPORTED}metaschedule tvm={tvm.__version__}",
        )
        prepared.append((mod, record))

    imported = 0
    with db.transaction():
        entries: dict[int, WorkloadEntry] = {}
        for mod, record in prepared:
            key = id(mod)
            if key not in entries:
                entry = db.find_workload(mod)
                if entry is None:
                    entry = db.commit_workload(
                        mod,
                        name=f"imported_{ms.utils.shash2hex(mod)}",
                        op_class="imported",
                        flops=_flops(mod),
                    )
                entries[key] = entry
            _, new = db._commit_record(replace(record, workload_id=entries[key].workload_id))
            imported += int(new)
    return imported
