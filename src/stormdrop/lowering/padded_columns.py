"""Matrix products and convolutions with constant weights whose column (output-channel) count is
no multiple of the vector width, computed over a few more columns of zero weights.

A classifier's ``x (..., K) @ w (K, 1000)`` is tiled by the search along its 1000 columns by
divisors of 1000, so its vector loop is 8 or 10 lanes wide (never 16 on AVX-512), and its loads
and FMAs run at a fraction of their width. When ``w`` is a constant, this legalization computes
the product over ``padded(N)`` columns, the next multiple of the target's vector lanes, with
weights padded by zeros at compile time, and crops the result back to N columns. The crop is
elementwise and fuses with the product's epilogue (bias, activation), so a kernel's inputs and
output keep their shapes and only its intermediate and constant weights grow. Applied on CPUs
to float32 products whose ``w`` is a 2-D constant (``tvm.ir.expr.Constant``), and to ungrouped
float32 convolutions in plain layouts (a squeezenet's 1x1 classifier over 1000 channels) whose
constant weights are padded on their output-channel axis and whose output is cropped on its
channel axis. ``legalizations(..., convs_only=conv_rule())`` pads convolutions only, and only where the
padding adds at most ``1 / NEARLY_FREE`` more channels (a 1000-channel classifier's 1008: the
vector width doubled for under one percent more work), not a mobile network's 40 or 72; with
``conv_rule(narrow_too=True)`` also where the channel count tiles to at most a quarter of the vector width and
the padding adds at most ``1 / NARROW_COST`` more (a ShuffleNet's 58 and 116 channels: 2 and 4
lanes of 16, padded to 64 and 128).
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

NEARLY_FREE = 32  # nearly_free pads where the added columns are at most 1/32 of the columns
NARROW_COST = 8  # narrow pads where the added columns are at most 1/8 of the columns
HALF_COST = 16  # narrow(half=True) pads half-width tiles where the added columns are at most 1/16


def padded(columns: int, lanes: int) -> int:
    """The column count a product of ``columns`` columns is computed at: the next multiple of
    ``lanes`` (``columns`` itself when it is one, or narrower than two vectors)."""
    if columns < 2 * lanes or columns % lanes == 0:
        return columns
    return -(-columns // lanes) * lanes


def nearly_free(columns: int, lanes: int) -> bool:
    """Whether ``padded`` adds columns, at most ``1 / NEARLY_FREE`` of them."""
    goal = padded(columns, lanes)
    return goal != columns and (goal - columns) * NEARLY_FREE <= columns


def narrow(columns: int, lanes: int, half: bool = False) -> bool:
    """Whether the widest vector tile of ``columns`` (the largest power of two dividing it) is at
    most a quarter of ``lanes`` and ``padded`` adds at most ``1 / NARROW_COST`` of the columns, or,
    with ``half``, half of ``lanes`` for at most ``1 / HALF_COST`` more (232 -> 240 on 16 lanes)."""
    goal, tile = padded(columns, lanes), columns & -columns
    if goal == columns:
        return False
    if tile * 4 <= lanes:
        return (goal - columns) * NARROW_COST <= columns
    return half and tile * 2 == lanes and (goal - columns) * HALF_COST <= columns


ConvRule = Callable[[int, int], bool]  # (output channels, lanes) -> whether to pad the convolution


def conv_rule(narrow_too: bool = False, half_too: bool = False) -> ConvRule:
    """Which convolutions ``legalizations(..., convs_only=...)`` pads: those ``nearly_free`` to pad,
    and with ``narrow_too`` the ``narrow`` ones (``half_too``: its half-width tier too)."""
    return lambda columns, lanes: nearly_free(columns, lanes) or (narrow_too and narrow(columns, lanes, half_too))


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


def _conv_weights(bb: relax.BlockBuilder, call: relax.Call, lanes: int | None,
                  rule: ConvRule | None = None) -> tuple[np.ndarray, int, int, int] | None:
    """(the constant weights, their output-channel axis, the output's channel axis, the padded
    channel count) where the rewrite applies to a conv2d (and ``rule``, if any, says to pad its
    channel count), else ``None``. The weights are a constant or a variable bound to one
    (``constants.fold``)."""
    x, w = call.args
    if isinstance(w, relax.Var):
        w = bb.lookup_binding(w)
    a = call.attrs
    out_dtype = str(a.out_dtype) if a.out_dtype is not None else ""
    if not lanes or not isinstance(w, Constant) or int(a.groups) != 1 or out_dtype not in ("", "void", "float32"):
        return None
    if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32":
        return None
    kernel, out = str(a.kernel_layout), str(a.out_layout or a.data_layout)
    if sorted(kernel) != sorted("OIHW") or sorted(out) != sorted("NCHW"):  # blocked layouts: not here
        return None
    axis = kernel.index("O")
    channels = int(w.value.shape[axis])
    goal = padded(channels, lanes)
    if goal == channels or (rule is not None and not rule(channels, lanes)):
        return None
    return w.value.numpy(), axis, out.index("C"), goal


def legalizations(inner: Callable[[relax.BlockBuilder, relax.Call], relax.Expr],
                  inner_conv: Callable[[relax.BlockBuilder, relax.Call], relax.Expr],
                  convs_only: ConvRule | None = None) -> dict[str, Any]:
    """``LegalizeOps`` overrides of ``relax.matmul`` and ``relax.nn.conv2d`` that pad the columns
    where they apply and hand every product (padded or not) to ``inner`` and every convolution to
    ``inner_conv``, the rules that legalize them otherwise. ``convs_only``: convolutions only, those
    this rule says to pad (``conv_rule``)."""

    def legalize_conv(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        found = _conv_weights(bb, call, vector_lanes(tvm.target.Target.current()), convs_only)
        if found is None:
            return inner_conv(bb, call)
        weights, axis, out_axis, goal = found
        widths = [(0, 0)] * weights.ndim
        widths[axis] = (0, goal - weights.shape[axis])
        a = call.attrs
        wider = relax.op.nn.conv2d(call.args[0], relax.const(np.pad(weights, widths)), a.strides, a.padding,
                                   a.dilation, 1, a.data_layout, a.kernel_layout, a.out_layout, a.out_dtype)
        conv = bb.emit(inner_conv(bb, bb.normalize(wider)))
        return bb.call_te(crop_rows, conv, out_axis, int(weights.shape[axis]), "T_columns",
                          primfunc_name_hint="columns")

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

    return {"relax.nn.conv2d": legalize_conv} if convs_only is not None else \
        {"relax.matmul": legalize, "relax.nn.conv2d": legalize_conv}
