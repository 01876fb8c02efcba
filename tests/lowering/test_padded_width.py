"""Convolutions whose output width tiles badly, computed over a few more output columns
(``lowering.padded_width``)."""

from __future__ import annotations

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.lowering import padded_width
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)


def test_padded_widths():
    assert [padded_width.padded(w) for w in (59, 29, 53, 61, 109, 17)] == [60, 30, 54, 63, 110, 18]
    assert [padded_width.padded(w) for w in (56, 28, 30, 45, 49)] == [56, 28, 30, 45, 49]  # they tile
    assert [padded_width.padded(w) for w in (13, 11, 7)] == [13, 11, 7]  # a whole row is a register tile


def _model():
    """A stem to a 29-wide image (prime, unpadded), a 3x3 (padded), a depthwise and a 1x1 convolution
    on it, then a strided 3x3 to 15 columns (too narrow to pad)."""
    g = GraphBuilder("width29", 0)
    x = g.input("x", (1, 3, 63, 63))
    x = g.conv_act(x, 16, 7, 2, 0)  # (63 - 7) / 2 + 1 = 29
    x = g.conv_act(x, 16, 3)
    x = g.conv_act(x, 16, 3, groups=16)
    x = g.conv_act(x, 32, 1)
    g.output(g.conv_act(x, 32, 3, 2))
    return from_onnx_model(g.model(), "width29")


def _kernels(fused: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


@pytest.mark.slow
def test_convolutions_of_a_badly_tiling_width_are_computed_wider_and_match_onnxruntime():
    model = _model()
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for pad in (True, False):
        fused, tasks = extract_tasks(model, TARGET, Lowering(winograd="off", pad_conv_width=pad))
        cropped = [n for n in _kernels(fused) if "width" in n]
        # the stem, the 3x3 and the 1x1 at 29 columns, each cropped with its bias and ReLU in the
        # convolution's kernel; not the depthwise one, nor the strided 3x3 to 15 columns
        assert (len(cropped) == 3 and all(n.startswith("fused_conv2d") and "relu" in n for n in cropped)) if pad \
            else not cropped, _kernels(fused)
        if pad:  # of the same reuse class as unwidened ones: no bounds check on an unpadded one's loads
            for kernel, _ in tasks:
                assert "T_width" not in kernel.op_class, kernel.op_class
                if kernel.name.startswith("fused_conv2d_nchw_nhwc_width"):
                    assert "if_then_else" not in kernel.mod.script(), kernel.name
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        assert [o.shape for o in outs] == [(1, 32, 15, 15)]
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (pad, err, scale)


@pytest.mark.slow
def test_with_pad_conv_height_the_widened_convolutions_are_computed_taller_too_and_match_onnxruntime():
    model = _model()
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    fused, tasks = extract_tasks(model, TARGET, Lowering(winograd="off", pad_conv_height=True))
    widened = [k for k, _ in tasks if "width" in k.name]
    assert len(widened) == 3
    for kernel in widened:  # 30 x 30 computed (29 x 29 cropped), with no bounds check on the stem's loads
        script = kernel.mod.script()
        assert "T.int64(30), T.int64(30), T.int64(16)" in script and "T_width" not in kernel.op_class, kernel.name
        assert "if_then_else" not in script or "nchw_nhwc" not in kernel.name
    ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
    outs, _ = run_model(ex, inputs, TARGET, time_it=False)
    err, scale = max_abs_diff(outs, ref)
    assert [o.shape for o in outs] == [(1, 32, 15, 15)] and err <= 1e-5 * scale, (err, scale)


def test_on_by_default_and_a_tune_before_it_or_without_it_is_compiled_without_it():
    noted = Lowering().noted()
    assert noted["pad_conv_width"] is True and Lowering().as_tuned(noted) == Lowering()
    assert Lowering().as_tuned({**noted, "pad_conv_width": False}) == Lowering(pad_conv_width=False)
    assert Lowering().as_tuned({k: v for k, v in noted.items() if k != "pad_conv_width"}) \
        == Lowering(pad_conv_width=False)
    assert noted["pad_conv_height"] is False  # off by default
    assert Lowering(pad_conv_height=True).as_tuned(noted) == Lowering()  # a tune without it: compiled without
