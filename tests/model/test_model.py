"""Whole models: a tiny ONNX network tuned, compiled, run and matched against ONNX Runtime."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from stormdrop.errors import SpecError
from stormdrop.lowering.layout import weight_transforms
from stormdrop.model.bench import deployed_keys
from stormdrop.model.options import ModelOptions
from stormdrop.model.run import apply_records, commit_best, interleaved
from stormdrop.model.tune import extract_tasks, tune_model
from stormdrop.storage.database import Database
from stormdrop.target import canonical, host_target
from stormdrop.workloads.models import load_model, parse_input_shapes


def tiny_net(path, op="Relu"):
    """conv(3->8, 3x3) + bias -> relu -> conv(8->8, 3x3) -> relu -> flatten -> dense(8*8*8 -> 10)."""
    rng = np.random.default_rng(0)
    inits = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(8) * 0.1,
             "w2": rng.standard_normal((8, 8, 3, 3)) * 0.2, "w3": rng.standard_normal((512, 10)) * 0.05}
    nodes = [helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node(op, ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"], axis=1),
             helper.make_node("MatMul", ["f", "w3"], ["output"])]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(v.astype("float32"), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.slow
@pytest.mark.alone  # it compares kernel times in the model with the tuned ones
def test_tiny_onnx_network_tuned_compiled_and_matched(tmp_path):
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    out = tmp_path / "tiny.so"
    result = tune_model(path,
                        ModelOptions(trials=24, trials_per_task=4, output=str(out), seed=0, in_model_candidates=3),
                        db=tmp_path / "m.db")
    assert result.model == "tiny"
    assert len(result.tasks) >= 3  # two convolutions (with their epilogues) and the dense layer, at least
    assert all(t.verified for t in result.tasks)
    assert sum(t.trials["storm"] + t.trials["raindrop"] for t in result.tasks) <= 24
    lat = result.latency_s
    assert lat["tuned"] > 0 and lat["onnxruntime"] > 0 and lat["openvino"] > 0  # OpenVINO: in the test extras
    assert lat["untuned"] is None  # ONNX Runtime is the reference: the slow untuned build is not run
    assert result.max_abs_error is not None and result.max_abs_error < 1e-3
    assert out.exists() and out.stat().st_size > 0
    # CPU weights are layout-free: tuned convolutions read packed weights, folded at compile time,
    # and the compiled model still matched ONNX Runtime above.
    assert any("TransformLayout" in (t.trace_json or "") for t in result.tasks)
    # ... and the weight re-layouts those tuned records ask for are folded away: the module
    # that is compiled computes nothing per call on constants alone, though the records
    # applied without the folding step do.
    model = load_model(path)
    fused, tasks = extract_tasks(model, host_target())
    mdb = ms.database.MemoryDatabase()
    with Database(tmp_path / "m.db") as db:
        for kernel, _ in tasks:
            entry = db.find_workload(kernel.mod)
            best = db.best(entry.workload_id, canonical(host_target()), k=1)
            commit_best(mdb, kernel.mod, best[0].trace_json, best[0].mean, host_target())
    with host_target(), mdb, tvm.transform.PassContext(opt_level=3):
        unfolded = relax.transform.SplitLayoutRewritePreproc()(
            relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(fused))
    assert weight_transforms(unfolded) >= 1
    assert weight_transforms(apply_records(fused, mdb, host_target())) == 0
    doc = result.to_json()
    assert set(doc["latency_s"]) == {"untuned", "tuned", "onnxruntime", "openvino"}
    # Every task deploys one of its stored records (its best, or another of its 3 best that ran
    # faster inside the compiled model), noted in the database for `bench` to compile the same.
    key = canonical(host_target())
    with Database(tmp_path / "m.db") as db:
        noted = deployed_keys(db, "tiny", key)
        deployed = [db.lookup(int(wid), key, k) for wid, k in noted.items()]
        assert deployed_keys(db, "tiny", "llvm -some-other-target") == {}
    assert len(noted) == len(result.tasks) and all(r is not None and r.ok for r in deployed)
    assert set(doc["in_model_choice"]["deployed"]) <= {t.name for t in result.tasks}

    # `stormdrop bench --model` compiles from the same database: every task tuned, output checked.
    js = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "-m", "stormdrop", "bench", "--model", path, "--db", str(tmp_path / "m.db"),
                        "--json", str(js)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    bench = json.loads(js.read_text())
    assert len(bench["tasks"]) == len(result.tasks)
    assert all(t["latency_s"] is not None and t["trials"] > 0 for t in bench["tasks"])
    assert bench["latency_s"]["tuned"] > 0 and bench["latency_s"]["onnxruntime"] > 0 and bench["latency_s"]["openvino"] > 0
    assert "tuned / onnxruntime = " in r.stdout and "tuned / openvino = " in r.stdout
    assert bench["max_abs_error"] < 1e-3
    assert sorted(t["latency_s"] for t in bench["tasks"]) == sorted(r.mean for r in deployed)
    assert f"{len(result.tasks)}/{len(result.tasks)} tasks tuned" in r.stdout
    # time to fast of the last tune, read against the latencies measured by this bench
    assert set(bench["faster_after_s"]) == {"onnxruntime", "openvino"} and "time to fast (the last tune): " in r.stdout
    for peer, after in bench["faster_after_s"].items():
        assert (after is not None) == (bench["latency_s"]["tuned"] < bench["latency_s"][peer])
        assert after is None or 0 <= after <= result.tuning_s
    # Each task's kernel is also timed inside the model: the convolutions and the dense layer
    # are called in every run, and their time there cannot exceed a few runs of the whole model.
    in_model = [t["in_model_s"] for t in bench["tasks"] if t["in_model_s"] is not None]
    assert len(in_model) >= 3 and all(s > 0 for s in in_model)
    assert sum(in_model) < 3 * bench["latency_s"]["tuned"] + 1e-3
    assert "inside the model" in r.stdout and "In model (us)" in r.stdout

    # The same records exported to MetaSchedule's format and imported into another database were
    # never checked by stormdrop there: `bench` refuses to compile them (one line), until a tune checks them.
    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "stormdrop", *argv], capture_output=True, text=True, timeout=600)

    assert cli("export", "--db", str(tmp_path / "m.db"), "--format", "metaschedule", "--out", str(tmp_path / "ms")
               ).returncode == 0
    assert cli("import", "--db", str(tmp_path / "imp.db"), str(tmp_path / "ms")).returncode == 0
    r = cli("bench", "--model", path, "--db", str(tmp_path / "imp.db"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "only imported records, never checked" in lines[0], r.stderr


def test_interleaved_peers_take_turns_and_report_medians():
    calls = []

    def timer(name, samples):
        it = iter(samples)
        return lambda: calls.append(name) or next(it)

    got = interleaved({"a": timer("a", [3.0, 1.0, 2.0]), "b": timer("b", [5.0, 9.0, 4.0])}, rounds=3)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert got == {"a": 2.0, "b": 5.0}


@pytest.mark.slow
def test_bench_without_records_is_one_error_line(tmp_path):
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    from stormdrop.storage.database import Database

    Database(tmp_path / "empty.db").close()
    r = subprocess.run([sys.executable, "-m", "stormdrop", "bench", "--model", path, "--db", str(tmp_path / "empty.db")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no record" in lines[0], r.stderr


def test_input_shape_override_and_batch(tmp_path):
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    assert load_model(path, batch=2).inputs["input"][0] == (2, 3, 8, 8)
    assert load_model(path, input_shapes=parse_input_shapes(["input:3x3x8x8"])).inputs["input"][0] == (3, 3, 8, 8)
    with pytest.raises(SpecError, match="no input"):
        load_model(path, input_shapes={"nope": (1,)})
    with pytest.raises(SpecError, match="NAME:1x3x224x224"):
        parse_input_shapes(["input=1x3"])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unsupported", "corrupt", "missing"])
def test_bad_models_give_one_error_line_and_exit_2(tmp_path, case):
    if case == "unsupported":
        path = tiny_net(str(tmp_path / "bad.onnx"))
        model = onnx.load(path)
        model.graph.node[1].op_type = "StormdropNoSuchOp"
        model.graph.node[1].domain = ""
        onnx.save(model, path)
    elif case == "corrupt":
        path = str(tmp_path / "corrupt.onnx")
        with open(path, "wb") as f:
            f.write(b"\x08\x07garbage" * 50)
    else:
        path = str(tmp_path / "missing.onnx")
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--model", path, "--trials", "2",
                        "--db", str(tmp_path / "x.db")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stormdrop: error:"), r.stderr
    assert {"unsupported": "StormdropNoSuchOp", "corrupt": "not a valid ONNX", "missing": "no such file"}[case] in lines[0]


@pytest.mark.slow
def test_zoo_cli_lists_and_exports(tmp_path):
    r = subprocess.run([sys.executable, "-m", "stormdrop", "zoo", "list"], capture_output=True, text=True)
    assert r.returncode == 0 and "resnet18" in r.stdout.split() and "bert_base" in r.stdout.split()
    out = tmp_path / "r.onnx"
    r = subprocess.run([sys.executable, "-m", "stormdrop", "zoo", "export", "mobilenet_v2", str(out),
                        "--resolution", "32"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load_model(str(out)).inputs["input"][0] == (1, 3, 32, 32)


@pytest.mark.slow
def test_trials_is_a_hard_cap(tmp_path):
    """--trials is never exceeded, even when it is no multiple of the batch or the task count."""
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    result = tune_model(path, ModelOptions(trials=7, trials_per_task=16, seed=0), db=tmp_path / "c.db")
    total = sum(t.trials["reuse"] + t.trials["storm"] + t.trials["raindrop"] for t in result.tasks)
    assert 5 <= total <= 7
    assert result.stopped_by == "the trial budget"


@pytest.mark.slow
def test_a_small_trial_cap_leaves_the_raindrop_its_share(tmp_path):
    """--trials 24 over the tiny network's tasks (per-task cap 128, storm batches of 16): each task's
    storm stops at half its share of the cap and the other half goes to raindrops (before, the
    tasks' first storm batches took all 24 trials and no raindrop ran)."""
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    result = tune_model(path, ModelOptions(trials=24, seed=0), db=tmp_path / "s.db")
    share = 24 // (2 * len(result.tasks))
    storms = [t.trials["reuse"] + t.trials["storm"] for t in result.tasks]
    assert all(s <= max(2, share) for s in storms), storms
    drops = [t.trials["raindrop"] for t in result.tasks]
    assert sum(drops) >= 24 / 2 - 2 and sum(storms) + sum(drops) <= 24, (storms, drops)
    assert all(t.verified for t in result.tasks)


@pytest.mark.slow
@pytest.mark.alone
def test_cli_time_budget_keeps_tuning_past_the_per_task_cap(tmp_path):
    """--time-budget alone: a task at its --trials-per-task cap is not a reason to stop with time
    left; the costliest tasks get more rounds until the budget is spent. The .so export is quiet."""
    budget_s = 30  # it runs alone (marked): no second test process takes the cores
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    js, so = tmp_path / "t.json", tmp_path / "t.so"
    r = subprocess.run([sys.executable, "-m", "stormdrop", "tune", "--model", path, "--time-budget", str(budget_s),
                        "--trials-per-task", "2", "--db", str(tmp_path / "t.db"), "--output", str(so),
                        "--json", str(js), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(js.read_text())
    counts = [t["trials"]["reuse"] + t["trials"]["storm"] + t["trials"]["raindrop"] for t in doc["tasks"]]  # reuse: the storm's budget
    assert all(c >= 2 for c in counts) and max(c for c in counts) > 2, counts
    assert "stopped: the time budget" in r.stdout or "every task exhausted" in r.stdout, r.stdout[-500:]
    if "stopped: the time budget" in r.stdout:
        # spent, not overrun: the search stops when what is left is what verifying every task's
        # best and compiling the model take (it used to run to the budget and verify after it)
        assert budget_s / 2 <= doc["tuning_s"] <= budget_s + 5, doc["tuning_s"]
    assert "Share" in r.stdout  # each task's share of the model's time
    # where the time went: the four stages add up to the tuning time, the search took most of it
    stages = doc["stages_s"]
    assert list(stages) == ["tasks", "set_up", "search", "compile"] and min(stages.values()) >= 0, stages
    assert sum(stages.values()) == pytest.approx(doc["tuning_s"], abs=0.01) and stages["search"] > budget_s / 3
    assert "tuning time: tasks extracted " in r.stdout
    assert so.stat().st_size > 0
    assert not [p.name for p in tmp_path.iterdir() if "partial" in p.name or p.name.endswith(".tmp")]  # renamed whole
    assert "Scope Saving" not in r.stderr


@pytest.mark.slow
def test_a_killed_model_tune_resumes_losing_nothing_and_measuring_nothing_twice(tmp_path):
    """SIGKILL a `tune --model` once it has committed a random number of records, re-run it: every
    record committed before the kill is still there, unchanged; the re-run measures no candidate
    the killed run measured; every task finishes verified."""
    import os
    import random
    import signal
    import sqlite3
    import time

    path = tiny_net(str(tmp_path / "tiny.onnx"))
    db, js = tmp_path / "k.db", tmp_path / "k.json"
    args = [sys.executable, "-m", "stormdrop", "tune", "--model", path, "--trials", "16", "--trials-per-task", "8",
            "--batch-size", "4", "--db", str(db), "--no-progress"]

    def rows():
        try:
            with sqlite3.connect(db) as con:
                return con.execute("SELECT * FROM records ORDER BY record_id").fetchall()
        except sqlite3.Error:
            return []

    kill_at = random.Random(os.getpid()).randrange(3, 11)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(rows()) < kill_at and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = rows()
    assert kill_at <= len(before) < 16, f"the kill (at {kill_at} records) came too late: {len(before)}"
    r = subprocess.run(args + ["--json", str(js)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    after = rows()
    assert after[: len(before)] == before, "records committed before the kill changed"
    doc = json.loads(js.read_text())
    measured = sum(t["trials"]["reuse"] + t["trials"]["storm"] + t["trials"]["raindrop"] for t in doc["tasks"])
    assert measured == len(after) - len(before), "the re-run measured a candidate the killed run had measured"
    assert len(after) <= 16, "--trials counts the killed run's measurements too"
    assert all(t["verified"] for t in doc["tasks"])


def test_a_model_tune_times_its_candidates_cold_unless_told_not_to(tmp_path, monkeypatch):
    """tune --model on a CPU measures with the caches flushed; --no-cache-flush measures warm."""
    import stormdrop.model.tune as model_tune

    seen = []

    class Stop(Exception):
        pass

    def spy(target, config=None):
        seen.append(config.cache_flush)
        raise Stop

    monkeypatch.setattr(model_tune, "Gateway", spy)
    path = tiny_net(str(tmp_path / "tiny.onnx"))
    from stormdrop.cli.main import main

    for flag in ([], ["--no-cache-flush"]):  # stopped where the gateway would start (an error line, exit 1)
        assert main(["tune", "--model", path, "--trials", "2", "--db", str(tmp_path / "c.db"), "--no-progress",
                     *flag]) == 1
    assert seen == [True, False]
