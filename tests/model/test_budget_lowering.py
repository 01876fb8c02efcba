"""A model's lowering under a small budget: every convolution direct (a Winograd kernel needs more
trials than the budget gives its task), unless the donors (the schedule hub) hold every Winograd
kernel of the model (``model.tune.budgeted_tasks``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from stormdrop.model.options import ModelOptions
from stormdrop.model.tune import extract_tasks, tune_model
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.workloads.models import load_model


def conv48(tmp_path, channels: int = 48) -> str:
    """A 1x1 then a 48-channel (``channels``) 3x3 convolution at 28x28 (a Winograd kernel under
    --winograd auto)."""
    rng = np.random.default_rng(0)
    c = channels
    w = numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.05).astype("float32"), "w")
    w1 = numpy_helper.from_array((rng.standard_normal((c, 3, 1, 1)) * 0.3).astype("float32"), "w1")
    graph = helper.make_graph(  # a 1x1 first: the model's NCHW input is read by it, the 3x3 gets NHWC
        [helper.make_node("Conv", ["input", "w1"], ["p"], kernel_shape=[1, 1]),
         helper.make_node("Conv", ["p", "w"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         helper.make_node("Relu", ["c"], ["output"])], "conv48",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 28, 28])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, c, 28, 28])], initializer=[w, w1])
    graph.name = f"conv{c}"
    return _saved(graph, tmp_path)


def _saved(graph, tmp_path) -> str:
    """``graph`` as an opset-17 ONNX file in ``tmp_path``, named after it; its path."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(tmp_path / f"{graph.name}.onnx")
    onnx.save(model, path)
    return path


def test_the_tasks_a_budget_tunes_are_direct_without_donors_of_every_winograd_kernel(tmp_path):
    """``budgeted_tasks`` (what ``tune_model`` and the time-to-fast benchmark's exact-task count use):
    too small a budget for Winograd kernels lowers every convolution direct unless reuse is on and
    the donors hold each one; a budget large enough keeps what the lowering gave."""
    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.model.tune import budgeted_tasks

    model, target = load_model(conv48(tmp_path)), host_target()
    extracted = extract_tasks(model, target, Lowering())
    assert any("winograd" in k.name for k, _ in extracted[1])
    for budget, reuse in [((6, None), True), ((None, 30.0), True), ((6, None), False)]:
        _, tasks, lowering = budgeted_tasks(model, target, Lowering(), (Lowering(), extracted), budget, [], reuse)
        assert lowering.winograd == "off" and tasks and not any("winograd" in k.name for k, _ in tasks)
    fused, tasks, lowering = budgeted_tasks(model, target, Lowering(), (Lowering(), extracted), (None, None), [], True)
    assert (fused, tasks) == extracted and lowering == Lowering()


def test_a_budget_too_small_for_any_winograd_kernel_extracts_the_model_once(tmp_path, monkeypatch):
    """Two convolutions are two tasks at least: 6 trials (or 30 s) cannot give a Winograd kernel
    its trials whatever the task count, so the tasks are extracted once, direct (an extraction
    lowers the whole model: seconds for a large one), unless reuse could start every Winograd kernel
    from the donors (a donor holds a Winograd kernel of each shape: then as the lowering says, as
    before). A budget that may leave them enough trials extracts as the lowering says too."""
    from types import SimpleNamespace

    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.lowering.winograd import kernel_key
    from stormdrop.model import tune as model_tune

    model, target = load_model(conv48(tmp_path)), host_target()
    convolutions, keys = Lowering().convolutions(model.mod, target)
    assert convolutions == 2 and keys == [((1, 28, 28, 48), 48, 6)]
    _, tasks = extract_tasks(model, target, Lowering())  # the Winograd kernel's own arguments say the same
    winograd = [k for k, _ in tasks if "winograd" in k.name]
    assert [kernel_key(k.mod) for k in winograd] == keys
    assert Lowering(winograd="off").convolutions(model.mod, target) == (2, [])

    lowerings = []
    real = model_tune.extract_tasks
    monkeypatch.setattr(model_tune, "extract_tasks", lambda m, t, lo=None: lowerings.append(lo) or real(m, t, lo))

    def extracted_with(budget, donors=(), reuse=True):
        lowerings.clear()
        _, tasks, lowering = model_tune.budgeted_extraction(model, target, Lowering(), budget, list(donors), reuse)
        assert any("winograd" in k.name for k, _ in tasks) == (lowering == Lowering())
        return list(lowerings), lowering

    off = Lowering(winograd="off")
    for budget in [(6, None), (None, 30.0)]:
        assert extracted_with(budget) == ([off], off)  # once, direct
    # a donor holding a Winograd kernel of that shape (not this workload: no records either)
    donor = SimpleNamespace(modules_of_class=lambda word: [winograd[0].mod] * (word == "conv2d_winograd"),
                            find_workload=lambda mod: None)
    assert extracted_with((6, None), [donor]) == ([Lowering(), off], off)
    assert extracted_with((6, None), [donor], reuse=False) == ([off], off)
    other = SimpleNamespace(modules_of_class=lambda word: [], find_workload=lambda mod: None)
    assert extracted_with((6, None), [other]) == ([off], off)
    # 128 trials could be 64 for each of two tasks: as the lowering says, then direct (more tasks
    # than two); 64 for each task there is: once, Winograd kept
    assert extracted_with((128, None)) == ([Lowering(), off], off)
    assert extracted_with((64 * len(tasks), None)) == ([Lowering()], Lowering())


