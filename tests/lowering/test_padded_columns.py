"""Products with constant weights whose column count is no multiple of the vector width: computed
over zero-weight columns up to the next multiple, cropped, and still ONNX Runtime's output."""

from __future__ import annotations

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.lowering import padded_columns
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target, vector_lanes
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)
FEATURES, COLUMNS = 32, 44  # 44: no multiple of 8 or 16 lanes; 48 is, for both


def _model(tokens: int):
    """A linear layer to COLUMNS features with its bias and a ReLU, and a product of two
    activations (``x @ x^T``: no constant weights, not rewritten) beside it."""
    g = GraphBuilder(f"cols{tokens}", 0)
    x = g.input("x", (1, tokens, FEATURES))
    g.output(g.relu(g.linear(x, COLUMNS)))
    g.output(g.matmul(x, g.transpose(x, (0, 2, 1))), "gram")
    return from_onnx_model(g.model(), f"cols{tokens}")


def _weight_columns(fused: tvm.IRModule) -> list[int]:
    """The column count of each matrix-product kernel's 2-D weight parameter."""
    out = []
    for gv, func in fused.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint:
            shapes = [[int(d) for d in a.shape] for a in ms.arg_info.ArgInfo.from_prim_func(func)]
            out += [s[1] for s in shapes if len(s) == 2 and s[0] == FEATURES]
    return out


