"""Matrix products with constant weights whose column count is no multiple of the vector width,
computed over a few more columns of zero weights.

A classifier's ``x (..., K) @ w (K, 1000)`` is tiled by the search along its 1000 columns by
divisors of 1000, so its vector loop is 8 or 10 lanes wide (never 16 on AVX-512), and its loads
and FMAs run at a fraction of their width. When ``w`` is a constant, this legalization computes
the product over ``padded(N)`` columns, the next multiple of the target's vector lanes, with
weights padded by zeros at compile time, and crops the result back to N columns. The crop is
elementwise and fuses with the product's epilogue (bias, activation), so a kernel's inputs and
output keep their shapes and only its intermediate and constant weights grow. Applied on CPUs
to float32 products whose ``w`` is a 2-D constant (``tvm.ir.expr.Constant``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from stormdrop.lowering.padded_rows import crop_rows
from stormdrop.target import vector_lanes


def padded(columns: int, lanes: int) -> int:
    """The column count a product of ``columns`` columns is computed at: the next multiple of
    ``lanes`` (``columns`` itself when it is one, or narrower than two vectors)."""
    if columns < 2 * lanes or columns % lanes == 0:
        return columns
    return -(-columns // lanes) * lanes


def _weights(call: relax.Call, lanes: int | None) -> tuple[np.ndarray, int] | None:
    """(the constant weights, their padded column count) where the rewrite applies, else ``None``."""
    x, w = call.args
    out_dtype = str(call.attrs.out_dtype) if call.attrs.out_dtype is not None else ""
    if not lanes or not isinstance(w, Constant) or out_dtype not in ("", "void", "float32"):
        return None
    if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32" or len(w.value.shape) != 2:
        return None
    columns = int(w.value.shape[1])
    goal = padded(columns, lanes)
    return None if goal == columns else (w.value.numpy(), goal)


def legalizations(inner: Callable[[relax.BlockBuilder, relax.Call], relax.Expr]) -> dict[str, Any]:
    """A ``LegalizeOps`` override of ``relax.matmul`` that pads the columns where it applies and
    hands every product (padded or not) to ``inner``, the rule that legalizes it otherwise."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        found = _weights(call, vector_lanes(tvm.target.Target.current()))
        if found is None:
            return inner(bb, call)
        weights, goal = found
        wider = np.pad(weights, ((0, 0), (0, goal - weights.shape[1])))
        product = bb.emit(inner(bb, bb.normalize(relax.op.matmul(call.args[0], relax.const(wider),
                                                                 out_dtype=call.attrs.out_dtype))))
        return bb.call_te(crop_rows, product, len(product.ty.shape) - 1, int(weights.shape[1]), "T_columns",
                          primfunc_name_hint="columns")

    return {"relax.matmul": legalize}