@pytest.mark.slow
def test_a_small_trial_cap_keeps_winograd_where_the_hub_holds_its_kernels(tmp_path):
    """Under the same small cap, a hub holding tuned Winograd kernels of every Winograd task of the
    model keeps them Winograd (reuse starts from the hub's schedules, no search needed to reach
    them). The hub's build tunes them under that cap too, its lowering kept as given
    (``lowering_for_budget=False``, ``tools/build_hub.py``'s ``+winograd``)."""
    from stormdrop.search.options import SearchOptions
    from stormdrop.storage.hub import isa_class
    from stormdrop.storage.hub_writer import write_hub

    path = conv48(tmp_path)
    tuned = tune_model(path, ModelOptions(trials=6, seed=0, lowering_for_budget=False,
                                          search=SearchOptions(hub=False)), db=tmp_path / "first.db")
    assert any("winograd" in t.name for t in tuned.tasks)  # the cap alone would have made it direct
    hub = tmp_path / "hub.jsonl.gz"
    with Database(tmp_path / "first.db", read_only=True) as db:
        write_hub(db, hub, isa_class(tuned.target))
    kept = tune_model(path, ModelOptions(trials=6, seed=0, search=SearchOptions(hub=str(hub))), db=tmp_path / "k.db")
    assert sorted(t.name for t in kept.tasks) == sorted(t.name for t in tuned.tasks)
    assert all(t.trials["reuse"] >= 1 for t in kept.tasks)  # each started from the hub's schedule
    assert kept.max_abs_error is not None and kept.max_abs_error < 1e-3
    # without the hub the same cap keeps them direct: test_a_small_trial_cap_tunes_direct_convolutions...


@pytest.mark.slow
def test_a_small_trial_cap_tunes_direct_convolutions_and_bench_builds_them(tmp_path):
    """A 48-channel 3x3 convolution at 28x28 is a Winograd kernel under --winograd auto, but 6
    trials over the model's tasks are too few to tune one: the tune keeps it direct, notes so,
    and `bench` (default lowering) compiles the tasks that were tuned, not Winograd ones."""
    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.model.bench import bench_model

    path = conv48(tmp_path)
    _, lowered = extract_tasks(load_model(path), host_target(), Lowering())
    assert any("winograd" in k.name for k, _ in lowered)  # what a large budget tunes
    result = tune_model(path, ModelOptions(trials=6, seed=0), db=tmp_path / "w.db")
    assert result.tasks and not any("winograd" in t.name for t in result.tasks)
    assert result.max_abs_error is not None and result.max_abs_error < 1e-3
    with Database(tmp_path / "w.db") as db:
        bench = bench_model(path, db=db)
    assert sorted(r.name for r in bench.tasks) == sorted(t.name for t in result.tasks)
    assert all(r.latency_s is not None for r in bench.tasks)
    # the same through the public timing module, as the guide's "From Python" example does it
    import stormdrop
    from stormdrop import timing
    from stormdrop.target import num_cores

    model, target = stormdrop.load_model(path), host_target()
    inputs = timing.random_inputs(model)
    found = timing.peers(model, inputs, num_cores(target))
    with stormdrop.open_database(tmp_path / "w.db", read_only=True) as db:
        executable, rows = timing.tuned_build(model, db, target)
    assert [r.name for r in rows] == [r.name for r in bench.tasks]
    err, scale = timing.max_abs_diff(timing.run_tvm(executable, inputs, target, time_it=False)[0], found.reference)
    assert err <= 1e-3 * scale
    latency_s = timing.in_turns({**found.timers, "stormdrop": timing.tvm_timer(executable, inputs, target)}, rounds=1)
    assert set(latency_s) == {"onnxruntime", "openvino", "stormdrop"} and min(latency_s.values()) > 0


