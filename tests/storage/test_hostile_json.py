"""Crafted module JSON (in an imported MetaSchedule file or a database row) is refused with one
line; TVM's loader, which would crash the process on it, never sees it (``check_object_graph``)."""

from __future__ import annotations

import base64
import json
import sqlite3
from pathlib import Path

import pytest
import tvm
import tvm_ffi
from dbutil import TARGET, dump, fill, one_record_exported, stormdrop_cli

from stormdrop.cli.main import main
from stormdrop.storage.database import Database
from stormdrop.tvm_compat.trace_json import (
    MAX_GRAPH_DEPTH,
    check_object_graph,
    check_trace_json,
    load_object_json,
)


def _graph(mod) -> dict:
    return json.loads(tvm.ir.save_json(mod))


def _crafted(graph: dict, how: str) -> str:
    """``graph`` made hostile: ``self`` (its root refers to itself), ``later`` (to a later node),
    ``deep`` (a chain of 5,000 arrays under the root), ``nested`` (100,000 nested JSON arrays)."""
    nodes, root = graph["nodes"], graph["root_index"]
    if how == "nested":
        return "[" * 100_000 + "]" * 100_000
    if how == "self":
        nodes.append({"type": "ffi.Array", "data": [len(nodes)]})
    elif how == "later":
        nodes.append({"type": "ffi.Array", "data": [len(nodes) + 1]})
        nodes.append({"type": "ffi.Array", "data": [root]})
    else:
        nodes.append({"type": "ffi.Array", "data": [root]})
        for _ in range(5000):
            nodes.append({"type": "ffi.Array", "data": [len(nodes) - 1]})
    graph["root_index"] = len(nodes) - 1
    return json.dumps(graph)


HOW = ["self", "later", "deep", "nested"]



def test_a_module_graph_as_tvm_writes_it_passes(mod) -> None:
    text = tvm.ir.save_json(mod)
    assert 0 < check_object_graph(text) < MAX_GRAPH_DEPTH
    assert tvm_ffi.structural_equal(load_object_json(text), mod)


@pytest.mark.parametrize("how", HOW)
def test_a_crafted_module_graph_is_refused_before_tvm_sees_it(mod, how) -> None:
    with pytest.raises(ValueError):
        check_object_graph(_crafted(_graph(mod), how))


@pytest.mark.slow
def test_a_self_referencing_graph_crashes_tvm_itself(tmp_path: Path, mod) -> None:
    """Why the check exists: the same text handed to TVM kills the process (SIGSEGV)."""
    path = tmp_path / "g.json"
    path.write_text(_crafted(_graph(mod), "self"))
    import resource
    import subprocess
    import sys

    def small_stack() -> None:  # the recursion overflows a 1 MB stack 8x sooner than the default 8 MB
        resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, 1 << 20))

    code = "import sys, tvm; tvm.ir.load_json(open(sys.argv[1]).read())"
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, timeout=300, preexec_fn=small_stack)
    assert r.returncode < 0, r.stderr[-300:]
    (tmp_path / "ok.json").write_text(json.dumps(_graph(mod)))  # the same stack holds a sound graph's load
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ok.json")], capture_output=True, timeout=300,
                       preexec_fn=small_stack)
    assert r.returncode == 0, r.stderr[-300:]


def _blob(text: str) -> str:
    data = text.encode()
    return base64.b64encode(len(data).to_bytes(8, "little") + data).decode()


@pytest.mark.slow
@pytest.mark.parametrize("how", HOW)
def test_import_of_a_crafted_workload_file_is_one_line_and_changes_nothing(tmp_path: Path, mod, traces, how) -> None:
    path, good, before = one_record_exported(tmp_path, mod, traces)
    shash, b64 = json.loads((good / "database_workload.json").read_text().splitlines()[0])
    raw = base64.b64decode(b64)[8:].decode()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "database_workload.json").write_text(json.dumps([shash, _blob(_crafted(json.loads(raw), how))]) + "\n")
    (bad / "database_tuning_record.json").write_text((good / "database_tuning_record.json").read_text())
    r = stormdrop_cli("import", str(bad), "--db", str(path))
    assert r.returncode == 2, (r.returncode, r.stderr[-400:])
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert "database_workload.json line 1" in r.stderr
    assert dump(path) == before


