"""Tests of the SQLite tuning database (no measuring)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
import tvm_ffi
from dbutil import SECS, TARGET, TARGET_KEY, args_info_json, fill, make_record, matmul_mod
from tvm.target import Target

from stormdrop.errors import DatabaseError
from stormdrop.records import ErrorKind, MeasureResult, Phase
from stormdrop.report.tables import format_best_table
from stormdrop.storage._schema import SCHEMA_VERSION
from stormdrop.storage.database import (
    Database,
    candidate_key,
    canonical_target,
)


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


def _assert_refused_untouched(path: Path, sql: str, match: str) -> None:
    """After ``sql`` runs on the file, opening it is refused and leaves the file as it was."""
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match=match):
        Database(path)
    assert path.read_bytes() == before


def test_wrong_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "v.db"
    Database(path).close()
    _assert_refused_untouched(
        path, "UPDATE meta SET value='99' WHERE key='schema_version'", "schema version 99"
    )


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
    _assert_refused_untouched(tmp_path / "f.db", "CREATE TABLE x (a)", "not a stormdrop database")


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
                MeasureResult.failure(ErrorKind.RUN_TIMEOUT),
            )
        )
        db.commit_workload(matmul_mod(32), name="never_measured", op_class="matmul", flops=1)
        text = format_best_table(db)
    lines = text.splitlines()
    assert lines[0] == f"Target: {TARGET_KEY}"
    assert [c.strip() for c in lines[1].split("|")] == [
        "ID", "Name", "FLOP", "Weight", "Speed (GFLOPS)", "Latency (us)", "Trials", "Failed", "To retry",
        "Done"
    ]  # fmt: skip
    row = [c.strip() for c in lines[3].split("|")]
    lat_us = 1.5 * 2**-12 * 1e6
    assert row[:4] == [str(wid), "matmul_128", str(2 * 128**3), "1"]
    assert float(row[5]) == pytest.approx(lat_us, abs=1e-3)
    assert float(row[4]) == pytest.approx(2 * 128**3 / lat_us / 1e3, rel=1e-4)
    assert row[6:] == ["4", "1", "0", "Y"]  # a build error is final
    row2 = [c.strip() for c in lines[4].split("|")]
    assert row2[1] == "mm64" and row2[4:9] == ["N/A", "N/A", "1", "0", "1"]  # a run timeout is retried
    assert "never_measured" not in text and "Total trials: 5" in text


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE workloads (workload_id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
    op_class TEXT NOT NULL, flops INTEGER NOT NULL, shash TEXT NOT NULL, mod_json TEXT NOT NULL);
CREATE TABLE records (record_id INTEGER PRIMARY KEY AUTOINCREMENT,
    workload_id INTEGER NOT NULL REFERENCES workloads (workload_id), target TEXT NOT NULL,
    candidate_key TEXT NOT NULL, trace_json TEXT NOT NULL, args_info_json TEXT NOT NULL, run_secs TEXT,
    mean_secs REAL, error TEXT, error_msg TEXT NOT NULL, phase TEXT NOT NULL, measured_at REAL NOT NULL,
    versions TEXT NOT NULL, UNIQUE (workload_id, target, candidate_key));
INSERT INTO meta VALUES ('schema_version', '1');
"""


def test_a_version_1_database_is_upgraded_in_place(tmp_path: Path, mod, traces) -> None:
    """Version 1 had no attempts column: opening it adds the column, its records count one attempt."""
    path = tmp_path / "v1.db"
    with Database(tmp_path / "src.db") as src:
        wid, stored = fill(src, mod, traces)
        rows = src._query("SELECT * FROM records ORDER BY record_id")
        wl = src._query("SELECT * FROM workloads")
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.executemany("INSERT INTO workloads VALUES (?, ?, ?, ?, ?, ?)", wl)
    conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [r[:13] for r in rows])
    conn.commit()
    conn.close()
    with Database(path) as db:
        got = db.records(wid)
        assert got == stored and all(r.attempts == 1 for r in got)
        assert db._query("SELECT value FROM meta WHERE key='schema_version'") == [(str(SCHEMA_VERSION),)]