@pytest.mark.slow
def test_bench_builds_a_model_as_tuned_with_or_without_padded_convolution_columns(tmp_path):
    """A 1000-channel 1x1 convolution (a SqueezeNet's classifier) tuned without padded columns (as
    every tune before ``Lowering.pad_conv_columns`` was): `bench` with them on compiles the tasks
    that were tuned; a tune with them on notes so, and its tasks are the padded ones."""
    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.model.bench import bench_model
    from stormdrop.target import vector_lanes

    if vector_lanes(host_target()) != 16:
        pytest.skip("1000 channels pad nearly free to a multiple of 16 lanes only (AVX-512)")
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((1000, 16, 1, 1)) * 0.2).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "w"], ["c"], kernel_shape=[1, 1]), helper.make_node("Relu", ["c"], ["output"])],
        "head", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 16, 4, 4])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 1000, 4, 4])], initializer=[w])
    path = _saved(graph, tmp_path)
    padded = Lowering(pad_conv_columns=True)
    for pad in (False, True):
        db_path = tmp_path / f"pad{pad}.db"
        result = tune_model(path, ModelOptions(trials=6, seed=0, lowering=Lowering(pad_conv_columns=pad)), db=db_path)
        assert any("columns" in t.name for t in result.tasks) == pad, [t.name for t in result.tasks]
        with Database(db_path) as db:
            bench = bench_model(path, db=db, lowering=padded)
        assert sorted(r.name for r in bench.tasks) == sorted(t.name for t in result.tasks), pad
        assert all(r.latency_s is not None for r in bench.tasks)


@pytest.mark.slow
def test_bench_builds_a_model_as_tuned_with_or_without_concatenations_as_copies(tmp_path):
    """Two convolutions concatenated, a kernel of its own (a third convolution reads it), tuned with
    TVM's concatenation (as every tune before ``Lowering.concat_copies`` was on by default): `bench`
    with copies on compiles the concatenation that was tuned; a tune with them notes so, and its
    concatenation is the copies."""
    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.model.bench import bench_model

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype("float32"), n)
               for n, s in (("a", (16, 8, 1, 1)), ("b", (16, 8, 3, 3)), ("c", (8, 32, 1, 1)))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "a"], ["pa"], kernel_shape=[1, 1]),
         helper.make_node("Conv", ["input", "b"], ["pb"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Concat", ["pa", "pb"], ["cat"], axis=1),
         helper.make_node("Conv", ["cat", "c"], ["output"], kernel_shape=[1, 1])], "fire",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 6, 6])], initializer=weights)
    path = _saved(graph, tmp_path)
    model, target = load_model(path), host_target()

    def concatenation(copies: bool):
        _, tasks = extract_tasks(model, target, Lowering(concat_copies=copies))
        found = [k.mod for k, _ in tasks if k.name.startswith("concatenate")]
        assert len(found) == 1, [k.name for k, _ in tasks]
        return found[0]

    assert Lowering().concat_copies
    for copies in (False, True):
        db_path = tmp_path / f"copies{copies}.db"
        result = tune_model(path, ModelOptions(trials=8, seed=0, lowering=Lowering(concat_copies=copies)), db=db_path)
        with Database(db_path) as db:
            assert db.model_notes()[model.name]["concat_copies"] == copies
            assert db.find_workload(concatenation(copies)) is not None
            assert db.find_workload(concatenation(not copies)) is None
            bench = bench_model(path, db=db)  # the default lowering: copies on
        assert sorted(r.name for r in bench.tasks) == sorted(t.name for t in result.tasks), copies
        assert all(r.latency_s is not None for r in bench.tasks), copies


