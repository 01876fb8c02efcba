"""The schedule hub (storage.hub): which hub a target reads, a hub written from a database and read
back as a read-only donor keyed to the run's target, malformed hubs refused with one error, and a
tune that starts from the hub's schedule of the same workload."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from dataclasses import replace

import pytest
from dbutil import SPEC, fill, make_record, matmul_mod, stormdrop_cli
from tvm.target import Target

from stormdrop.cli.main import main
from stormdrop.errors import DatabaseError
from stormdrop.records import MeasureResult, Phase
from stormdrop.search.options import SearchOptions
from stormdrop.search.storm import StormConfig
from stormdrop.storage import hub
from stormdrop.storage.database import Database, canonical_target
from stormdrop.storage.hub_writer import write_hub
from stormdrop.storage.identity import same_workload
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions
from stormdrop.workloads import parameter_shapes

AVX512 = canonical_target(Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}))
ZEN4 = canonical_target(Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 8}))


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("target, isa", [
    ({"kind": "llvm", "mcpu": "skylake-avx512"}, "x86-avx512"),
    ({"kind": "llvm", "mcpu": "znver4"}, "x86-avx512"),
    ({"kind": "llvm", "mcpu": "haswell"}, "x86-avx2"),
    ({"kind": "llvm", "mcpu": "znver2"}, "x86-avx2"),
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-v1"}, "aarch64"),
    ({"kind": "cuda", "arch": "sm_90"}, "cuda-sm_90"),
    ({"kind": "llvm", "mcpu": "x86-64"}, None),
    ({"kind": "c"}, None),
])
def test_a_targets_isa_class(target, isa):
    assert hub.isa_class(Target(target)) == isa
    assert hub.isa_class(canonical_target(Target(target))) == isa


def test_which_hub_a_run_reads(tmp_path, monkeypatch):
    target = Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(hub, "SHIPPED_DIR", shipped)
    monkeypatch.delenv("STORMDROP_HUB", raising=False)
    assert hub.hub_path(target) is None  # no hub shipped for the class
    (shipped / "x86-avx512.jsonl.gz").write_bytes(b"")
    assert hub.hub_path(target) == shipped / "x86-avx512.jsonl.gz"
    assert hub.hub_path(Target({"kind": "llvm", "mcpu": "haswell"})) is None
    assert hub.hub_path(target, False) is None
    assert str(hub.hub_path(target, "/some/hub.jsonl.gz")) == "/some/hub.jsonl.gz"
    monkeypatch.setenv("STORMDROP_HUB", "off")
    assert hub.hub_path(target) is None
    monkeypatch.setenv("STORMDROP_HUB", "/other.jsonl.gz")
    assert str(hub.hub_path(target)) == "/other.jsonl.gz"
    # only a run that reuses opens a hub
    assert SearchOptions().hub_source is True
    assert SearchOptions(reuse=0).hub_source is False
    assert SearchOptions(phases=(Phase.STORM, Phase.RAINDROP)).hub_source is False


@pytest.fixture
def source_db(tmp_path, mod, traces):
    """A database with one matmul: 3 valid records and a failure, measured on an AVX-512 target."""
    path = tmp_path / "src.db"
    with Database(path) as db:
        wid, stored = fill(db, mod, traces)
        with db.transaction():  # re-keyed to an AVX-512 machine
            db._c().execute("UPDATE records SET target=?", (AVX512,))
        db.note_model("net512", {"target": AVX512})
        db.note_model("net2", {"target": canonical_target(Target({"kind": "llvm", "mcpu": "haswell"}))})
    return path, wid, stored


def test_a_hub_is_written_from_a_database_and_read_back_as_a_donor_of_the_runs_target(tmp_path, source_db, capsys):
    path, wid, stored = source_db
    out = tmp_path / "hub" / "x86-avx512.jsonl.gz"
    with Database(path, read_only=True) as db:
        got = write_hub(db, out, "x86-avx512", per_workload=2)
    assert (got.isa, got.workloads, got.records, got.machines, got.models) == ("x86-avx512", 1, 2, (AVX512,),
                                                                               ("net512",))
    with Database(path, read_only=True) as db:  # nothing for another ISA class
        assert write_hub(db, tmp_path / "avx2.jsonl.gz", "x86-avx2").workloads == 0
    with Database(path, read_only=True) as db, Database(path, read_only=True) as again:  # from several: once each
        twice = write_hub([db, again], tmp_path / "twice.jsonl.gz", "x86-avx512", per_workload=2)
    assert (twice.workloads, twice.records, twice.models) == (1, 2, ("net512",))
    before = _digest(out)
    donor = hub.HubDatabase(out, ZEN4)
    try:
        assert donor.find_workload(matmul_mod(64)) is None  # not held: nothing decoded for it
        assert donor._pending  # decoded only when asked for
        # the modules of one op class (a tune's shapes of Winograd kernels), read without decoding
        # the records: the same before and after the workload is decoded, and as in the source
        (pending,) = donor.modules_of_class("matmul")
        assert donor._pending and donor.modules_of_class("conv2d_winograd") == []
        (entry,) = donor.workloads()
        (decoded,) = donor.modules_of_class("matmul")
        assert same_workload(decoded, pending) and same_workload(decoded, entry.mod)
        with Database(path, read_only=True) as db:
            (source,) = db.modules_of_class("matmul")
            assert same_workload(source, entry.mod) and db.modules_of_class("winograd") == []
        assert donor.find_workload(entry.mod) == entry
        assert entry.op_class == "matmul"
        best = donor.best(entry.workload_id, ZEN4, k=5)
        valid = sorted((r for r in stored if r.ok), key=lambda r: r.result.mean)
        assert [r.trace_json for r in best] == [r.trace_json for r in valid[:2]]  # the 2 fastest, in order
        assert all(r.imported for r in best)  # never trusted as stored: re-measured where used
        assert donor.best(entry.workload_id, AVX512) == []  # keyed to the run's target only
        scratch = donor._dir
    finally:
        donor.close()
    assert not os.path.exists(scratch)
    assert _digest(out) == before
    assert main(["hub", "info", str(out)]) == 0  # what it holds and where it was measured
    shown = capsys.readouterr().out
    assert "x86-avx512" in shown and "workloads: 1   records: 2" in shown and "skylake-avx512" in shown
    assert "models: net512" in shown


def test_a_hub_grows_from_its_own_file_without_its_earlier_build_databases(tmp_path, source_db):
    path, _, _ = source_db
    first = tmp_path / "first.jsonl.gz"
    with Database(path, read_only=True) as db:
        write_hub(db, first, "x86-avx512", per_workload=1)
    with Database(tmp_path / "empty.db") as empty:  # a new build database that holds other workloads only
        grown = write_hub(empty, tmp_path / "grown.jsonl.gz", "x86-avx512", base=first)
        assert (grown.workloads, grown.records, grown.machines, grown.models) == (1, 1, (AVX512,), ("net512",))
        assert write_hub(empty, tmp_path / "alone.jsonl.gz", "x86-avx512").workloads == 0  # no base: none
        with pytest.raises(DatabaseError, match="x86-avx512, not x86-avx2"):
            write_hub(empty, tmp_path / "avx2.jsonl.gz", "x86-avx2", base=first)
    with Database(path, read_only=True) as db:  # the same workload in the base and a database: once
        both = write_hub(db, tmp_path / "both.jsonl.gz", "x86-avx512", per_workload=2, base=first)
    assert both.workloads == 1
    assert _hub_lines(tmp_path / "grown.jsonl.gz")[1:] == _hub_lines(first)[1:]  # kept as written there


def test_a_workload_written_twice_under_other_variable_names_is_one_workload_the_fastest(tmp_path, source_db):
    """A hub grown from databases of several networks meets the same kernel under other variable
    names (``lv236`` / ``lv201``): one workload, as a database keys it (structurally equal, the same
    block names), written once where its best is fastest."""
    path, _, _ = source_db
    first = tmp_path / "first.jsonl.gz"
    with Database(path, read_only=True) as db:
        write_hub(db, first, "x86-avx512", per_workload=1)
    head, row = _hub_lines(first)
    renamed = json.loads(json.dumps(row))
    renamed["mod"] = row["mod"].replace('"data":"A"', '"data":"X"')
    assert renamed["mod"] != row["mod"]
    renamed["records"][0]["run_secs"] = [2 * t for t in row["records"][0]["run_secs"]]  # slower
    twice = tmp_path / "twice.jsonl.gz"
    _write_lines(twice, [head, renamed, row])
    with Database(tmp_path / "empty.db") as empty:
        merged = write_hub(empty, tmp_path / "merged.jsonl.gz", "x86-avx512", base=twice)
    assert merged.workloads == 1
    assert [x["mod"] for x in _hub_lines(tmp_path / "merged.jsonl.gz")[1:]] == [row["mod"]]


def test_a_hub_written_for_some_models_holds_their_tasks_only(tmp_path, source_db):
    path, wid, _ = source_db
    with Database(path, read_only=True) as db:  # net512's note names no task
        got = write_hub(db, tmp_path / "none.jsonl.gz", "x86-avx512", models={"net512"})
    assert (got.workloads, got.models) == (0, ("net512",))
    with Database(path) as db:
        db.note_model("net512", {"target": AVX512, "tasks": [{"workload_id": wid, "name": "mm", "weight": 1}]})
        got = write_hub(db, tmp_path / "one.jsonl.gz", "x86-avx512", models={"net512", "not tuned"})
        assert (got.workloads, got.models) == (1, ("net512",))
        assert write_hub(db, tmp_path / "other.jsonl.gz", "x86-avx512", models={"net2"}).workloads == 0


def _hub_lines(path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def _write_lines(path, lines: list[dict]) -> None:
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))


def _spoil(lines, what):
    head, wl = lines
    rec = wl["records"][0]
    if what == "format":
        head = {**head, "stormdrop_hub": 99}
    elif what == "time":
        rec["run_secs"] = [-1.0]
    elif what == "trace":
        rec["trace"] = json.dumps([[["SamplePerfectTile", [None], [4, 64], [None, 1]]], []])
    elif what == "module":
        wl["mod"] = '{"root": 1, "nodes": [{"type_key": "IRModule", "data": [1]}, "x"]}'
    elif what == "missing":
        del wl["records"][0]["run_secs"]
    elif what == "type":
        wl["shash"] = 7
    elif what == "shapes":
        wl["shapes"] = [[128, "128"]]
    return [head, wl]


@pytest.mark.parametrize("what", ["format", "time", "missing", "not gzip", "type", "shapes"])
def test_a_malformed_hub_is_one_error_and_leaves_nothing(tmp_path, source_db, what):
    path, _, _ = source_db
    good = tmp_path / "good.jsonl.gz"
    with Database(path, read_only=True) as db:
        write_hub(db, good, "x86-avx512")
    bad = tmp_path / "bad.jsonl.gz"
    if what == "not gzip":
        bad.write_text("{}\n")
    else:
        _write_lines(bad, _spoil(_hub_lines(good), what))
    with pytest.raises(DatabaseError, match="hub"):
        hub.HubDatabase(bad, ZEN4).close()


@pytest.mark.parametrize("what", ["trace", "module"])
def test_a_hub_workload_that_fails_its_check_when_decoded_is_left_out(tmp_path, source_db, what, caplog, monkeypatch):
    """Modules and traces are checked when a run asks for their workload (decoding all of them would
    cost every run seconds): a workload with a damaged one is left out with a warning, not the run."""
    path, _, _ = source_db
    good = tmp_path / "good.jsonl.gz"
    with Database(path, read_only=True) as db:
        write_hub(db, good, "x86-avx512")
    bad = tmp_path / "bad.jsonl.gz"
    _write_lines(bad, _spoil(_hub_lines(good), what))
    with Database(path, read_only=True) as db:
        mod = db.workloads()[0].mod
    monkeypatch.setattr(logging.getLogger("stormdrop"), "propagate", True)  # a CLI test may have turned it off
    monkeypatch.setattr(logging.getLogger("stormdrop"), "handlers", [])
    with hub.HubDatabase(bad, ZEN4) as donor:
        assert donor.find_workload(mod) is None and donor.workloads() == []
    assert "left out, malformed" in caplog.text


def test_the_cli_refuses_a_bad_hub_in_one_line_before_the_database_is_touched(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_text("not a hub")
    db = tmp_path / "never.db"
    proc = stormdrop_cli("tune", "--kernel", SPEC, "--trials", "2", "--db", str(db), "--hub", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "hub" in proc.stderr
    assert not db.exists()
    info = stormdrop_cli("hub", "info", str(bad))
    assert info.returncode == 2 and info.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_a_tune_starts_from_the_hubs_schedule_of_the_same_workload(tmp_path):
    """An exact hit: the hub's best schedule of this kernel is replayed and measured first (reuse),
    here; nothing of the hub is stored unmeasured, and the hub file is not written. A related
    workload takes the hub's schedule as a transfer, unless ``StormConfig.hub_transfers`` is off."""
    first = tmp_path / "first.db"
    options = KernelOptions(trials=6, exploit_trials=0, seed=0, search=SearchOptions(hub=False))
    tune_kernel(SPEC, options, db=first)
    out = tmp_path / "h.jsonl.gz"
    with Database(first, read_only=True) as db:
        isa = hub.isa_class(db.targets(db.workloads()[0].workload_id)[0])
        assert isa is not None, "the host's ISA class is needed for this test"
        got = write_hub(db, out, isa, per_workload=1)
    assert got.workloads == 1 and got.records == 1
    before = _digest(out)
    fresh = tmp_path / "fresh.db"
    with_hub = tune_kernel(SPEC, replace(options, search=SearchOptions(hub=str(out))), db=fresh).tasks[0]
    assert with_hub.trials["reuse"] >= 1
    hub_trace = _hub_lines(out)[1]["records"][0]["trace"]
    with Database(first, read_only=True) as db:
        hub_key = next(r.candidate_key for r in db.records(db.workloads()[0].workload_id) if r.trace_json == hub_trace)
    with Database(fresh, read_only=True) as db:
        recs = db.records(db.workloads()[0].workload_id)
    assert not any(r.imported for r in recs)  # only what was measured here is stored
    assert hub_key in {r.candidate_key for r in recs if r.phase == Phase.REUSE}  # the same schedule, re-measured
    without = tune_kernel(SPEC, options, db=tmp_path / "none.db").tasks[0]
    assert without.trials["reuse"] == 0
    # a related workload (another matmul shape): the hub's schedule transferred, measured here
    other = tune_kernel("matmul:M=48,N=80,K=64", replace(options, search=SearchOptions(hub=str(out))),
                        db=tmp_path / "other.db").tasks[0]
    assert other.trials["reuse"] >= 1  # its one record transferred, and moved into the sketches
    with Database(tmp_path / "other.db", read_only=True) as db:
        assert not any(r.imported for r in db.records(db.workloads()[0].workload_id))
    exact = SearchOptions(hub=str(out), storm=StormConfig(hub_transfers=False))  # exact workloads only
    assert tune_kernel("matmul:M=48,N=80,K=64", replace(options, search=exact),
                       db=tmp_path / "exact.db").tasks[0].trials["reuse"] == 0
    assert _digest(out) == before


