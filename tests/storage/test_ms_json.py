"""Tests of the MetaSchedule JSON database adapters: export, compile_tir, import (no measuring)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from dbutil import SECS, TARGET, TARGET_KEY, dump, fill, matmul_mod, one_record_exported

from stormdrop.errors import DatabaseError
from stormdrop.records import ErrorKind, Phase
from stormdrop.storage.database import Database, candidate_key, canonical_target
from stormdrop.storage.metaschedule import export_metaschedule, import_metaschedule
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json, trace_to_json


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
    assert trace_to_json(sch.trace) == traces[1]
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
        trace = schedule_from_trace_json(mod, t).trace
        jdb.commit_tuning_record(ms.database.TuningRecord(trace, wl, secs, TARGET, infos))
    with Database(tmp_path / "d.db") as db:
        assert import_metaschedule(db, str(out)) == 2
        (entry,) = db.workloads()
        recs = db.records(entry.workload_id)
        assert not recs[0].ok and recs[0].result.error is ErrorKind.RUN_ERROR
        assert recs[1].result.run_secs == (2**-10,)
        assert db.best(entry.workload_id, TARGET_KEY) == [recs[1]]


def test_import_bad_dirs_leave_db_unchanged(tmp_path: Path, mod, traces) -> None:
    path, good, before = one_record_exported(tmp_path, mod, traces)
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


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", ["unknown_instruction", "truncated_trace", "wrong_block"])
def test_a_malformed_trace_in_an_imported_file_is_refused_with_one_line(tmp_path: Path, mod, traces,
                                                                         corrupt, capsys) -> None:
    import json

    from stormdrop.cli.main import main

    path, good, before = one_record_exported(tmp_path, mod, traces)
    index, rec = json.loads((good / "database_tuning_record.json").read_text().splitlines()[0])
    insts = rec[0][0]
    if corrupt == "unknown_instruction":
        insts[0][0] = "NoSuchInstruction"
    elif corrupt == "truncated_trace":
        rec[0] = [insts[: len(insts) // 2][1:], rec[0][1]]  # inputs refer to outputs that never existed
    else:
        get = next(i for i in insts if i[0] == "GetSBlock" or i[0] == "GetBlock")
        get[2][0] = "no_such_block"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "database_workload.json").write_text((good / "database_workload.json").read_text())
    (bad / "database_tuning_record.json").write_text(json.dumps([index, rec]) + "\n")
    with Database(path) as db:
        with pytest.raises(DatabaseError) as info:
            import_metaschedule(db, str(bad))
    assert "\n" not in str(info.value) and "line 1" in str(info.value)
    capsys.readouterr()
    assert main(["import", str(bad), "--db", str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and "Traceback" not in out.err
    assert dump(path) == before
