"""Concatenations that are kernels of their own as one copy per input: the same output as ONNX
Runtime, no per-element choice of input left, fused concatenations left as TVM writes them, and
vector copies once the search's post-processing has scheduled them."""

from __future__ import annotations

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.lowering import concat
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)


def _blocks(func: tvm.tirx.PrimFunc) -> list[str]:
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def test_copies_write_each_input_into_its_slice_with_no_choice_of_input():
    func = concat.copies([[1, 4, 4, 3], [1, 4, 4, 16], [1, 4, 4, 5]], 3, "float32")
    assert _blocks(func) == ["T_concat_0", "T_concat_1", "T_concat_2"]
    assert "if_then_else" not in func.script()
    assert [[int(d) for d in a.shape] for a in ms.arg_info.ArgInfo.from_prim_func(func)][-1] == [1, 4, 4, 24]


def _model():
    """Three convolutions of one input (3, 16 and 5 channels) concatenated on the channel axis,
    a kernel of its own (a convolution reads it), and the input concatenated with itself on the
    height axis twice: once alone (an output), once fused with the ReLU that reads it."""
    g = GraphBuilder("concats", 0)
    x = g.input("x", (1, 8, 6, 6))
    parts = [g.conv(x, 3, 1), g.conv(x, 16, 3, pad=1), g.conv(x, 5, 1)]
    g.output(g.conv(g.concat(parts, axis=1), 4, 1))
    g.output(g.concat([x, x], axis=2), "rows")
    g.output(g.relu(g.concat([x, x], axis=3)), "columns")
    return from_onnx_model(g.model(), "concats")


def _concat_kernels(fused: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gv.name_hint: f for gv, f in fused.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and "concatenate" in gv.name_hint}


@pytest.mark.slow
def test_concatenations_alone_become_copies_fused_ones_stay_and_the_model_matches_onnxruntime():
    model = _model()
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for copies in (True, False):
        fused, _ = extract_tasks(model, TARGET, Lowering(concat_copies=copies))
        kernels = _concat_kernels(fused)
        alone = {n: f for n, f in kernels.items() if n.startswith("concatenate")}
        with_relu = {n: f for n, f in kernels.items() if n.startswith("fused_") and "relu" in n}
        assert len(alone) == 2 and len(with_relu) == 1, (copies, sorted(kernels))
        for func in alone.values():
            assert ("if_then_else" not in func.script()) == copies
            assert len(_blocks(func)) == (len(ms.arg_info.ArgInfo.from_prim_func(func)) - 1 if copies else 1)
        assert all("if_then_else" in f.script() for f in with_relu.values())
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        err, scale = max_abs_diff(outs, ref)
        assert err == 0.0 or err <= 1e-5 * scale, (copies, err, scale)


def test_only_tvms_concatenation_is_rewritten():
    x = tvm.te.placeholder((1, 4, 4, 3), name="x")
    relu = tvm.te.create_prim_func([x, tvm.topi.nn.relu(x)])
    y = tvm.te.placeholder((1, 4, 4, 3), name="y")
    cat = tvm.te.create_prim_func([x, y, tvm.topi.concatenate([x, y], axis=1)])
    mod = tvm.IRModule({"concatenate_relu": relu, "concatenate": cat, "fused_concatenate": cat})
    out = concat.as_copies(mod)
    assert out["concatenate_relu"].same_as(relu) and out["fused_concatenate"].same_as(cat)
    assert _blocks(out["concatenate"]) == ["T_concat_0", "T_concat_1"]
    assert [[int(d) for d in a.shape] for a in ms.arg_info.ArgInfo.from_prim_func(out["concatenate"])] == \
        [[1, 4, 4, 3], [1, 4, 4, 3], [1, 8, 4, 3]]
    unchanged = tvm.IRModule({"concatenate_relu": relu})
    assert concat.as_copies(unchanged).same_as(unchanged)


def _scheduled_ir(func: tvm.tirx.PrimFunc) -> str:
    """The LLVM IR of ``func`` after the CPU post-processing parallelizes and vectorizes it."""
    func = func.with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    sch = tvm.s_tir.Schedule(mod)
    root = sch.get_sblock("root")
    sch.annotate(root, "meta_schedule.parallel", 32)
    sch.annotate(root, "meta_schedule.vectorize", 64)
    assert ms.postproc.RewriteParallelVectorizeUnroll().apply(sch)
    return tvm.build(sch.mod, target=TARGET).inspect_source("ll")


@pytest.mark.slow
def test_copies_along_the_channels_become_vector_loads_where_tvms_concatenation_does_not():
    shapes = [[1, 8, 8, 64], [1, 8, 8, 64]]
    ours = _scheduled_ir(concat.copies(shapes, 3, "float32"))
    bb = tvm.relax.BlockBuilder()
    xs = [tvm.relax.Var(f"x{i}", tvm.relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        bb.emit_func_output(bb.emit(tvm.relax.op.concat(xs, axis=3)))
    tvms = [f for f in tvm.relax.transform.LegalizeOps()(bb.get()).functions.values()
            if isinstance(f, tvm.tirx.PrimFunc)]
    theirs = _scheduled_ir(tvms[0])
    assert ours.count("store <") >= 2  # a vector store in each input's copy
    assert theirs.count("load <") < ours.count("load <")
