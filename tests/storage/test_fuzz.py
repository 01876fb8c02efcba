"""Property-based fuzzing of the files and rows stormdrop reads (Hypothesis, seeded): mutated
MetaSchedule JSON databases through ``import``, then ``show``, ``export`` and ``report`` of what
was imported, and mutated database rows through ``show``, ``export``, ``report`` and ``report
--compare``. Never a signal, never a traceback: exit 0 or 2, and a refused import leaves the
database as it was. And mutated traces of a model's convolution on a CPU and of a matmul on a GPU
(CUDA): refused by ``check_trace_json`` or replayed by TVM without a crash
(what ``tune`` and ``bench`` rely on when they replay a database's traces in process).

``FUZZ_EXAMPLES`` (environment) sets the number of cases of each test (default: CI's, 8 file and
row cases, 200 trace cases);
``FUZZ_TALLY`` names a JSON file that gets each command's exit codes counted
(``benchmarks/fuzz_inputs.py``)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from dbutil import dump, fill
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormdrop.cli.main import main
from stormdrop.storage.database import Database
from stormdrop.storage.metaschedule import export_metaschedule
from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics
from stormdrop.tvm_compat.trace_json import check_trace_json, trace_to_json

pytestmark = pytest.mark.slow  # builds, runs or spawns processes

# cases of each test: a file or row case runs CLI commands (child processes), a trace case one fork
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "8"))
TRACE_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "200"))
TALLY: dict[str, int] = {}
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))

HOSTILE = st.one_of(
    st.sampled_from([None, True, False, 0, -1, 1, 2**63, -(2**63) - 1, 1e308, -1e308, 1e-320, -0.0,
                     float("nan"), float("inf"), float("-inf"), "", "NaN", "\u202e<script>x</script>", "\x00",
                     "ffi.Array", "ir.IntImm", [], {}, [[]], {"type": "ffi.Array", "data": [0]},
                     "b0", "l1", "v2", "main", "global", "meta_schedule.parallel"]),
    st.integers(-10, 10**6),
    st.text(max_size=20),
    st.integers(2, 3000).map(lambda n: json.loads("[" * n + "]" * n) if n < 900 else "[" * n),
)


def _paths(obj, prefix=()):
    """Every path to a value inside a JSON value (lists and dicts)."""
    yield prefix
    if isinstance(obj, list):
        for i, x in enumerate(obj):
            yield from _paths(x, (*prefix, i))
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _paths(x, (*prefix, k))


def _replace(obj, path, value):
    if not path:
        return value
    obj[path[0]] = _replace(obj[path[0]], path[1:], value)
    return obj


@st.composite
def _mutated(draw, obj):
    """``obj`` (a JSON value) with a few values replaced by hostile ones."""
    obj = json.loads(json.dumps(obj))
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(obj))
        obj = _replace(obj, draw(st.sampled_from(paths)), draw(HOSTILE))
    return obj


@st.composite
def _rewired(draw, graph):
    """A module's object graph with hostile values (``_mutated``), or one node's references
    pointing at itself or at a later node, or a chain of nodes thousands deep."""
    how = draw(st.sampled_from(["values", "self", "later", "deep"]))
    if how == "values":
        return draw(_mutated(graph))
    nodes = graph["nodes"]
    if how == "deep":
        nodes.append({"type": "ffi.Array", "data": [graph["root_index"]]})
        for _ in range(draw(st.integers(100, 20000))):
            nodes.append({"type": "ffi.Array", "data": [len(nodes) - 1]})
        graph["root_index"] = len(nodes) - 1
        return graph
    i = draw(st.sampled_from([i for i, n in enumerate(nodes) if isinstance(n.get("data"), (list, dict)) and n["data"]]))
    data = nodes[i]["data"]
    key = draw(st.sampled_from(range(len(data)) if isinstance(data, list) else sorted(data)))
    data[key] = i if how == "self" else draw(st.integers(i + 1, len(nodes) - 1)) if i + 1 < len(nodes) else i
    return graph


def _blob(text: str) -> str:
    data = text.encode()
    return base64.b64encode(len(data).to_bytes(8, "little") + data).decode()


def _text_mutation(draw, text: str) -> str:
    """Bytes-level: truncated, a character replaced, or a stretch repeated."""
    how = draw(st.sampled_from(["truncate", "flip", "repeat"]))
    i = draw(st.integers(0, max(0, len(text) - 1)))
    if how == "truncate":
        return text[:i]
    if how == "flip":
        return text[:i] + draw(st.characters(codec="utf-8")) + text[i + 1:]
    return text[:i] + text[i:i + 50] * draw(st.integers(2, 2000)) + text[i + 50:]


@pytest.fixture(scope="module", autouse=True)
def _tally():
    yield
    if os.environ.get("FUZZ_TALLY"):
        Path(os.environ["FUZZ_TALLY"]).write_text(json.dumps(TALLY, indent=1, sort_keys=True))


@pytest.fixture(scope="module")
def template(tmp_path_factory, mod, traces) -> Path:
    d = tmp_path_factory.mktemp("fuzz")
    with Database(d / "t.db") as db:
        fill(db, mod, traces)
        export_metaschedule(db, str(d / "ms"))
    return d


def _run(capsys, argv: list[str]) -> int:
    code = main(argv)
    err = capsys.readouterr().err
    key = f"{argv[0]} exit {code}" + (" traceback" if "Traceback" in err else "")
    TALLY[key] = TALLY.get(key, 0) + 1
    assert code in (0, 2), (argv[0], code, err[-400:])
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("skipping record")]  # export's, one a record
    assert "Traceback" not in err and len(lines) <= 1, err[-400:]
    return code


@st.composite
def _ms_files(draw, workload_line: str, record_lines: list[str]):
    """A MetaSchedule directory's two files, one of them mutated: its text, its JSON, or (for the
    workload) the module's object graph inside the base64."""
    target = draw(st.sampled_from(["workload", "record"]))
    how = draw(st.sampled_from(["text", "json", "graph"] if target == "workload" else ["text", "json"]))
    wl, recs = workload_line, list(record_lines)
    if target == "workload":
        if how == "text":
            wl = _text_mutation(draw, wl)
        elif how == "json":
            wl = json.dumps(draw(_mutated(json.loads(wl))))
        else:
            shash, b64 = json.loads(wl)
            graph = json.loads(base64.b64decode(b64)[8:].decode())
            wl = json.dumps([shash, _blob(json.dumps(draw(_rewired(graph))))])
    else:
        i = draw(st.integers(0, len(recs) - 1))
        recs[i] = _text_mutation(draw, recs[i]) if how == "text" else json.dumps(draw(_mutated(json.loads(recs[i]))))
    return wl, recs


