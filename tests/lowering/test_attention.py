"""Attentions over a sequence that tiles badly, computed at a padded length (``attention``)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import relax

from stormdrop.lowering import attention
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)
HEADS, DH = 2, 16


def _attention_model(seq: int, scores: str, seed: int = 0):
    """One self-attention over ``seq`` tokens; ``scores``: how the Q K^T product reaches the
    softmax (``scale``: times 1/sqrt(dh); ``mask``: scaled, plus an additive mask input broadcast
    over heads and queries, as BERT's; ``divide``: divided by sqrt(dh) then masked)."""
    g = GraphBuilder(f"attn{seq}", seed)
    x = g.input("x", (1, seq, HEADS * DH))
    q = g.transpose(g.reshape(g.linear(x, HEADS * DH), (1, seq, HEADS, DH)), (0, 2, 1, 3))
    kt = g.transpose(g.reshape(g.linear(x, HEADS * DH), (1, seq, HEADS, DH)), (0, 2, 3, 1))
    v = g.transpose(g.reshape(g.linear(x, HEADS * DH), (1, seq, HEADS, DH)), (0, 2, 1, 3))
    s = g.matmul(q, kt)
    if scores == "divide":
        s = g._binary("Div", s, g.const(DH**0.5))
    else:
        s = g.mul(s, g.const(DH**-0.5))
    if scores in ("mask", "divide"):
        s = g.add(g.input("mask", (1, 1, 1, seq)), s)  # the scores on the right: either side is followed
    ctx = g.matmul(g.softmax(s, axis=-1), v)
    g.output(g.reshape(g.transpose(ctx, (0, 2, 1, 3)), (1, seq, HEADS * DH)))
    return from_onnx_model(g.model(), f"attn{seq}_{scores}")


def _score_shapes(fused: tvm.IRModule) -> set[tuple[int, ...]]:
    """The shapes of the softmax kernels' inputs in the model's main function."""
    shapes = set()
    for block in fused["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if (isinstance(call, relax.Call) and call.op.name == "relax.call_tir"
                    and "softmax" in call.args[0].name_hint):
                shapes.add(tuple(int(d) for d in call.args[1].fields[0].ty.shape))
    return shapes


def test_padded_lengths():
    assert [attention.padded(n) for n in (197, 128, 64, 65, 63, 17, 577, 1)] == [208, 128, 64, 80, 63, 17, 592, 1]


@pytest.mark.slow
@pytest.mark.parametrize("seq,scores", [(70, "scale"), (70, "mask"), (97, "divide"), (48, "mask"), (96, "mask")])
def test_an_attention_is_padded_only_where_it_tiles_badly_and_matches_onnxruntime(seq, scores):
    model = _attention_model(seq, scores)
    inputs = random_inputs(model, 0)
    if "mask" in inputs:  # an additive mask as BERT makes it: 0 where attended, -10000 on the padded tail
        inputs["mask"] = np.where(np.arange(seq) < seq - seq // 4, 0.0, -1e4).astype("float32").reshape(1, 1, 1, seq)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    expect = attention.padded(seq)
    for pad in (True, False):
        fused, _ = extract_tasks(model, TARGET, Lowering(pad_attention=pad))
        width = expect if pad else seq
        assert _score_shapes(fused) == {(1, HEADS, width, width)}
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        assert outs[0].shape == (1, seq, HEADS * DH)
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (pad, err, scale)


def test_probabilities_used_elsewhere_are_left_alone():
    """A softmax whose output is also a model output is not rewritten (it would be computed twice)."""
    g = GraphBuilder("attn_probs", 0)
    q, kt, v = g.input("q", (1, 2, 70, 8)), g.input("kt", (1, 2, 8, 70)), g.input("v", (1, 2, 70, 8))
    probs = g.softmax(g.matmul(q, kt), axis=-1)
    g.output(g.matmul(probs, v))
    g.output(probs, "probs")
    model = from_onnx_model(g.model(), "attn_probs")
    fused, _ = extract_tasks(model, TARGET, Lowering())
    assert _score_shapes(fused) == {(1, 2, 70, 70)}
