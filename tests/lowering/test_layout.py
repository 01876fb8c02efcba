"""Channel-blocked layouts and fast math in the model pipeline: outputs match ONNX Runtime.

Compiled untuned (an empty record database) so that only the rewrite is under test: the
convolutions, pooling, residual adds and concats of tiny zoo CNNs in NCHW{b}c (or NHWC),
weights transformed once at compile time, never per call.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.errors import SpecError
from stormdrop.lowering import fastmath
from stormdrop.lowering.layout import channel_block, weight_transforms
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import (
    apply_records,
    max_abs_diff,
    random_inputs,
    run_model,
)
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads.models import load_model

TARGET = parse_target(None)


@functools.cache
def _model(name: str):
    if name == "bert_base":
        from stormdrop.workloads.models import from_onnx_model
        from stormdrop.workloads.zoo import build_zoo_model

        return from_onnx_model(build_zoo_model("bert_base", seq_len=8, layers=2), "bert_small")
    return load_model(name, resolution=32)


def _compiled_untuned(name: str, layout: str, fast_math: bool = True, winograd: str = "auto",
                      combine_matmuls: bool = False):
    model = _model(name)
    fused, tasks = extract_tasks(model, TARGET, Lowering(layout, fast_math, winograd, combine_matmuls))
    mod = apply_records(fused, ms.database.MemoryDatabase(), TARGET)
    inputs = random_inputs(model, 0)
    outs, _ = run_model(tvm.compile(mod, target=TARGET), inputs, TARGET, time_it=False)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    err, scale = max_abs_diff(outs, ref)
    return mod, [k.name for k, _ in tasks], err / scale


# 3x3, strided, 1x1, depthwise, max/avg pooling, residual add (resnet18, mobilenet_v2), concat (squeezenet, googlenet)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "squeezenet1_0", "googlenet"])
def test_default_layout_is_nhwc_matches_onnxruntime_without_per_call_weight_transforms(name):
    mod, tasks, rel_err = _compiled_untuned(name, "auto")
    assert rel_err < 1e-4
    assert weight_transforms(mod) == 0
    text = mod.script()
    assert 'data_layout="NCHW"' not in text and "conv2d_NCHWc" not in text
    # activations change layout only before the classifier, not
    # between convolutions (MobileNet's ReLU6 included: it fuses into its convolution)
    assert sum("layout_transform" in t or "transpose" in t for t in tasks) <= 1, tasks
    # the model's NCHW input is read by its first convolution itself (read_inputs_nchw): no transpose kernel
    assert sum("conv2d_nchw_nhwc" in t for t in tasks) == 1, tasks
    if name == "mobilenet_v2":
        assert any("conv2d" in t and "minimum" in t for t in tasks), tasks


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_blocked_layout_matches_onnxruntime_without_per_call_weight_transforms(name):
    mod, tasks, rel_err = _compiled_untuned(name, "blocked")
    assert rel_err < 1e-4
    assert weight_transforms(mod) == 0
    if channel_block(TARGET) is not None:  # x86 with AVX2 or AVX-512: every CPU this runs on here
        blocked = [t for t in tasks if "NCHWc" in t]
        assert len(blocked) >= 0.8 * sum("conv2d" in t for t in tasks)
        if name == "mobilenet_v2":
            assert any("depthwise_conv2d_NCHWc" in t for t in tasks)


@pytest.mark.slow
@pytest.mark.parametrize("m", ["2", "4"])
def test_winograd_convolutions_match_onnxruntime_without_per_call_weight_transforms(m):
    """Every 3x3 stride-1 convolution of a tiny ResNet-18 as Winograd F(m x m, 3 x 3) (8x8 down
    to 1x1 outputs: partial tiles), residual adds and ReLUs fused into them, the weights'
    transform folded at compile time."""
    mod, tasks, rel_err = _compiled_untuned("resnet18", "auto", winograd=m)
    assert rel_err < 1e-4
    assert weight_transforms(mod) == 0
    winograd = [t for t in tasks if "conv2d_winograd" in t]
    assert len(winograd) >= 4, tasks  # one or two per stage (with and without the residual add)
    assert any("add" in t and "relu" in t for t in winograd), winograd
    assert any("conv2d" in t and "winograd" not in t for t in tasks)  # the 7x7, strided and 1x1 stay direct


def test_winograd_needs_trials_a_small_cap_or_a_short_time_budget_keeps_convolutions_direct():
    from stormdrop.lowering.pipeline import Lowering
    from stormdrop.lowering.winograd import MIN_TRIALS_PER_TASK, TRIAL_S

    auto = Lowering()
    assert auto.for_budget(128, 11).winograd == "off"  # 11 trials a task
    assert auto.for_budget(64 * 11, 11) is auto and auto.for_budget(None, 11) is auto  # enough, or no budget
    enough_s = 11 * MIN_TRIALS_PER_TASK * TRIAL_S  # a time budget counted at TRIAL_S a trial
    assert auto.for_budget(None, 11, 60.0).winograd == "off" and auto.for_budget(None, 11, enough_s) is auto
    assert auto.for_budget(64 * 11, 11, 60.0).winograd == "off"  # the smaller of the two budgets
    assert Lowering(winograd="4").for_budget(128, 11).winograd == "4"  # said, not auto
    noted = {"pad_conv_columns": True, "concat_copies": True, "nhwc_shuffles": True,
             "pad_narrow_columns": True, "pad_half_columns": True, "pad_conv_width": True}  # a tune since all
    assert auto.as_tuned({**noted, "winograd": "off"}).winograd == "off" and auto.as_tuned(noted) is auto
    assert Lowering(winograd="2").as_tuned({**noted, "winograd": "off"}).winograd == "2"
    # a tune before them (its note says nothing of them), or without them: compiled without them
    assert auto.as_tuned({}) == Lowering(pad_conv_columns=False, concat_copies=False, nhwc_shuffles=False,
                                         pad_narrow_columns=False, pad_half_columns=False, pad_conv_width=False)
    assert auto.as_tuned({**noted, "pad_conv_columns": False, "winograd": "off"}) == \
        Lowering(winograd="off", pad_conv_columns=False)
    assert auto.as_tuned({**noted, "concat_copies": False}) == Lowering(concat_copies=False)


@pytest.mark.slow
def test_winograd_auto_keeps_small_images_and_few_channels_direct():
    from stormdrop.lowering.winograd import choose_tile

    assert choose_tile("auto", (56, 56), 64, 64) == 4
    assert choose_tile("auto", (14, 14), 256, 256) == 2
    assert choose_tile("auto", (7, 7), 512, 512) is None  # weight-bound inside a model
    assert choose_tile("auto", (4, 4), 512, 512) is None
    assert choose_tile("auto", (56, 56), 8, 64) is None
    assert choose_tile("off", (56, 56), 64, 64) is None
    assert choose_tile("4", (4, 4), 512, 512) == 4
    # small convolutions: the transforms cost more than they save (bench_winograd, 32 + 32 trials)
    assert choose_tile("auto", (32, 32), 32, 32) is None  # 18.9 MFLOPs direct: Winograd 0.92x
    assert choose_tile("auto", (64, 64), 16, 16) is None  # 0.32x
    assert choose_tile("auto", (14, 14), 64, 64) is None  # 0.60x
    assert choose_tile("auto", (28, 28), 48, 48) == 4  # 32.5 MFLOPs: Winograd 1.39x
    _, tasks, _ = _compiled_untuned("resnet18", "auto")  # 32x32 input: every 3x3 output is 8x8 or less
    assert not any("winograd" in t for t in tasks)


@pytest.mark.slow
def test_winograd_tasks_count_a_direct_convolutions_flops():
    """So that GFLOPS (task tables, a model's effective GFLOPS) compare Winograd and direct
    kernels on the same work: the model's conv FLOPs are the same with Winograd on or off."""
    model = _model("resnet18")

    def conv_flops(winograd):
        _, tasks = extract_tasks(model, TARGET, Lowering(winograd=winograd))
        return sum(k.flops * w for k, w in tasks if "conv2d" in k.name), [k.name for k, _ in tasks]

    direct, _ = conv_flops("off")
    flops, names = conv_flops("4")
    assert any("winograd" in n for n in names)
    assert abs(flops - direct) <= 0.01 * direct


def test_unknown_winograd_mode_is_a_spec_error():
    with pytest.raises(SpecError, match="--winograd"):
        extract_tasks(_model("resnet18"), TARGET, Lowering("auto", True, "8"))


@pytest.mark.slow
def test_nchw_layout_keeps_the_model_as_it_is():
    mod, tasks, rel_err = _compiled_untuned("resnet18", "nchw")
    assert rel_err < 1e-4
    assert not any("NCHWc" in t for t in tasks)


def test_weight_transform_counter_sees_a_transform_on_constants():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4), "float32"))
    w = relax.const(np.ones((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w))
            out = bb.emit_output(relax.op.matmul(x, wt))
        bb.emit_func_output(out)
    with TARGET:
        mod = relax.transform.LegalizeOps()(bb.get())
    assert weight_transforms(mod) == 1
    with TARGET:
        assert weight_transforms(relax.transform.FoldConstant()(mod)) == 0


def test_weight_prepacks_fold_with_each_function_built_once(monkeypatch):
    # Relax's FoldConstant builds a prepack function again at every call site (MobileBERT: 360
    # builds, 25 s of its compile); fold_weight_prepacks builds each once, same constants
    from tvm import relax, te

    from stormdrop.tvm_compat.relax_passes import fold_weight_prepacks

    w = te.placeholder((4, 3), "float32", name="w")
    pack = te.create_prim_func([w, te.compute((3, 4), lambda i, j: w[j, i] * 2.0, name="packed")])
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((4, 3)).astype("float32") for _ in range(3)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((3, 4), "float32"))
    with bb.function("main", [x]):
        gv = bb.add_func(pack.without_attr("global_symbol"), "dense_weight_prepack")  # as the split makes it
        with bb.dataflow():
            out = x
            for a in weights:
                packed = bb.emit(relax.call_tir(gv, [relax.const(a)], relax.TensorType((3, 4), "float32")))
                out = bb.emit(relax.op.add(out, packed))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    mod = bb.get()
    builds = []
    compile_ = tvm.compile
    monkeypatch.setattr(tvm, "compile", lambda *a, **k: builds.append(1) or compile_(*a, **k))
    folded = fold_weight_prepacks(mod)
    monkeypatch.undo()
    assert len(builds) == 1
    assert "dense_weight_prepack" not in [g.name_hint for g in folded.get_global_vars()]
    assert weight_transforms(folded) == 0
    with TARGET:
        folded, reference = (relax.transform.LegalizeOps()(m) for m in (folded, relax.transform.FoldConstant()(mod)))
    x_in = rng.standard_normal((3, 4)).astype("float32")
    outs = [run_model(tvm.compile(m, target=TARGET), {"x": x_in}, TARGET, time_it=False)[0][0]
            for m in (folded, reference)]
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], x_in + 2 * sum(a.T for a in weights), rtol=1e-6)


