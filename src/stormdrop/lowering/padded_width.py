"""Convolutions whose output width tiles badly, computed over a few more columns of the image.

The search tiles a convolution's output width by divisors of it (MetaSchedule samples perfect
tiles), and the register tile of an NHWC convolution is a few output columns by a few vectors of
output channels: each loaded weight vector feeds one FMA per column of the tile. An output width
with no divisor from 4 to 16 leaves one column a tile (or the whole row, too many registers), so
such a kernel is bound by loads instead of FMAs: a SqueezeNet at 124x124 has a 59-wide stem
output and 29-wide fire modules (both prime), and its stem ran at under half the GFLOPS it
reaches at 45 or 49 columns.

This legalization computes such a convolution over a wider input, so that its output is
``padded(width)`` columns wide (the least width at or above it with a divisor from 4 to 16, at
most a few percent more), and crops the result back (``crop_rows`` on the width axis). A
convolution with zero padding reads its input's last column again past it (a clamped index, no
copy: a zero-padded read would put a bounds check on every load of the inner loop); one padded
already gets more zero padding on the right (its reads are checked anyway). The crop is
elementwise and fuses with the convolution's epilogue (bias, residual, activation), so a kernel's
inputs and output keep their shapes; it stays out of the kernel's reuse class
(``model.tune.op_class``), so that convolutions of other widths are its donors. Applied on CPUs
to ungrouped float32 convolutions in plain layouts whose output is at least ``MIN_WIDTH`` columns
wide, and only to those that stay direct (a Winograd kernel tiles its output by its own tile
size). A depthwise convolution loads a weight vector and an input vector for every FMA whatever
its tile, and widened ones ran slower (MnasNet's at 62 columns).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tvm import relax, te, topi

from stormdrop.lowering import padded_rows
from stormdrop.lowering.layout import (
    NCHW_IN_NHWC_OUT,
    _ints,
    conv2d_nchw_nhwc,
    conv_layouts,
    four_pads,
)
from stormdrop.lowering.padded_rows import crop_rows

CROP = "T_width"  # the crop's block (and the clamped read's, CROP + "_in"): ``model.tune.op_class`` leaves them out
MIN_WIDTH = 17  # narrower outputs: a register tile of the whole row fits, and a column more is a large share


def padded(width: int) -> int:
    """The output width a convolution of ``width`` output columns is computed at: the least width at
    or above it with a divisor in ``padded_rows.TILES`` (``width`` itself when it has one, or below
    ``MIN_WIDTH``), as ``padded_rows.padded`` pads a product's rows."""
    return padded_rows.padded(width, least=MIN_WIDTH)


def _widening(call: relax.Call) -> tuple[int, int, int, int] | None:
    """(the output's width axis, its width, the padded width, the horizontal stride) where the
    rewrite applies to a conv2d, else ``None``."""
    a = call.attrs
    out_dtype = str(a.out_dtype) if a.out_dtype is not None else ""
    if out_dtype not in ("", "void", "float32") or str(call.args[0].ty.dtype) != "float32" or int(a.groups) != 1:
        return None
    data, _, out = conv_layouts(a)
    if sorted(out) != sorted("NCHW") or sorted(data) != sorted("NCHW"):  # blocked layouts: not here
        return None
    try:
        shape = [int(d) for d in call.ty.shape]
    except (TypeError, AttributeError):  # symbolic or unknown shapes
        return None
    axis = out.index("W")
    goal = padded(shape[axis])
    return None if goal == shape[axis] else (axis, shape[axis], goal, _ints(a.strides)[-1])


def clamped(data: te.Tensor, axis: int, extent: int) -> te.Tensor:
    """``data`` over ``extent`` entries on ``axis``, those past its own a copy of its last one."""
    last = data.shape[axis] - 1
    shape = list(data.shape)
    shape[axis] = extent

    def read(*ix):
        at = list(ix)
        at[axis] = te.min(at[axis], last)
        return data[tuple(at)]

    return te.compute(shape, read, name=CROP + "_in")


def conv_clamped(data: te.Tensor, kernel: te.Tensor, strides: Any, dilation: Any, groups: int,
                 layouts: tuple[str, str, str], out_dtype: str, extra: int) -> te.Tensor:
    """An unpadded convolution over ``extra`` more input columns (``clamped``), as the layout's
    legalization computes it otherwise (``layout.conv2d_nchw_nhwc`` for NCHW in, NHWC out; TOPI's)."""
    data_layout, kernel_layout, _ = layouts
    axis = data_layout.index("W")
    wide = clamped(data, axis, int(data.shape[axis]) + extra)
    if layouts == NCHW_IN_NHWC_OUT:
        return conv2d_nchw_nhwc(wide, kernel, strides, (0, 0, 0, 0), dilation, out_dtype)
    return topi.nn.conv(wide, kernel, strides, 0, dilation, groups, data_layout, kernel_layout, out_dtype)


def legalization(inner_conv: Callable[[relax.BlockBuilder, relax.Call], relax.Expr]) -> Callable[..., relax.Expr]:
    """A ``LegalizeOps`` rule for ``relax.nn.conv2d`` that widens the convolutions where it applies
    and hands every other convolution, and each widened one with padding, to ``inner_conv``, the
    layout's rule (``layout.legalizations``); an unpadded one it computes as that rule would
    (``conv_clamped``)."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        found = _widening(call)
        if found is None:
            return inner_conv(bb, call)
        axis, width, goal, stride = found
        a = call.attrs
        pt, pl, pb, pr = four_pads(a.padding)
        if not (pt or pl or pb or pr):
            layouts = conv_layouts(a)  # (the kernel named as the layout's rule names it)
            hint = "conv2d_nchw_nhwc" if layouts == NCHW_IN_NHWC_OUT else "conv2d"
            conv = bb.emit(bb.call_te(conv_clamped, call.args[0], call.args[1], a.strides, a.dilation, int(a.groups),
                                      layouts, str(call.ty.dtype), (goal - width) * stride, primfunc_name_hint=hint))
            return bb.call_te(crop_rows, conv, axis, width, CROP, primfunc_name_hint="width")
        wider = relax.op.nn.conv2d(call.args[0], call.args[1], a.strides, (pt, pl, pb, pr + (goal - width) * stride),
                                   a.dilation, int(a.groups), a.data_layout, a.kernel_layout, a.out_layout,
                                   a.out_dtype)
        conv = bb.emit(inner_conv(bb, bb.normalize(wider)))
        return bb.call_te(crop_rows, conv, axis, width, CROP, primfunc_name_hint="width")

    return legalize