def test_import_of_mutated_metaschedule_files(template: Path, tmp_path_factory, capsys) -> None:
    ms = template / "ms"
    workload_line = (ms / "database_workload.json").read_text().splitlines()[0]
    record_lines = (ms / "database_tuning_record.json").read_text().splitlines()

    @SETTINGS
    @given(_ms_files(workload_line, record_lines))
    def case(files) -> None:
        d = tmp_path_factory.mktemp("case")
        (d / "ms").mkdir()
        (d / "ms" / "database_workload.json").write_text(files[0] + "\n")
        (d / "ms" / "database_tuning_record.json").write_text("\n".join(files[1]) + "\n")
        db = d / "t.db"
        shutil.copy(template / "t.db", db)
        before = dump(db)
        if _run(capsys, ["import", str(d / "ms"), "--db", str(db)]) == 2:
            assert dump(db) == before
            TALLY["import refused, database unchanged"] = TALLY.get("import refused, database unchanged", 0) + 1
            return
        _run(capsys, ["show", "--db", str(db)])
        _run(capsys, ["export", "--db", str(db), "--out", str(d / "out")])
        _run(capsys, ["report", "--db", str(db), "--out", str(d / "report")])
        shutil.rmtree(d, ignore_errors=True)

    case()


COLUMNS = [("workloads", "mod_json"), ("workloads", "name"), ("workloads", "flops"), ("records", "trace_json"),
           ("records", "run_secs"), ("records", "args_info_json"), ("records", "target"), ("records", "error"),
           ("records", "phase"), ("records", "mean_secs"), ("records", "attempts")]


def test_show_and_export_of_mutated_database_rows(template: Path, tmp_path_factory, capsys) -> None:
    with sqlite3.connect(template / "t.db") as con:
        values = {(t, c): [r[0] for r in con.execute(f"SELECT {c} FROM {t}")] for t, c in COLUMNS}
    con.close()

    @st.composite
    def rows(draw):
        table, column = draw(st.sampled_from(COLUMNS))
        old = draw(st.sampled_from(values[(table, column)]))
        if isinstance(old, str) and old[:1] in "[{":
            new = json.dumps(draw(_mutated(json.loads(old)))) if draw(st.booleans()) else _text_mutation(draw, old)
        else:
            new = draw(HOSTILE)
            new = json.dumps(new) if isinstance(new, (list, dict)) else new
        return table, column, old, new

    @SETTINGS
    @given(rows())
    def case(row) -> None:
        table, column, old, new = row
        d = tmp_path_factory.mktemp("row")
        db = d / "t.db"
        shutil.copy(template / "t.db", db)
        with sqlite3.connect(db) as con:
            try:
                con.execute(f"UPDATE {table} SET {column}=? WHERE {column} IS ?", (new, old))
            except (sqlite3.Error, OverflowError):  # the schema refuses it: nothing to read
                return
        con.close()
        before = dump(db)
        _run(capsys, ["show", "--db", str(db)])
        _run(capsys, ["export", "--db", str(db), "--out", str(d / "out")])
        _run(capsys, ["report", "--db", str(db), "--out", str(d / "report")])
        _run(capsys, ["report", "--db", str(template / "t.db"), "--compare", str(db), "--out", str(d / "compare")])
        assert dump(db) == before
        TALLY["row cases, database unchanged"] = TALLY.get("row cases, database unchanged", 0) + 1
        shutil.rmtree(d, ignore_errors=True)

    case()


