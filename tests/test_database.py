"""Tests of the SQLite tuning database and its MetaSchedule JSON adapters (no measuring)."""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
import tvm_ffi
from tvm import te
from tvm.target import Target

from stormdrop import _tvm
from stormdrop.database import (
    SCHEMA_VERSION,
    Database,
    candidate_key,
    canonical_target,
    export_metaschedule,
    import_metaschedule,
)
from stormdrop.errors import DatabaseError
from stormdrop.records import ErrorKind, MeasureResult, Phase, Record
from stormdrop.report import format_best_table

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


@pytest.fixture(scope="module")
def mod() -> tvm.IRModule:
    return matmul_mod()


@pytest.fixture(scope="module")
def traces(mod: tvm.IRModule) -> list[str]:
    """Full (post-processed) trace JSON of each design space of the matmul."""
    _tvm.load_tensor_intrinsics("llvm")
    ctx = ms.TuneContext(
        mod,
        target=TARGET,
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        num_threads=1,
    )
    out = []
    for sch in ctx.generate_design_space():
        sch.enter_postproc()
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        out.append(_tvm.trace_to_json(sch.trace))
    assert len(set(out)) >= 3
    return out


def args_info_json(mod: tvm.IRModule) -> str:
    infos = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    return json.dumps([_tvm.to_py(a.as_json()) for a in infos])


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


# -- schema, records ----------------------------------------------------------------------