@pytest.mark.parametrize("isa, target", [
    ("x86-avx512", {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}),
    ("x86-avx2", {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}),
    ("cuda-sm_90", {"kind": "cuda", "arch": "sm_90"}),
])
def test_every_shipped_hub_is_read_for_its_class_and_its_workloads_decode(isa, target):
    from stormdrop.target import parse_target

    t = parse_target(target)
    path = hub.shipped_path(hub.isa_class(t))  # (the tests' environment turns the hub off)
    assert path is not None and path.name == f"{isa}.jsonl.gz"
    about = hub.info(path)
    assert about.isa == isa and about.workloads > 0 and about.records >= about.workloads
    donor = hub.open_hub(t, str(path))
    try:
        lines = donor.listed(lambda _c: True)  # every line gives its shapes: a lookup ranks before it decodes
        assert len(lines) == about.workloads and all(isinstance(line, hub.HubLine) for line in lines)
        entries = donor.workloads()
        assert len(entries) == about.workloads and all(e.mod is not None for e in entries)
        assert [parameter_shapes(e.mod) for e in entries] == [line.shapes for line in lines]
    finally:
        donor.close()


def test_a_hub_decodes_only_the_workloads_of_the_classes_asked_for(tmp_path, mod, traces):
    """``workloads(keep)``: the lines of the op classes it accepts are decoded (a run's reuse asks
    for those related to a task's); the others stay undecoded until asked for."""
    with Database(tmp_path / "two.db") as db:
        fill(db, mod, traces)
        small = matmul_mod(64)
        wid = db.commit_workload(small, name="matmul_64", op_class="dense", flops=2 * 64**3).workload_id
        db.commit_record(make_record(wid, small, traces[0], MeasureResult(run_secs=(1e-4, 1e-4))))
        with db.transaction():
            db._c().execute("UPDATE records SET target=?", (AVX512,))
    with Database(tmp_path / "two.db", read_only=True) as db:
        write_hub(db, tmp_path / "two.jsonl.gz", "x86-avx512")
    with hub.HubDatabase(tmp_path / "two.jsonl.gz", AVX512) as h:
        assert [w.name for w in h.workloads(lambda c: c == "matmul")] == ["matmul_128"]
        assert len(h._pending) == 1  # the dense line: not decoded
        assert sorted(w.name for w in h.workloads()) == ["matmul_128", "matmul_64"]
        assert not h._pending



