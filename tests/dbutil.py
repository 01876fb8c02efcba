"""Shared fixtures and helpers of the database tests: a matmul workload, its traces, records."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import te
from tvm.target import Target

from stormdrop.records import ErrorKind, MeasureResult, Phase, Record
from stormdrop.storage.database import Database, candidate_key, canonical_target
from stormdrop.tvm_compat.trace_json import to_py

TARGET = Target({"kind": "llvm", "num-cores": 2})
TARGET_KEY = canonical_target(TARGET)
# dyadic times are exact in MetaSchedule's float32 run_secs too
SECS = [(2**-10, 2**-10), (2**-12, 2**-11), (2**-9,)]


def matmul_mod(n: int = 128) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def args_info_json(mod: tvm.IRModule) -> str:
    infos = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    return json.dumps([to_py(a.as_json()) for a in infos])


def make_record(wid: int, mod, trace: str, result: MeasureResult, at: float = 1.0) -> Record:
    return Record(
        workload_id=wid,
        target=TARGET_KEY,
        candidate_key=candidate_key(trace),
        trace_json=trace,
        args_info_json=args_info_json(mod),
        result=result,
        phase=Phase.STORM,
        measured_at=at,
        versions="tvm=0.27.0",
    )


def fill(db: Database, mod, traces: list[str]) -> tuple[int, list[Record]]:
    """One workload with 3 valid records and 1 failure; returns (workload_id, stored)."""
    wid = db.commit_workload(
        mod, name="matmul_128", op_class="matmul", flops=2 * 128**3
    ).workload_id
    stored = [
        db.commit_record(make_record(wid, mod, t, MeasureResult(run_secs=s), at=float(i)))
        for i, (t, s) in enumerate(zip(traces, SECS, strict=False))
    ]
    fail = make_record(
        wid, mod, traces[0] + " ", MeasureResult.failure(ErrorKind.BUILD_ERROR, "boom"), at=9.0
    )
    stored.append(db.commit_record(fail))
    return wid, stored


def dump(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


SPEC = "matmul:M=64,N=64,K=64"  # the end-to-end tests' tiny kernel


def stormdrop_cli(*args, timeout=600):
    """``python -m stormdrop ARGS``, its output captured."""
    return subprocess.run([sys.executable, "-m", "stormdrop", *args], capture_output=True, text=True,
                          timeout=timeout)


def stored_rows(db_path):
    """Every row of a database's records table, in order."""
    with sqlite3.connect(db_path) as con:
        table = [t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                 if "record" in t][0]
        return con.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()


def one_record_exported(tmp_path: Path, mod, traces) -> tuple[Path, Path, list[str]]:
    """A database with one record, its MetaSchedule export and the database's dump."""
    from stormdrop.storage.metaschedule import export_metaschedule

    path = tmp_path / "keep.db"
    with Database(path) as db:
        fill(db, mod, traces[:1])
        good = tmp_path / "good"
        export_metaschedule(db, str(good))
    return path, good, dump(path)


class ScriptedGateway:
    """A gateway that answers from a script of results (no build, no run)."""

    def __init__(self, results):
        self.results, self.calls, self.batches = list(results), 0, []

    def prepare(self, key, mod, seed=0):
        pass

    def measure(self, key, mods, on_result=None):
        self.batches.append(len(mods))
        out = []
        for i, _ in enumerate(mods):
            self.calls += 1
            r = self.results.pop(0)
            out.append(r)
            if on_result is not None:
                on_result(i, r)
        return out