def test_schema_created(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "tune.db"
    with Database(path) as db:
        assert db.path == str(path)
        assert db.workloads() == []
    assert path.is_file()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


def test_records_roundtrip_best_duplicates(tmp_path: Path, mod, traces) -> None:
    with Database(tmp_path / "t.db") as db:
        wid, stored = fill(db, mod, traces)
        assert [r.record_id for r in stored] == sorted(r.record_id for r in stored)
        got = db.records(wid)
        assert got == stored  # values and measurement order
        assert [r.record_id for r in got] == [r.record_id for r in stored]
        assert got[1].result.run_secs == SECS[1] and got[1].phase is Phase.STORM
        assert got[3].result.error is ErrorKind.BUILD_ERROR and got[3].result.error_msg == "boom"
        assert got[3].result.run_secs is None
        assert db.records(wid, TARGET_KEY) == stored and db.records(wid, "other") == []

        best = db.best(wid, TARGET_KEY, k=10)
        assert [r.record_id for r in best] == [
            stored[1].record_id,
            stored[0].record_id,
            stored[2].record_id,
        ]
        assert all(r.ok for r in best)
        assert db.best(wid, TARGET_KEY)[0].mean == pytest.approx(1.5 * 2**-12)

        dup = make_record(wid, mod, traces[0], MeasureResult(run_secs=(1.0,)), at=99.0)
        again = db.commit_record(dup)
        assert again == stored[0] and again.record_id == stored[0].record_id
        assert db.count(wid, TARGET_KEY) == 4 and db.count(wid, "other") == 0
        assert db.lookup(wid, TARGET_KEY, candidate_key(traces[2])) == stored[2]
        assert db.lookup(wid, TARGET_KEY, "nope") is None
        assert db.targets(wid) == [TARGET_KEY]

        other = canonical_target({"kind": "llvm", "num-cores": 4})
        db.commit_record(replace(stored[0], target=other, record_id=None))
        assert db.targets(wid) == [TARGET_KEY, other]
        with pytest.raises(DatabaseError):
            db.commit_record(make_record(12345, mod, traces[0], MeasureResult(run_secs=(1.0,))))


def test_persistence_and_second_connection(tmp_path: Path, mod, traces) -> None:
    path = tmp_path / "p.db"
    db = Database(path)
    wid, stored = fill(db, mod, traces[:2])
    reader = Database(path)  # a second connection, while the first one stays open
    assert reader.records(wid) == stored
    extra = db.commit_record(make_record(wid, mod, traces[2], MeasureResult(run_secs=(0.5,))))
    assert reader.lookup(wid, TARGET_KEY, extra.candidate_key) == extra
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT COUNT(*) FROM records").fetchone() == (len(stored) + 1,)
    raw.close()
    reader.close()
    db.close()
    with pytest.raises(DatabaseError):
        db.records(wid)
    with Database(path) as db2:
        assert db2.records(wid) == [*stored, extra]
        assert db2.workload(wid).name == "matmul_128"


# -- refusing bad files -------------------------------------------------------------------


def test_wrong_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    Database(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="schema version 99"):
        Database(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("header", [b"", b"SQLite format 3\x00"])
def test_garbage_file(tmp_path: Path, header: bytes) -> None:
    path = tmp_path / "g.db"
    data = header + np.random.default_rng(0).bytes(8192)
    path.write_bytes(data)
    with pytest.raises(DatabaseError) as info:
        Database(path)
    assert "\n" not in str(info.value)
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.db"]


def test_foreign_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "f.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE x (a)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="not a stormdrop database"):
        Database(path)
    assert path.read_bytes() == before


def test_directory_path(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="directory"):
        Database(tmp_path)


# -- workloads ----------------------------------------------------------------------------


def test_commit_workload_idempotent(tmp_path: Path, mod) -> None:
    path = tmp_path / "w.db"
    with Database(path) as db:
        a = db.commit_workload(mod, name="mm", op_class="matmul", flops=7)
        b = db.commit_workload(matmul_mod(), name="other name", op_class="x", flops=1)
        assert b.workload_id == a.workload_id and b.name == "mm"
        c = db.commit_workload(matmul_mod(64), name="mm64", op_class="matmul", flops=3)
        assert c.workload_id != a.workload_id
        assert db.find_workload(matmul_mod(32)) is None
        assert [w.workload_id for w in db.workloads()] == [a.workload_id, c.workload_id]
        assert a.shash == ms.utils.shash2hex(mod)
        with pytest.raises(DatabaseError):
            db.workload(999)
    with Database(path) as db:
        again = db.commit_workload(matmul_mod(), name="mm", op_class="matmul", flops=7)
        assert again == a
        assert tvm_ffi.structural_equal(db.workload(a.workload_id).mod, mod)


def test_canonical_target() -> None:
    key = canonical_target({"kind": "llvm", "num-cores": 2})
    assert key == canonical_target(TARGET) == canonical_target(key)
    assert json.loads(key)["num-cores"] == 2
    assert canonical_target(Target(json.loads(key))) == key


def test_args_info_roundtrip(mod) -> None:
    back = [ms.arg_info.ArgInfo.from_json(x) for x in json.loads(args_info_json(mod))]
    assert [str(x) for x in back] == [
        str(x) for x in ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ]


def test_format_best_table(tmp_path: Path, mod, traces) -> None:
    with Database(tmp_path / "s.db") as db:
        wid, _ = fill(db, mod, traces)
        w2 = db.commit_workload(matmul_mod(64), name="mm64", op_class="matmul", flops=2 * 64**3)
        db.commit_record(
            make_record(
                w2.workload_id,
                matmul_mod(64),
                traces[0],
                MeasureResult.failure(ErrorKind.RUN_ERROR),
            )
        )
        db.commit_workload(matmul_mod(32), name="never_measured", op_class="matmul", flops=1)
        text = format_best_table(db)
    lines = text.splitlines()
    assert lines[0] == f"Target: {TARGET_KEY}"
    assert [c.strip() for c in lines[1].split("|")] == [
        "ID", "Name", "FLOP", "Weight", "Speed (GFLOPS)", "Latency (us)", "Trials", "Done"
    ]  # fmt: skip
    row = [c.strip() for c in lines[3].split("|")]
    lat_us = 1.5 * 2**-12 * 1e6
    assert row[:4] == [str(wid), "matmul_128", str(2 * 128**3), "1"]
    assert float(row[5]) == pytest.approx(lat_us, abs=1e-3)
    assert float(row[4]) == pytest.approx(2 * 128**3 / lat_us / 1e3, rel=1e-4)
    assert row[6:] == ["4", "Y"]
    row2 = [c.strip() for c in lines[4].split("|")]
    assert row2[1] == "mm64" and row2[4:7] == ["N/A", "N/A", "1"]
    assert "never_measured" not in text and "Total trials: 5" in text


# -- MetaSchedule adapters ----------------------------------------------------------------


def test_export_compile_tir(tmp_path: Path, mod, traces) -> None:
    with Database(tmp_path / "e.db") as db:
        fill(db, mod, traces)
        out = tmp_path / "ms_out"
        n = export_metaschedule(db, str(out))
        assert n == 3
        assert sorted(p.name for p in out.iterdir()) == [
            "database_tuning_record.json",
            "database_workload.json",
        ]
        assert export_metaschedule(db, str(out), target=TARGET_KEY) == 3  # replaces, no dups
        assert export_metaschedule(db, str(tmp_path / "none"), target=canonical_target("llvm")) == 0
    jdb = ms.database.JSONDatabase(work_dir=str(out))
    assert len(jdb) == n
    top = jdb.get_top_k(jdb.commit_workload(mod), 1)
    assert [float(x) for x in top[0].run_secs] == list(SECS[1])
    sch = ms.tir_integration.compile_tir(jdb, mod, TARGET)
    assert isinstance(sch, tvm.s_tir.Schedule)
    assert _tvm.trace_to_json(sch.trace) == traces[1]
    ex = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cpu()
    rng = np.random.default_rng(1)
    a_np, b_np = (rng.random((128, 128), dtype=np.float32) for _ in range(2))
    a, b = tvm.runtime.tensor(a_np, dev), tvm.runtime.tensor(b_np, dev)
    c = tvm.runtime.empty((128, 128), "float32", dev)
    ex["main"](a, b, c)
    np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-4, atol=1e-4)


def test_export_import_roundtrip(tmp_path: Path, mod, traces) -> None:
    with Database(tmp_path / "src.db") as src:
        wid, stored = fill(src, mod, traces)
        export_metaschedule(src, str(tmp_path / "ms"))
        src_best = src.best(wid, TARGET_KEY, 10)
    with Database(tmp_path / "dst.db") as dst:
        assert import_metaschedule(dst, str(tmp_path / "ms")) == 3
        assert import_metaschedule(dst, str(tmp_path / "ms")) == 0  # duplicates skipped
        (wl,) = dst.workloads()
        assert wl.name == f"imported_{ms.utils.shash2hex(mod)}" and wl.op_class == "imported"
        assert wl.flops == 2 * 128**3
        got = dst.records(wl.workload_id, TARGET_KEY)
        assert len([r for r in got if r.ok]) == len([r for r in stored if r.ok]) == 3
        best = dst.best(wl.workload_id, TARGET_KEY, 10)
        assert best[0].mean == src_best[0].mean
        assert [r.trace_json for r in best] == [r.trace_json for r in src_best]
        assert all(r.candidate_key == candidate_key(r.trace_json) for r in got)
        assert all(r.phase is Phase.STORM for r in got)
        assert got[0].args_info_json == stored[0].args_info_json


def test_import_failure_marker(tmp_path: Path, mod, traces) -> None:
    out = tmp_path / "ms"
    out.mkdir()
    jdb = ms.database.JSONDatabase(work_dir=str(out))
    wl = jdb.commit_workload(mod)
    infos = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    for t, secs in zip(traces[:2], ([1e10], [2**-10]), strict=True):
        trace = _tvm.schedule_from_trace_json(mod, t).trace
        jdb.commit_tuning_record(ms.database.TuningRecord(trace, wl, secs, TARGET, infos))
    with Database(tmp_path / "d.db") as db:
        assert import_metaschedule(db, str(out)) == 2
        (entry,) = db.workloads()
        recs = db.records(entry.workload_id)
        assert not recs[0].ok and recs[0].result.error is ErrorKind.RUN_ERROR
        assert recs[1].result.run_secs == (2**-10,)
        assert db.best(entry.workload_id, TARGET_KEY) == [recs[1]]


def test_import_bad_dirs_leave_db_unchanged(tmp_path: Path, mod, traces) -> None:
    path = tmp_path / "keep.db"
    with Database(path) as db:
        fill(db, mod, traces[:1])
        good = tmp_path / "good"
        export_metaschedule(db, str(good))
    before = dump(path)
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "database_workload.json").write_text("garbage{\n")
    (bad_json / "database_tuning_record.json").write_text("")
    bad_index = tmp_path / "bad_index"
    bad_index.mkdir()
    (bad_index / "database_workload.json").write_text("")
    (bad_index / "database_tuning_record.json").write_text(
        (good / "database_tuning_record.json").read_text()
    )
    half = tmp_path / "half"
    half.mkdir()
    (half / "database_workload.json").write_text("")
    with Database(path) as db:
        for d in (tmp_path / "missing", half, bad_json, bad_index):
            with pytest.raises(DatabaseError) as info:
                import_metaschedule(db, str(d))
            assert "\n" not in str(info.value)
    assert not (half / "database_tuning_record.json").exists()
    assert dump(path) == before


def test_import_is_one_transaction(tmp_path: Path, mod, traces, monkeypatch) -> None:
    with Database(tmp_path / "src.db") as src:
        fill(src, mod, traces)
        export_metaschedule(src, str(tmp_path / "ms"))
    path = tmp_path / "dst.db"
    with Database(path) as dst:
        dst.commit_workload(matmul_mod(64), name="mm64", op_class="matmul", flops=1)
        before = dump(path)
        real = dst._commit_record
        calls = []

        def flaky(record):
            calls.append(record)
            if len(calls) == 2:
                raise DatabaseError("disk on fire")
            return real(record)

        monkeypatch.setattr(dst, "_commit_record", flaky)
        with pytest.raises(DatabaseError, match="disk on fire"):
            import_metaschedule(dst, str(tmp_path / "ms"))
        assert dump(path) == before
        assert [w.name for w in dst.workloads()] == ["mm64"]
        monkeypatch.setattr(dst, "_commit_record", real)
        assert import_metaschedule(dst, str(tmp_path / "ms")) == 3
    assert os.path.getsize(path) > 0