@pytest.fixture(scope="module")
def conv_traces() -> tuple:
    """A model's kind of kernel, an NHWC convolution + ReLU whose weights are layout-free (its
    schedules rewrite their layout), and the JSON of each of its post-processed design spaces."""
    import tvm
    import tvm.s_tir.meta_schedule as ms
    from dbutil import TARGET
    from tvm import te, topi

    x = te.placeholder((1, 14, 14, 32), name="x")
    w = te.placeholder((3, 3, 32, 32), name="w")
    y = topi.nn.relu(topi.nn.conv2d_nhwc(x, w, 1, 1, 1))
    func = te.create_prim_func([x, w, y]).with_attr("layout_free_buffers", [1])
    mod = tvm.IRModule({"main": func})
    load_tensor_intrinsics(TARGET)
    ctx = ms.TuneContext(mod, target=TARGET, space_generator="post-order-apply", search_strategy="replay-trace",
                         num_threads=1)
    out = []
    for sch in ctx.generate_design_space():
        sch.enter_postproc()
        if all(p.apply(sch) for p in ctx.space_generator.postprocs):
            out.append(json.loads(trace_to_json(sch.trace)))
    kinds = {inst[0] for t in out for inst in t[0]}
    assert {"TransformLayout", "SampleCategorical", "Parallel", "Vectorize"} <= kinds, kinds
    return mod, out


@pytest.fixture(scope="module")
def cuda_traces() -> tuple:
    """A GPU kernel, a matmul for an sm_80 CUDA target, and the JSON of the storm's first candidates'
    traces (thread bindings, shared-memory stages, unroll annotations; the design spaces' default
    decisions fail the GPU's checks)."""
    from stormdrop.search.storm import Storm, StormConfig
    from stormdrop.target import parse_target
    from stormdrop.workloads import parse_kernel

    mod = parse_kernel("matmul:M=64,N=64,K=64").mod
    storm = Storm(mod, parse_target({"kind": "cuda", "arch": "sm_80"}), trials=4, seed=0,
                  config=StormConfig(batch_size=4, population_size=16, genetic_num_iters=1, init_min_unmeasured=16))
    out = [json.loads(trace_to_json(c.sch.trace)) for c in storm.propose()]
    storm.close()
    kinds = {inst[0] for t in out for inst in t[0]}
    assert {"Bind", "CacheRead", "SamplePerfectTile"} <= kinds, kinds
    return mod, out


@st.composite
def _trace_mutants(draw, traces):
    """A trace with hostile values (``_mutated``), or an instruction given another kind's name,
    dropped, or repeated."""
    obj = json.loads(json.dumps(draw(st.sampled_from(traces))))
    how = draw(st.sampled_from(["values", "values", "kind", "drop", "repeat"]))
    if how == "values":
        return draw(_mutated(obj))
    insts = obj[0]
    i = draw(st.integers(0, len(insts) - 1))
    if how == "kind":
        insts[i][0] = draw(st.sampled_from(sorted({inst[0] for t in traces for inst in t[0]})))
    elif how == "drop":
        del insts[i]
    else:
        insts.insert(i, json.loads(json.dumps(insts[i])))
    return obj


@pytest.mark.parametrize("kernel", ["conv_traces", "cuda_traces"])
def test_mutated_traces_are_refused_or_replayed_without_a_crash(kernel, request) -> None:
    from tvm.s_tir import Schedule
    from tvm.s_tir.schedule import Trace

    mod, traces = request.getfixturevalue(kernel)
    gpu = "CUDA " if kernel == "cuda_traces" else ""

    @settings(SETTINGS, max_examples=TRACE_EXAMPLES)
    @given(_trace_mutants(traces))
    def case(obj) -> None:
        try:
            check_trace_json(obj)
        except ValueError:
            key = f"{gpu}trace refused by check_trace_json"
            TALLY[key] = TALLY.get(key, 0) + 1
            return
        pid = os.fork()  # TVM's crash would be the child's death by a signal
        if pid == 0:
            code = 0
            try:
                Trace.apply_json_to_schedule(obj, Schedule(mod))
            except BaseException:  # noqa: BLE001 - TVM refusing the trace is the good outcome too
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert not os.WIFSIGNALED(status), (f"TVM died by signal {os.WTERMSIG(status)} on", json.dumps(obj)[:3000])
        key = gpu + ("trace replayed by TVM" if os.WEXITSTATUS(status) == 0 else "trace refused by TVM (an exception)")
        TALLY[key] = TALLY.get(key, 0) + 1

    case()