def test_unknown_layout_is_a_spec_error():
    with pytest.raises(SpecError, match="--layout"):
        extract_tasks(_model("resnet18"), TARGET, Lowering("nc4hw"))


@pytest.mark.slow
def test_fast_math_encoder_matches_onnxruntime():
    mod, tasks, rel_err = _compiled_untuned("bert_base", "blocked", fast_math=True)
    assert rel_err < 1e-4
    assert any("fast_erf" in t or "fast_" in t for t in tasks) or "fast_erf" in mod.script()


def _relax_matmuls(mod) -> int:
    from tvm import relax

    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call) and isinstance(
        e.op, tvm.ir.Op) and e.op.name == "relax.matmul" else None)
    return len(calls)


@pytest.mark.slow
def test_combined_qkv_projections_are_one_gemm_and_match_onnxruntime():
    from stormdrop.tvm_compat.relax_passes import combine_parallel_matmuls
    from stormdrop.workloads import kernel_args

    model = _model("bert_base")  # 2 layers, hidden 768
    merged = combine_parallel_matmuls(model.mod)
    assert _relax_matmuls(merged) == _relax_matmuls(model.mod) - 2 * 2  # 3 projections -> 1, per layer

    def widths(tasks):
        return {shape[-1] for k, _ in tasks for _, shape, _ in kernel_args(k.mod) if shape}

    assert 3 * 768 in widths(extract_tasks(model, TARGET, Lowering(combine_matmuls=True))[1])  # Q, K and V at once
    assert 3 * 768 not in widths(extract_tasks(model, TARGET)[1])  # off by default
    _, _, rel_err = _compiled_untuned("bert_base", "auto", combine_matmuls=True)
    assert rel_err < 1e-4