@pytest.mark.slow
def test_a_nested_record_line_is_one_line(tmp_path: Path, mod, traces) -> None:
    path, good, before = one_record_exported(tmp_path, mod, traces)
    (good / "database_tuning_record.json").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    r = stormdrop_cli("import", str(good), "--db", str(path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert dump(path) == before


@pytest.mark.slow
@pytest.mark.parametrize("how", ["self", "deep"])
def test_a_crafted_module_in_a_database_row_is_one_line_from_show_and_report(tmp_path: Path, mod, traces,
                                                                           how) -> None:
    path = tmp_path / "bad.db"
    with Database(path) as db:
        fill(db, mod, traces[:1])
    with sqlite3.connect(path) as con:
        (text,) = con.execute("SELECT mod_json FROM workloads").fetchone()
        con.execute("UPDATE workloads SET mod_json=?", (_crafted(json.loads(text), how),))
    before = dump(path)
    for args in (["show", "--db", str(path)], ["report", "--db", str(path), "--out", str(tmp_path / "r")]):
        r = stormdrop_cli(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-400:])
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert "workload 1" in r.stderr
    assert dump(path) == before


@pytest.mark.slow
@pytest.mark.parametrize("secs", ["[-1.0]", "[0.0]", "[1e-300]", "[-Infinity]", "[NaN]", "[]", '["0.001"]', "empty trace"])
def test_an_impossible_imported_record_is_refused_and_changes_nothing(tmp_path: Path, mod, traces, secs,
                                                                     capsys) -> None:
    """Run times must be finite and at least a nanosecond (a fake-fast record would stay a task's
    best), and a trace must have instructions."""
    path, good, before = one_record_exported(tmp_path, mod, traces)
    index, rec = json.loads((good / "database_tuning_record.json").read_text().splitlines()[0])
    line = json.dumps([index, rec])
    if secs == "empty trace":
        rec[0] = [[], []]
        line = json.dumps([index, rec])
    else:
        line = line.replace(json.dumps(rec[1]), secs, 1)
    (good / "database_tuning_record.json").write_text(line + "\n")
    assert main(["import", str(good), "--db", str(path)]) == 2  # in process: no crash to fear here
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "database_tuning_record.json line 1" in err
    assert dump(path) == before


@pytest.mark.slow
def test_a_trace_that_crashes_tvm_is_refused_by_import_and_export_with_one_line(tmp_path: Path, mod, traces) -> None:
    """A null instruction attribute (GetSBlock's function name) kills TVM's trace replay (SIGSEGV):
    ``check_trace_json`` refuses it: import with one line, nothing written; export skips that record,
    with one line."""
    path, good, before = one_record_exported(tmp_path, mod, traces)
    index, rec = json.loads((good / "database_tuning_record.json").read_text().splitlines()[0])
    get = next(i for i in rec[0][0] if i[0] == "GetSBlock")
    get[2][1] = None
    (good / "database_tuning_record.json").write_text(json.dumps([index, rec]) + "\n")
    r = stormdrop_cli("import", str(good), "--db", str(path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-400:]
    assert "null attribute" in r.stderr and "database_tuning_record.json line 1" in r.stderr
    assert dump(path) == before
    with sqlite3.connect(path) as con:  # the same trace stored in the database
        con.execute("UPDATE records SET trace_json=?", (json.dumps(rec[0]),))
    con.close()
    before = dump(path)
    r = stormdrop_cli("export", "--db", str(path), "--out", str(tmp_path / "out"))
    assert r.returncode == 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr  # the record skipped, said once
    assert r.stderr.startswith("skipping record 1 of matmul_128") and "null attribute" in r.stderr, r.stderr
    assert dump(path) == before and "GetSBlock" not in (tmp_path / "out" / "database_tuning_record.json").read_text()


def test_a_child_that_tvm_kills_is_one_line_naming_what_it_read(monkeypatch) -> None:
    """Import and export replay traces in a child process (``isolated``): a crash the checks do not
    foresee is the child's death, one ``DatabaseError`` line naming the entry it was reading."""
    from stormdrop.errors import DatabaseError
    from stormdrop.measure import workers
    from stormdrop.tvm_compat import isolated

    monkeypatch.setattr(workers, "child_entry", lambda *a: (
        "import os, signal; print('at: f.json line 3', flush=True); os.kill(os.getpid(), signal.SIGSEGV)"))
    with pytest.raises(DatabaseError, match=r"^malformed entry in f.json line 3: TVM crashed on it \(SIGSEGV\); "
                                            r"nothing was written$"):
        isolated.run("read_metaschedule", "dir", what="dir")


def test_an_export_whose_child_is_killed_leaves_no_files(tmp_path: Path, mod, traces, monkeypatch, capsys) -> None:
    """The export's child writes into a hidden folder of ``--out`` and moves its files in at the
    end: killed before that, the command is one line and the folder is gone."""
    from stormdrop.measure import workers

    path, _, before = one_record_exported(tmp_path, mod, traces)
    out = tmp_path / "out"
    monkeypatch.setattr(workers, "child_entry", lambda *a: (
        "import os, sys, signal; os.makedirs(os.path.join(sys.argv[-3], sys.argv[-1], 'partial'));"
        "print('at: the record', flush=True); os.kill(os.getpid(), signal.SIGKILL)"))
    assert main(["export", "--db", str(path), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("stormdrop: error: malformed entry in the record: TVM crashed on it "
                                               "(SIGKILL); nothing was written")
    assert out.is_dir() and not list(out.iterdir()) and dump(path) == before


def test_reuse_skips_a_donor_trace_that_would_crash_tvm(mod, traces) -> None:
    """A donor database (``--reuse-from``) is replayed in the tuner's own process: a donor trace
    TVM would crash on gives no transfer, and the tuning goes on."""
    from tvm.s_tir.meta_schedule import TuneContext

    from stormdrop.search import reuse
    good = json.loads(traces[0])
    get = next(i for i in good[0] if i[0] == "GetSBlock")
    get[2][1] = None
    ctx = TuneContext(mod, target=TARGET, space_generator="post-order-apply")
    spaces = ctx.generate_design_space()
    assert reuse.transfer(mod, traces[0], mod, ctx.space_generator.postprocs) is not None
    assert reuse.transfer(mod, json.dumps(good), mod, ctx.space_generator.postprocs) is None
    assert reuse.in_sketches(mod, json.dumps(good), mod, spaces, ctx.space_generator.postprocs) == []


GOOD_TRACE = [[["GetSBlock", [], ["C", "main"], ["b0"]], ["GetLoops", ["b0"], [], ["l1", "l2", "l3"]],
               ["SamplePerfectTile", ["l1"], [2, 16], ["v4", "v5"]], ["Split", ["l1", "v4", None], [True, False], ["l6", "l7"]],
               ["Unannotate", ["b0"], ["meta_schedule.parallel"], []],
               ["TransformLayout", ["b0", "index_map"], [0, 1, None, 0], []]], [[2, [4, 16]]]]


@pytest.mark.parametrize("where, value", [
    ((0, 0, 2, 1), None),       # GetSBlock's function name: SIGSEGV in TVM's replay
    ((0, 3, 2, 0), None),       # Split's flag: SIGSEGV
    ((0, 4, 1, 0), None),       # Unannotate's block: SIGSEGV
    ((1, 0, 1), [4, 0]),        # a tile size of 0: SIGFPE
    ((1, 0, 1), None),          # a null decision: SIGSEGV
    ((1, 0, 1), [4, "16"]),     # not integers
    ((0, 2, 2), [[[[[[[[[[[[[[[[[[2]]]]]]]]]]]]]]]]]]),  # nested past any trace's values
])
def test_a_trace_tvm_would_crash_on_is_refused(where, value) -> None:
    """What TVM's replay crashes on instead of raising (found by test_fuzz's trace test) is refused
    first; the nulls TVM takes (Split's inferred factor, TransformLayout's pad value) pass."""
    trace = json.loads(json.dumps(GOOD_TRACE))
    check_trace_json(trace)
    node = trace
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    with pytest.raises(ValueError):
        check_trace_json(trace)


@pytest.mark.parametrize("how", HOW)
def test_a_trace_whose_index_map_would_crash_tvm_is_refused(how) -> None:
    """TransformLayout (the parity planes' sketches) carries its index map as an object graph inside
    the trace, which TVM decodes recursively: a crafted one is refused like a crafted module."""
    from stormdrop.search.parity import planes
    from stormdrop.tvm_compat.trace_json import trace_to_json
    from stormdrop.workloads import parse_kernel

    trace = json.loads(trace_to_json(planes(parse_kernel(
        "depthwise_conv2d:N=1,C=16,H=32,W=32,R=3,S=3,stride=2,pad=1").mod).trace))
    check_trace_json(trace)
    (inst,) = [i for i in trace[0] if i[0] == "TransformLayout"]
    inst[1][1] = _crafted(json.loads(inst[1][1]), how)
    for _ in range(2):  # a graph that passed is remembered (a hub's index maps repeat), a refused one is not
        with pytest.raises(ValueError, match="TransformLayout"):
            check_trace_json(trace)