@pytest.mark.slow
def test_a_trial_cap_below_the_task_count_still_gives_every_task_a_schedule(tmp_path, caplog):
    """Four tasks under --trials 2: the cap is raised to four (a warning says so), and no task is
    left a naive loop nest."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype("float32"), n)
               for n, s in (("a", (16, 8, 3, 3)), ("b", (8, 16, 1, 1)))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["input", "a"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]), helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2],
                                                                  strides=[2, 2]),
         helper.make_node("Conv", ["p", "b"], ["d"], kernel_shape=[1, 1]),
         helper.make_node("GlobalAveragePool", ["d"], ["output"])], "four",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8, 1, 1])], initializer=weights)
    path = _saved(graph, tmp_path)
    with caplog.at_level("WARNING", logger="stormdrop"):
        result = tune_model(path, ModelOptions(trials=2, seed=0), db=tmp_path / "c.db")
    assert len(result.tasks) >= 3, [t.name for t in result.tasks]
    assert all(t.latency_s is not None for t in result.tasks), [(t.name, t.latency_s) for t in result.tasks]
    measured = sum(t.trials["reuse"] + t.trials["storm"] + t.trials["raindrop"] + t.trials["failed"] for t in result.tasks)
    assert measured == len(result.tasks)  # one each: the raised cap, no more
    told = [r.getMessage() for r in caplog.records if "--trials 2 cannot give" in r.getMessage()]
    assert len(told) == 1 and f"raised to {len(result.tasks)}" in told[0], told


def test_related_winograd_donors_keep_winograd_under_a_small_budget_where_switched_on(tmp_path):
    """``Lowering.winograd_related``: a donor holding a Winograd kernel of the same tile size for
    another shape (a transfer's donor, not this workload) keeps the model's Winograd kernels of 64
    channels under a budget too small for them, at extraction (``first_lowering``) and for the
    tasks (``budgeted_tasks``); one of another tile size does not, nor does reuse off, nor 48
    channels (``RELATED_MIN_CHANNELS``, input and output); with the switch off only the kernels
    themselves keep them."""
    from types import SimpleNamespace

    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.lowering.winograd import kernel_key
    from stormdrop.model import tune as model_tune
    from stormdrop.workloads import parse_kernel

    model, target = load_model(conv48(tmp_path, 64)), host_target()
    related = Lowering(winograd_related=True)
    alpha6, alpha4 = (parse_kernel(f"conv2d:N=1,C=32,H=16,W=16,K=32,R=3,S=3,pad=1,layout=NHWC,winograd={m}").mod
                      for m in (4, 2))
    assert kernel_key(alpha6)[1:] == (32, 6) and kernel_key(alpha4)[1:] == (32, 4)

    def donor(mod):
        return SimpleNamespace(modules_of_class=lambda word: [mod] * (word == "conv2d_winograd"),
                               find_workload=lambda m: None)

    def winograd_kept(lowering, donors, reuse=True, model=model):
        _, tasks, kept = model_tune.budgeted_extraction(model, target, lowering, (6, None), donors, reuse)
        assert any("winograd" in k.name for k, _ in tasks) == (kept == lowering)
        return kept == lowering

    assert winograd_kept(related, [donor(alpha6)])
    assert not winograd_kept(related, [donor(alpha6)], model=load_model(conv48(tmp_path)))
    assert not winograd_kept(related, [donor(alpha4)])
    assert not winograd_kept(related, [donor(alpha6)], reuse=False)
    assert not winograd_kept(Lowering(winograd_related=False), [donor(alpha6)])
    # the tasks' own check, given tasks extracted with Winograd (a first lowering that kept them)
    extracted = (related, extract_tasks(model, target, related))
    _, tasks, kept = model_tune.budgeted_tasks(model, target, related, extracted, (6, None), [donor(alpha6)], True)
    assert kept == related and any("winograd" in k.name for k, _ in tasks)
    _, tasks, kept = model_tune.budgeted_tasks(model, target, related, extracted, (6, None), [donor(alpha4)], True)
    assert kept.winograd == "off" and not any("winograd" in k.name for k, _ in tasks)