def test_a_dead_owners_claims_lapse_and_a_live_ones_hold(tmp_path: Path) -> None:
    """Claims (concurrent tuners): a candidate claimed by a live tuner is not handed out; one held by a
    process of this host that no longer exists, or by another host's tuner silent for longer than
    CLAIM_STALE_S, is taken over at once; a measured candidate is never handed out again."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from stormdrop.storage._claims import CLAIM_STALE_S

    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that no longer runs
    with Database(tmp_path / "c.db") as db:
        wid = db.commit_workload(matmul_mod(), name="mm", op_class="matmul", flops=1).workload_id
        owners = {"live": f"{host}:{os.getpid()}:a", "dead": f"{host}:{dead.pid}:b",
                  "remote-fresh": "elsewhere:1:c", "remote-silent": "elsewhere:2:d"}
        for name, owner in owners.items():
            assert db.claim(wid, TARGET_KEY, [name], owner) == set()
        with db.transaction():  # the silent tuner was last heard of longer ago than CLAIM_STALE_S
            db._query("UPDATE claims SET heartbeat=? WHERE owner=?", (time.time() - CLAIM_STALE_S - 1,
                                                                      owners["remote-silent"]))
        me = f"{host}:{os.getpid()}:me"
        assert db.claim(wid, TARGET_KEY, list(owners), me) == {"live", "remote-fresh"}
        held = dict(db._query("SELECT candidate_key, owner FROM claims"))
        assert held == {"live": owners["live"], "remote-fresh": owners["remote-fresh"], "dead": me,
                        "remote-silent": me}
        db.commit_record(replace(make_record(wid, matmul_mod(), "t", MeasureResult(run_secs=SECS[0])),
                                 candidate_key="dead"))
        db.release(wid, TARGET_KEY, "dead", me)
        assert db.claim(wid, TARGET_KEY, ["dead"], owners["live"]) == {"dead"}  # measured: its record is the result


def _open_and_write(path: str, barrier, errors) -> None:
    barrier.wait()
    try:
        with Database(path) as db:
            for i in range(5):
                db.note_model(f"m{i}", {"i": i})
    except Exception as err:  # noqa: BLE001 - reported to the test
        errors.put(str(err))


@pytest.mark.slow
def test_tuners_that_open_a_new_database_at_the_same_moment_all_open_it(tmp_path: Path) -> None:
    """Four processes open one new database file at the same instant and write to it, again and
    again (40 files): every one opens it (SQLite answered "database is locked" to some, at once,
    without waiting: 2 of 32 opens here before the retry)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for round_ in range(40):
        path, barrier = str(tmp_path / f"new{round_}.db"), ctx.Barrier(4)
        procs = [ctx.Process(target=_open_and_write, args=(path, barrier, errors)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
        assert [p.exitcode for p in procs] == [0] * 4
    got = []
    while not errors.empty():
        got.append(errors.get())
    assert got == []


def test_a_live_owners_claims_are_kept_fresh_without_commits(tmp_path: Path, monkeypatch) -> None:
    """The heartbeat is refreshed on a timer, not only when a record is committed: an owner on
    another host that claimed and then spent longer than CLAIM_STALE_S in a build or a wait
    (the clock moved on by 400 s) still holds its claims; after its database is closed the
    refreshing stops."""
    import time

    from stormdrop.storage import _claims

    monkeypatch.setattr(_claims, "HEARTBEAT_S", 0.05)
    clock = [time.time()]
    monkeypatch.setattr(_claims.time, "time", lambda: clock[0])
    path = tmp_path / "c.db"
    busy = "elsewhere:7:busy"
    with Database(path) as db:
        wid = db.commit_workload(matmul_mod(), name="mm", op_class="matmul", flops=1).workload_id
        assert db.claim(wid, TARGET_KEY, ["k"], busy) == set()
        clock[0] += 400.0  # the owner builds, waits, commits nothing
        deadline = time.monotonic() + 10
        while db._query("SELECT heartbeat FROM claims")[0][0] < clock[0] and time.monotonic() < deadline:
            time.sleep(0.02)
        with Database(path) as other:
            assert other.claim(wid, TARGET_KEY, ["k"], "elsewhere:8:other") == {"k"}  # still held
    clock[0] += 400.0
    time.sleep(0.3)  # closed: no refresh
    with Database(path) as other:
        assert other.claim(wid, TARGET_KEY, ["k"], "elsewhere:8:other") == set()  # lapsed, taken over


def test_a_forked_process_is_an_owner_of_its_own() -> None:
    import os

    from stormdrop.tuning.evaluation import owner

    me = owner()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.write(write, owner().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    assert me == owner() and child != me and child.split(":")[1] == str(pid)


def test_equal_kernels_whose_blocks_are_named_apart_are_two_workloads(tmp_path: Path) -> None:
    """Structural equality leaves block names out, but a stored trace finds its blocks by name (a
    global mean over ``lv235`` in one model and ``lv397`` in another): such kernels are two
    workloads, so neither is handed records that do not replay on it."""
    from tvm import te

    def mean(name: str) -> tvm.IRModule:
        a = te.placeholder((1, 7, 7, 64), name=name)
        r, s = te.reduce_axis((0, 7), "r"), te.reduce_axis((0, 7), "s")
        red = te.compute((1, 64), lambda n, c: te.sum(a[n, r, s, c], axis=[r, s]), name=f"{name}_red")
        out = te.compute((1, 64), lambda n, c: red[n, c] / 49.0, name="T_divide")
        return tvm.IRModule({"main": te.create_prim_func([a, out])})

    one, other = mean("lv235"), mean("lv397")
    assert tvm_ffi.structural_equal(one, other)  # equal as far as TVM's equality goes
    with Database(tmp_path / "n.db") as db:
        first = db.commit_workload(one, name="mean_a", op_class="mean", flops=1)
        assert db.find_workload(other) is None
        second = db.commit_workload(other, name="mean_b", op_class="mean", flops=1)
        assert second.workload_id != first.workload_id
        assert db.find_workload(one).workload_id == first.workload_id
        assert db.find_workload(mean("lv235")).workload_id == first.workload_id