def test_padded_column_counts():
    assert [padded_columns.padded(n, 16) for n in (1000, 1008, 44, 31, 16, 1)] == [1008, 1008, 48, 31, 16, 1]
    assert [padded_columns.padded(n, 8) for n in (1000, 44, 15)] == [1000, 48, 15]
    # nearly free: at most 1/32 more columns (1000 -> 1008, 440 -> 448), not 44 -> 48 or 184 -> 192
    assert [padded_columns.nearly_free(n, 16) for n in (1000, 440, 1008, 44, 184, 31)] == \
        [True, True, False, False, False, False]
    # narrow: tiles to a quarter of the lanes or less, at most 1/8 more (ShuffleNet's 58 -> 64, 116 -> 128)
    assert [padded_columns.narrow(n, 16) for n in (58, 116, 44, 232, 40, 36, 24, 1000, 128)] == \
        [True, True, True, False, False, False, False, False, False]
    assert [padded_columns.narrow(n, 8) for n in (58, 116, 1000)] == [True, False, False]
    # and with half: half the lanes, at most 1/16 more (232 -> 240), not 120 -> 128 or 40 -> 48
    assert [padded_columns.narrow(n, 16, half=True) for n in (232, 200, 58, 120, 40, 128)] == \
        [True, True, True, False, False, False]


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [8, 67])  # 67 rows: padded rows (padded_rows) and columns together
def test_a_product_with_constant_weights_is_computed_over_padded_columns_and_matches_onnxruntime(tokens):
    lanes = vector_lanes(TARGET)
    if not lanes:
        pytest.skip("the host target has no known vector width")
    model = _model(tokens)
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for pad in (True, False):
        fused, _ = extract_tasks(model, TARGET, Lowering(pad_columns=pad))
        assert _weight_columns(fused) == [padded_columns.padded(COLUMNS, lanes) if pad else COLUMNS], pad
        names = [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        cropped = [n for n in names if "columns" in n]
        # the crop, the bias and the ReLU are one kernel with the product
        assert (len(cropped) == 1 and cropped[0].startswith("fused_matmul") and "relu" in cropped[0]) if pad \
            else not cropped, names
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        assert [o.shape for o in outs] == [(1, tokens, COLUMNS), (1, tokens, tokens)]
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (pad, err, scale)


def _conv_model():
    """A 1x1 and a 3x3 convolution to COLUMNS channels, each with its bias and a ReLU, and a
    depthwise convolution between them (grouped: not rewritten)."""
    g = GraphBuilder("colsconv", 0)
    x = g.input("x", (1, FEATURES, 6, 6))
    y = g.relu(g.conv(x, COLUMNS, 1))
    y = g.relu(g.conv(y, COLUMNS, 3, pad=1, groups=COLUMNS))
    g.output(g.relu(g.conv(y, COLUMNS, 3, pad=1)))
    return from_onnx_model(g.model(), "colsconv")


def _conv_output_channels(fused: tvm.IRModule, layout: str) -> list[int]:
    """The output-channel count of each convolution kernel's weights (HWIO, or OIHW with ``nchw``):
    its 4-D parameters other than activations (1 x 6 x 6 x C or 1 x C x 6 x 6) and biases."""
    out = []
    for gv, func in fused.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint:
            shapes = [[int(d) for d in a.shape] for a in ms.arg_info.ArgInfo.from_prim_func(func)]
            weights = [s for s in shapes if len(s) == 4 and s[0] * s[1] * s[2] * s[3] > max(s)
                       and not (s[0] == 1 and (s[1:3] == [6, 6] or s[2:] == [6, 6]))]
            out += [s[0] if layout == "nchw" else s[3] for s in weights]
    return sorted(out)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_a_convolution_with_constant_weights_is_computed_over_padded_channels_and_matches_onnxruntime(layout):
    lanes = vector_lanes(TARGET)
    if not lanes:
        pytest.skip("the host target has no known vector width")
    model = _conv_model()
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    goal = padded_columns.padded(COLUMNS, lanes)
    for pad in (True, False):
        fused, _ = extract_tasks(model, TARGET, Lowering(layout=layout, winograd="off", pad_columns=pad,
                                                             pad_narrow_columns=False))
        # the depthwise convolution's weights (COLUMNS output channels) stay as they were
        assert _conv_output_channels(fused, layout) == sorted([COLUMNS, *[goal if pad else COLUMNS] * 2]), (pad, layout)
        names = [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        cropped = [n for n in names if "columns" in n]
        # each crop, its bias and its ReLU are one kernel with the convolution
        assert (len(cropped) == 2 and all(n.startswith("fused_conv2d") and "relu" in n for n in cropped)) if pad \
            else not cropped, names
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        assert [o.shape for o in outs] == [(1, COLUMNS, 6, 6)]
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (pad, layout, err, scale)


def _classifier_model():
    """A SqueezeNet's head: a 1x1 convolution to 1000 channels with its bias and ReLU, beside a 1x1
    convolution to COLUMNS channels and a linear layer to COLUMNS features."""
    g = GraphBuilder("head", 0)
    x = g.input("x", (1, FEATURES, 6, 6))
    g.output(g.relu(g.conv(x, 1000, 1)))
    g.output(g.relu(g.conv(x, COLUMNS, 1)), "narrow")
    g.output(g.linear(g.flatten(g.global_avgpool(x)), COLUMNS), "linear")
    return from_onnx_model(g.model(), "head")


@pytest.mark.slow
def test_only_convolutions_padded_nearly_free_or_narrow_are_padded_by_pad_conv_columns():
    lanes = vector_lanes(TARGET)
    if lanes != 16:
        pytest.skip("1000 pads nearly free to a multiple of 16 lanes only (AVX-512)")
    model = _classifier_model()
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for pad, narrow in ((True, False), (False, False), (True, True)):  # narrow: 44 channels are 4 lanes of 16
        fused, _ = extract_tasks(model, TARGET, Lowering(pad_conv_columns=pad, pad_narrow_columns=narrow))
        assert _conv_output_channels(fused, "nhwc") == [48 if narrow else COLUMNS, 1008 if pad else 1000], pad
        assert _weight_columns(fused) == [COLUMNS], pad  # the linear layer's product: not padded
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        assert [o.shape for o in outs] == [(1, 1000, 6, 6), (1, COLUMNS, 6, 6), (1, COLUMNS)]
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (pad, err, scale)
