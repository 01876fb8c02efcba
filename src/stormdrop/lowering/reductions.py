"""Reductions over outer axes (global pooling in NHWC) as kernels the search can tile.

A mean or sum over axes that leave the innermost one (NHWC's global average pool: the mean
over H and W of each channel) is a block whose loops are the kept axes first, then the
reduced ones: each output element sums a column read with the channel count as its stride,
and MetaSchedule's rules give such a block no tiling (``NeedsMultiLevelTiling`` asks for a
read that misses some of the block's variables: data reuse). The search could only
parallelize and unroll it, far below the memory's bandwidth (RESULTS "Reductions").

These legalizations write such a reduction as the sum of the input times a weight that
depends on the first reduced axis only (``1 / count`` for a mean, 1 for a sum): the same
values, and a read with reuse, so the multi-level tiling rule tiles it like a matrix-vector
product: the reduced axes outside, the channels inside (vectorized, accumulated in
registers), the channel tiles parallel. Applied on CPUs to float32 ``mean`` and ``sum``
whose last axis is kept and whose reduced extent is at least ``MIN_EXTENT``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax, te

MIN_EXTENT = 64  # smaller reductions keep TVM's legalization (a few loads per output)


def _reduced_axes(call: relax.Call) -> list[int] | None:
    """The reduced axes when the rewrite applies, else ``None``."""
    x = call.args[0]
    if str(x.ty.dtype) != "float32" or call.attrs.axis is None:
        return None
    shape = [int(d) for d in x.ty.shape]
    axes = sorted({int(a) % len(shape) for a in call.attrs.axis})
    if not axes or axes[-1] == len(shape) - 1 or int(np.prod([shape[a] for a in axes])) < MIN_EXTENT:
        return None
    return axes


def weighted_sum(x: te.Tensor, weight: te.Tensor, axes: list[int], keepdims: bool) -> te.Tensor:
    """``sum(x * weight[first reduced index], axes)``: ``weight`` is 1-D, as long as ``axes[0]``."""
    ndim = len(x.shape)
    reduce = {a: te.reduce_axis((0, x.shape[a]), f"k{a}") for a in axes}
    shape = [1 if a in reduce else x.shape[a] for a in range(ndim) if keepdims or a not in reduce]

    def body(*index: Any) -> Any:
        kept = iter(index)
        at = []
        for a in range(ndim):
            if a in reduce:
                at.append(reduce[a])
                if keepdims:
                    next(kept)
            else:
                at.append(next(kept))
        return te.sum(x[tuple(at)] * weight[reduce[axes[0]]], axis=list(reduce.values()))

    return te.compute(shape, body, name="T_weighted_sum")


def _legalization(name: str) -> Any:
    default = tvm.ir.Op.get(name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        axes = _reduced_axes(call)
        if axes is None:
            return default(bb, call)
        shape = [int(d) for d in call.args[0].ty.shape]
        count = int(np.prod([shape[a] for a in axes]))
        value = 1.0 / count if name == "relax.mean" else 1.0
        weight = relax.const(np.full(shape[axes[0]], value, dtype="float32"))
        return bb.call_te(weighted_sum, call.args[0], weight, axes, bool(call.attrs.keepdims),
                          primfunc_name_hint=name.rsplit(".", 1)[-1])

    return legalize


def legalizations() -> dict[str, Any]:
    """``LegalizeOps`` overrides: op name -> legalization (TVM's own where the rewrite does not apply)."""
    return {name: _legalization(name) for name in ("relax.mean", "relax.sum")}
