"""The record store interfaces (storage.store): one conformance test of the read side run against
every implementation (a writable database, its read-only view, the schedule hub), and of the write
side against the database, whose read-only view refuses every write and leaves the file as it was."""

from __future__ import annotations

import hashlib

import pytest
from dbutil import fill, make_record, matmul_mod
from tvm.target import Target

from stormdrop.errors import DatabaseError
from stormdrop.records import MeasureResult
from stormdrop.storage import hub
from stormdrop.storage.database import Database, canonical_target
from stormdrop.storage.hub_writer import write_hub
from stormdrop.storage.store import RecordSource, RecordStore

AVX512 = canonical_target(Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}))


@pytest.fixture
def stored(tmp_path, mod, traces):
    """A database with one matmul (3 valid records, 1 failure) measured on an AVX-512 target."""
    path = tmp_path / "s.db"
    with Database(path) as db:
        wid, recs = fill(db, mod, traces)
        with db.transaction():
            db._c().execute("UPDATE records SET target=?", (AVX512,))
    return path, [r for r in recs]


@pytest.fixture(params=["database", "read_only", "hub"])
def source(request, stored, tmp_path):
    """(an implementation of RecordSource, the target key its records are on)."""
    path, _ = stored
    if request.param == "database":
        store = Database(path)
    elif request.param == "read_only":
        store = Database(path, read_only=True)
    else:
        with Database(path, read_only=True) as db:
            write_hub(db, tmp_path / "h.jsonl.gz", "x86-avx512")
        store = hub.HubDatabase(tmp_path / "h.jsonl.gz", AVX512)
    yield request.param, store
    store.close()


def test_every_record_source_reads_alike(source, stored, mod):
    kind, store = source
    _, recs = stored
    assert isinstance(store, RecordSource)
    assert store.exact_only == (kind == "hub")
    entry = store.find_workload(mod)
    assert entry is not None and (entry.name, entry.op_class, entry.flops) == ("matmul_128", "matmul", 2 * 128**3)
    assert store.find_workload(matmul_mod(64)) is None  # another shape: not this workload
    assert store.workloads(lambda op_class: op_class != "matmul") == []  # those of other classes only: none
    assert [w.workload_id for w in store.workloads(lambda op_class: op_class == "matmul")] == [entry.workload_id]
    assert [w.workload_id for w in store.workloads()] == [entry.workload_id]
    valid = sorted((r for r in recs if r.ok), key=lambda r: (r.result.mean, r.record_id))
    # best: valid records only, fastest first, at most k
    assert [r.trace_json for r in store.best(entry.workload_id, AVX512, k=2)] == [r.trace_json for r in valid[:2]]
    assert [r.trace_json for r in store.best(entry.workload_id, AVX512, k=10)] == [r.trace_json for r in valid]
    assert store.best(entry.workload_id, "another target") == []
    # lookup: by candidate key, on the target; None when never measured
    for r in valid:
        found = store.lookup(entry.workload_id, AVX512, r.candidate_key)
        assert found is not None and found.trace_json == r.trace_json and found.result.mean == r.result.mean
    assert store.lookup(entry.workload_id, AVX512, "0" * 40) is None
    # records, targets, count agree with each other
    listed = store.records(entry.workload_id, AVX512)
    assert {r.candidate_key for r in valid} <= {r.candidate_key for r in listed}
    assert store.targets(entry.workload_id) == [AVX512]
    assert store.count(entry.workload_id, AVX512) == len(listed) == (3 if kind == "hub" else 4)  # a hub: valid only


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_database_is_a_record_store_and_its_read_only_view_refuses_writes(stored, mod, traces):
    path, recs = stored
    with Database(path) as db:
        assert isinstance(db, RecordStore)
        wid = db.find_workload(mod).workload_id
        rec = make_record(wid, mod, traces[0] + "  ", MeasureResult(run_secs=(2**-8,)))
        again, new = db.commit_record_new(rec)
        assert new and db.commit_record_new(rec) == (again, False)  # a duplicate returns the stored one
        assert db.claim(wid, AVX512, ["k1", "k2"], "elsewhere:1:x") == set()  # nothing to leave to others
        assert db.claimed(wid, AVX512, "k1")
        assert db.claim(wid, AVX512, ["k1", "k3"], "elsewhere:2:y") == {"k1"}  # held by a live owner
        db.release(wid, AVX512, "k1", "elsewhere:1:x")
        assert not db.claimed(wid, AVX512, "k1")
    before = _digest(path)
    with Database(path, read_only=True) as view:
        entry = view.find_workload(mod)
        writes = [lambda: view.commit_workload(matmul_mod(32), name="m", op_class="matmul", flops=1),
                  lambda: view.commit_record(make_record(entry.workload_id, mod, traces[1] + " ",
                                                         MeasureResult(run_secs=(1e-3,)))),
                  lambda: view.note_model("net", {"target": AVX512})]
        for write in writes:
            with pytest.raises(DatabaseError):
                write()
    assert _digest(path) == before
