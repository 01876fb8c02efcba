"""Matrix products whose row count tiles badly, computed over a few more rows (``padded_rows``)."""

from __future__ import annotations

import re

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.lowering import padded_rows
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)
FEATURES, HIDDEN = 32, 48


def _mlp_model(tokens: int, seq_first: bool = False):
    """A transformer's MLP block over ``tokens`` rows: linear, GELU, linear, residual add; and a
    product of two activations (``x @ x^T``, not rewritten) beside it. ``seq_first``: the
    tokens on the first axis, the batch second (``torch.nn.MultiheadAttention``'s default)."""
    g = GraphBuilder(f"mlp{tokens}", 0)
    x = g.input("x", (tokens, 1, FEATURES) if seq_first else (1, tokens, FEATURES))
    h = g.linear(g.gelu(g.linear(x, HIDDEN)), FEATURES)
    g.output(g.add(x, h))
    g.output(g.matmul(x, g.transpose(x, (0, 2, 1))), "gram")
    return from_onnx_model(g.model(), f"mlp{tokens}")


def _product_rows(fused: tvm.IRModule) -> list[int]:
    """The row counts (axis -2) of the 3-D buffers (arguments and intermediates) of the model's
    matrix-product kernels, padded intermediates included."""
    rows = []
    for gv, func in fused.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc) and "matmul" in gv.name_hint:
            for a, b, c in re.findall(r"\(T\.int64\((\d+)\), T\.int64\((\d+)\), T\.int64\((\d+)\)\)",
                                      func.script()):
                if int(c) in (FEATURES, HIDDEN):
                    rows.append(int(a) * int(b))  # one of the two is the batch of 1
    return rows


def test_padded_row_counts():
    got = [padded_rows.padded(n) for n in (197, 196, 67, 31, 128, 1, 577, 3137)]
    assert got == [198, 196, 68, 31, 128, 1, 580, 3138]
    assert all(padded_rows.padded(n) >= n for n in range(1, 400))


@pytest.mark.slow
@pytest.mark.parametrize("tokens,seq_first", [(67, False), (70, False), (67, True)])
def test_a_product_is_computed_over_padded_rows_only_where_they_tile_badly_and_matches_onnxruntime(tokens, seq_first):
    model = _mlp_model(tokens, seq_first)
    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    expect = padded_rows.padded(tokens)
    for pad in (True, False):
        fused, _ = extract_tasks(model, TARGET, Lowering(pad_rows=pad))
        rows = _product_rows(fused)
        assert set(rows) == ({tokens, expect} if pad else {tokens}), (pad, rows)
        ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
        outs, _ = run_model(ex, inputs, TARGET, time_it=False)
        assert [o.shape for o in outs] == ([(tokens, 1, FEATURES), (tokens, 1, 1)] if seq_first
                                           else [(1, tokens, FEATURES), (1, tokens, tokens)])
        err, scale = max_abs_diff(outs, ref)
        assert err <= 1e-5 * scale, (pad, err, scale)


def test_the_crop_fuses_with_the_epilogue():
    """The padded product, its crop, the bias and the GELU are one kernel; so are the second
    product, its crop, its bias and the residual add."""
    fused, _ = extract_tasks(_mlp_model(67), TARGET, Lowering())
    names = [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    padded = [n for n in names if "rows" in n]
    assert len(padded) == 2 and all(n.startswith("fused_matmul") for n in padded), names
    assert any("erf" in n for n in padded), names  # GELU: x * (1 + erf(x / sqrt 2)) / 2
    assert any(n.count("add") == 2 and "erf" not in n for n in padded), names  # bias, residual