def test_a_lookup_ranks_a_hubs_workloads_by_their_lines_and_decodes_the_donors_it_reaches(tmp_path, traces):
    """Reuse's donors from a hub whose lines give their shapes: the same donors in the same order as
    from the same hub without them (every related workload decoded to be ranked), and only the
    donors the lookup reached decoded."""
    from stormdrop.search.donors import donors

    sizes = (32, 64, 96, 128, 256)
    with Database(tmp_path / "five.db") as db:
        for n in sizes:
            m = matmul_mod(n)
            wid = db.commit_workload(m, name=f"matmul_{n}", op_class="matmul", flops=2 * n**3).workload_id
            db.commit_record(make_record(wid, m, traces[0], MeasureResult(run_secs=(1e-4, 1e-4))))
        with db.transaction():
            db._c().execute("UPDATE records SET target=?", (AVX512,))
    with Database(tmp_path / "five.db", read_only=True) as db:
        write_hub(db, tmp_path / "five.jsonl.gz", "x86-avx512")
    lines = _hub_lines(tmp_path / "five.jsonl.gz")
    assert all(line["shapes"] for line in lines[1:])
    _write_lines(tmp_path / "old.jsonl.gz", [lines[0]] + [{k: v for k, v in line.items() if k != "shapes"}
                                                           for line in lines[1:]])
    with Database(tmp_path / "run.db") as db:
        entry = db.commit_workload(matmul_mod(112), name="matmul_112", op_class="matmul", flops=2 * 112**3)
        found = {}
        for name in ("five", "old"):
            with hub.HubDatabase(tmp_path / f"{name}.jsonl.gz", AVX512) as h:
                got = donors(db, entry, AVX512, [h], exact_sources=False)
                found[name] = [next(got)[0].name, next(got)[0].name]
                found[name + " decoded"] = sorted(w.name for w in Database.workloads(h))
    assert found["five"] == found["old"] == ["matmul_128", "matmul_96"]
    assert found["five decoded"] == ["matmul_128", "matmul_96"]
    assert len(found["old decoded"]) == len(sizes)


# The README's quick start "starts from the shipped schedule hub, which holds its kernels": every task
# of resnet18 at 56 as a 200-trial tune lowers it is a workload of the shipped x86-avx512 hub. A lowering
# change that gives one of its kernels other loops (a new default switch) leaves the hub's entry unused
# until the hub is rebuilt, and fails this test.
@pytest.mark.slow
def test_the_shipped_hub_holds_every_task_of_the_quick_start_as_it_is_lowered_today():
    from stormdrop import Lowering, load_model
    from stormdrop.model.tune import budgeted_extraction
    from stormdrop.storage.donors import tuned_in

    t = Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})
    donor = hub.open_hub(t, str(hub.shipped_path("x86-avx512")))
    try:
        _, tasks, lowering = budgeted_extraction(load_model("resnet18", resolution=56), t, Lowering(), (200, None),
                                                 [donor], True)
        missing = [k.name for k, _ in tasks if not tuned_in(k.mod, canonical_target(t), [donor])]
    finally:
        donor.close()
    assert len(tasks) >= 10 and not missing, f"{len(missing)} of {len(tasks)} tasks not in the hub: {missing[:5]}"