@pytest.mark.parametrize("op", ["erf", "exp", "tanh", "sigmoid", "log"])
def test_fast_math_accuracy(op):
    from scipy import special
    from tvm import relax

    xs = np.linspace(-12 if op != "exp" else -80, 12 if op != "exp" else 80, 200_001).astype("float32")
    if op == "log":  # subnormals to 1e30, and the mantissa's whole range near 1
        xs = np.concatenate([np.geomspace(1e-44, 1e30, 100_001), np.linspace(0.5, 2.0, 100_000)]).astype("float32")
    exact = {"erf": special.erf, "exp": np.exp, "tanh": np.tanh, "sigmoid": special.expit,
             "log": np.log}[op](xs.astype("float64"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(xs.shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, op)(x))
        bb.emit_func_output(out)
    with TARGET:
        mod = relax.transform.LegalizeOps(fastmath.legalizations())(bb.get())
    assert f"fast_{op}" in mod.script()
    dev = tvm.cpu()
    got = relax.VirtualMachine(tvm.compile(mod, target=TARGET), dev)["main"](tvm.runtime.tensor(xs, dev)).numpy()
    rel = np.abs(got - exact) / np.maximum(np.abs(exact), 1e-30 if op == "exp" else 1.0)
    assert float(rel.max()) < 2e-6, f"{op}: max error {rel.max():.3g} at x={xs[int(rel.argmax())]}"
