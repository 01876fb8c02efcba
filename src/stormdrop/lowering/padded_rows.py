"""Matrix products whose row count tiles badly, computed over a few more rows.

A transformer's linear layers multiply every token's features by a weight,
``x (..., M, K) @ w (K, N)``, and the search tiles the rows M into register tiles by divisors
of M (MetaSchedule samples perfect tiles). A vision transformer's 197 tokens is prime: every
row is its own register tile, each loaded weight vector feeds one row's FMA, and the kernel
is bound by loads instead of FMAs.

This legalization computes such a product over ``padded(M)`` rows, the rows past M reading
row ``M - 1`` again (a clamped index: no padded copy of ``x``, no branch in the inner loop),
and crops the result back to M rows. The crop is elementwise and fuses with the product's
epilogue (bias, residual, activation), so a kernel's inputs and output keep their shapes and
only its intermediate grows. Applied on CPUs to float32 products of an activation by a 2-D
matrix whose row count has no divisor in ``TILES`` (the rows: the last axis before the
features with an extent over one).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, te

TILES = range(4, 17)  # row counts of a register tile: at 4 to 16 rows a weight vector feeds enough FMAs
MIN_ROWS = 32  # fewer rows: a few percent more rows is a large share of the work


def _tiles_well(rows: int) -> bool:
    return any(rows % t == 0 for t in TILES)


def padded(rows: int, least: int = MIN_ROWS) -> int:
    """The row count a product of ``rows`` rows is computed at: the least count at or above it
    with a divisor in ``TILES`` (``rows`` itself when it has one, or below ``least``)."""
    if rows < least:
        return rows
    out = rows
    while not _tiles_well(out):
        out += 1
    return out


def matmul_rows(x: te.Tensor, w: te.Tensor, axis: int, rows: int) -> te.Tensor:
    """``x @ w`` (``x``: ``(..., K)``, ``w``: ``(K, N)``) over ``rows`` rows on ``x``'s axis
    ``axis`` (at least its extent), the extra rows a copy of its last one."""
    last = x.shape[axis] - 1
    k = te.reduce_axis((0, x.shape[-1]), "k")
    shape = [*x.shape[:-1], w.shape[1]]
    shape[axis] = rows

    def product(*ix):
        at = list(ix[:-1])
        at[axis] = te.min(at[axis], last)
        return te.sum(x[(*at, k)] * w[k, ix[-1]], axis=k)

    return te.compute(shape, product, name="T_matmul")


def crop_rows(y: te.Tensor, axis: int, rows: int, name: str = "T_rows") -> te.Tensor:
    """The first ``rows`` entries on axis ``axis`` of ``y`` (rows, or columns: ``padded_columns``)."""
    shape = list(y.shape)
    shape[axis] = rows
    return te.compute(shape, lambda *ix: y[ix], name=name)


def _rows(call: relax.Call) -> tuple[int, int, int] | None:
    """(the rows' axis of ``x``, its extent, the padded extent) where the rewrite applies, else
    ``None``. The rows' axis is the last axis before the features with an extent over one
    (``(1, 197, K)``'s middle one, and the first of a sequence-first ``(197, 1, K)``)."""
    x, w = call.args
    out_dtype = str(call.attrs.out_dtype) if call.attrs.out_dtype is not None else ""
    if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32" or out_dtype not in ("", "void", "float32"):
        return None
    try:
        xs, ws = [int(d) for d in x.ty.shape], [int(d) for d in w.ty.shape]
    except (TypeError, AttributeError):  # symbolic or unknown shapes
        return None
    if len(xs) < 2 or len(ws) != 2 or xs[-1] != ws[0]:
        return None
    axis = next((a for a in range(len(xs) - 2, -1, -1) if xs[a] > 1), None)
    rows = xs[axis] if axis is not None else 1
    goal = padded(rows)
    return None if goal == rows else (axis, rows, goal)


def _legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    found = _rows(call)
    if found is None:
        return _DEFAULT(bb, call)
    axis, rows, padded_rows = found
    product = bb.emit_te(matmul_rows, call.args[0], call.args[1], axis, padded_rows, primfunc_name_hint="matmul")
    return bb.call_te(crop_rows, product, axis, rows, primfunc_name_hint="rows")


_DEFAULT = tvm.ir.Op.get("relax.matmul").get_attr("FLegalize")


def legalizations() -> dict[str, Any]:
    """``LegalizeOps`` overrides: ``relax.matmul`` (TVM's own where the rewrite does not apply)."""
    return {"relax.matmul": _legalize}
