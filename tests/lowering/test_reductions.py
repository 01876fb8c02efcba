"""Lowering for CPUs: outer-axis means and sums the search can tile (``reductions``), and
permutes that undo each other folded away (``layout.fold_permutes``)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import relax

from stormdrop.lowering.layout import convert_layout
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, run_model
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics
from stormdrop.workloads.models import Model, load_model

TARGET = parse_target(None)


def _reduce_model(op: str, shape: tuple[int, ...], axes: list[int], keepdims: bool) -> Model:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(getattr(relax.op, op)(x, axes, keepdims))
        bb.emit_func_output(out)
    return Model(f"{op}", bb.get(), {"x": (shape, "float32")})


def _tiles(kernel_mod: tvm.IRModule) -> int:
    """Four-level tile decisions in the kernel's design spaces (multi-level tiling's spatial
    axes; without it a reduction gets at most a two-way split, from the rfactor rule)."""
    load_tensor_intrinsics(TARGET)
    ctx = ms.TuneContext(kernel_mod, target=TARGET, space_generator="post-order-apply",
                         search_strategy="replay-trace", num_threads=1)
    return sum(inst.kind.name == "SamplePerfectTile" and int(inst.attrs[0]) == 4
               for sch in ctx.generate_design_space() for inst in sch.trace.insts)


@pytest.mark.parametrize("op,axes,keepdims", [("mean", [1, 2], True), ("sum", [1, 2], False), ("mean", [0, 1], False)])
def test_an_outer_reduction_is_tiled_and_exact(op, axes, keepdims):
    shape = (4, 24, 16, 40)
    model = _reduce_model(op, shape, axes, keepdims)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    expect = getattr(np, op)(x.astype("float64"), axis=tuple(axes), keepdims=keepdims)
    for tiled in (True, False):
        fused, tasks = extract_tasks(model, TARGET, Lowering(tiled_reductions=tiled))
        assert len(tasks) == 1
        assert ("T_weighted_sum" in tasks[0][0].mod.script()) == tiled
        assert (_tiles(tasks[0][0].mod) > 0) == tiled  # TVM's rules tile only the rewritten block
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        out, _ = run_model(ex, {"x": x}, TARGET, time_it=False)
        np.testing.assert_allclose(out[0], expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axes,shape", [([3], (1, 8, 8, 64)), ([1, 2], (1, 4, 4, 64))])
def test_innermost_and_small_reductions_keep_tvms_legalization(axes, shape):
    # the last axis reduced: contiguous already; 16 elements: too few to tile
    _, tasks = extract_tasks(_reduce_model("mean", shape, axes, True), TARGET)
    assert "T_weighted_sum" not in tasks[0][0].mod.script()


def test_permutes_that_undo_each_other_are_folded():
    """ConvNeXt permutes to NHWC for its LayerNorm and back; in NHWC those pairs cancel."""
    model = load_model(str(__import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "exports" / "tv_convnext.onnx"))
    permute = tvm.ir.Op.get("relax.permute_dims")
    with TARGET:
        mod = convert_layout(relax.transform.CanonicalizeBindings()(model.mod), TARGET, "nhwc")
    func = mod["main"]
    values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    permutes = [v for v in values.values() if isinstance(v, relax.Call) and v.op.same_as(permute)]
    assert permutes  # the model's own permutes of the residual branch stay
    for p in permutes:
        axes = [int(a) for a in p.attrs.axes]
        assert axes != list(range(len(axes)))
        inner = values.get(p.args[0])
        assert not (isinstance(inner, relax.Call) and inner.op.same_as(permute)), "a permute of a permute"
