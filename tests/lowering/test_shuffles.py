"""Channel shuffles of an NHWC model computed in NHWC (``Lowering.nhwc_shuffles``): no NCHW shuffle
and no permutation of activations left between its convolutions, the same output as ONNX Runtime,
and models without a shuffle lowered exactly as before."""

from __future__ import annotations

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
import tvm_ffi
from tvm import relax

from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model, load_model

TARGET = parse_target(None)


def _shuffle(g: GraphBuilder, x: str) -> str:
    n, c, h, w = g.shape(x)
    return g.reshape(g.transpose(g.reshape(x, (n, 2, c // 2, h, w)), (0, 2, 1, 3, 4)), (n, c, h, w))


def _model():
    """Two ShuffleNet v2 blocks of 16 channels: half the channels pass, the other half goes through a
    1x1, a depthwise 3x3 and a 1x1 convolution, the halves are concatenated and shuffled."""
    g = GraphBuilder("shuffles", 0)
    x = g.conv_act(g.input("x", (1, 3, 10, 10)), 16, 3, 1, 1)
    for _ in range(2):
        b2 = g.conv_act(g.slice_channels(x, 8, 16), 8, 1)
        b2 = g.conv_act(g.conv_act(b2, 8, 3, 1, 1, groups=8, act=None), 8, 1)
        x = _shuffle(g, g.concat([g.slice_channels(x, 0, 8), b2]))
    g.output(g.conv(x, 4, 1))
    return from_onnx_model(g.model(), "shuffles")


def _laid_out(model, lowering: Lowering) -> tvm.IRModule:
    with TARGET:
        return lowering._laid_out(model.mod, TARGET)


def _activation_permutes(mod: tvm.IRModule) -> list[tuple[int, ...]]:
    """The axes of each ``permute_dims`` in ``main`` of a tensor computed from the model's input
    (the weights' permutations fold at compile time)."""
    activations = set(mod["main"].params)
    out = []
    for binding in (b for block in mod["main"].body.blocks for b in block.bindings):
        value = binding.value
        args = [f for a in getattr(value, "args", []) for f in (a.fields if isinstance(a, relax.Tuple) else [a])]
        if not any(a in activations for a in args):
            continue
        activations.add(binding.var)
        if value.op.name == "relax.permute_dims":
            out.append(tuple(int(a) for a in value.attrs.axes))
    return out


def test_the_shuffles_move_to_nhwc_and_no_activation_is_permuted_to_nchw():
    model = _model()
    before = _activation_permutes(_laid_out(model, Lowering(nhwc_shuffles=False)))
    after = _activation_permutes(_laid_out(model, Lowering()))
    assert before.count((0, 2, 1, 3, 4)) == 2 and before.count((0, 3, 1, 2)) >= 2, before
    assert after == [(0, 1, 2, 4, 3), (0, 1, 2, 4, 3)], after  # the two shuffles, on the NHWC channels


@pytest.mark.slow
def test_the_model_matches_onnxruntime_either_way():
    model = _model()
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for shuffles in (True, False):
        fused, _ = extract_tasks(model, TARGET, Lowering(nhwc_shuffles=shuffles))
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (shuffles, err, scale)


def test_a_model_without_a_shuffle_is_lowered_as_before():
    model = load_model("mobilenet_v2", resolution=32)
    assert tvm_ffi.structural_equal(_laid_out(model, Lowering()), _laid_out(model, Lowering(nhwc_shuffles=False)))
