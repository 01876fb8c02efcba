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
most a few percent more), and crops the result back (``cropped``). A
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

With ``height`` (``Lowering.pad_conv_height``), an output height that tiles as badly is padded the
same way (more rows: a clamped read of the last row, or more zero padding at the bottom), cropped
by the same block: a schedule transferred from a donor of another height refits its row tiles to
the new height's divisors, and 62 rows (2 x 31) left a donor's 12-row register tile at 31 rows.
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

CROP = "T_width"  # the crop's block (and the clamped read's, CROP + "_in"): ``model.tune.op_class`` leaves them out
MIN_WIDTH = 17  # narrower outputs: a register tile of the whole row fits, and a column more is a large share


def padded(width: int) -> int:
    """The output width a convolution of ``width`` output columns is computed at: the least width at
    or above it with a divisor in ``padded_rows.TILES`` (``width`` itself when it has one, or below
    ``MIN_WIDTH``), as ``padded_rows.padded`` pads a product's rows."""
    return padded_rows.padded(width, least=MIN_WIDTH)


def _widening(call: relax.Call, dims: str = "W") -> list[tuple[int, int, int, int]]:
    """For each output dimension of ``dims`` ("W", or "HW" with heights too) that the rewrite pads in a
    conv2d: (its axis in the output, its extent, the padded extent, the stride along it); empty where
    none is padded or the rewrite does not apply."""
    a = call.attrs
    out_dtype = str(a.out_dtype) if a.out_dtype is not None else ""
    if out_dtype not in ("", "void", "float32") or str(call.args[0].ty.dtype) != "float32" or int(a.groups) != 1:
        return []
    data, _, out = conv_layouts(a)
    if sorted(out) != sorted("NCHW") or sorted(data) != sorted("NCHW"):  # blocked layouts: not here
        return []
    try:
        shape = [int(d) for d in call.ty.shape]
    except (TypeError, AttributeError):  # symbolic or unknown shapes
        return []
    strides = dict(zip("HW", _ints(a.strides)))
    found = [(out.index(d), shape[out.index(d)], padded(shape[out.index(d)]), strides[d]) for d in dims]
    return [f for f in found if f[2] != f[1]]


def clamped(data: te.Tensor, layout: str, extents: dict[str, int]) -> te.Tensor:
    """``data`` (in ``layout``) over ``extents`` (dimension letter -> entries) on those dimensions, those
    past its own a copy of its last one."""
    at_axis = {layout.index(str(d)): int(n) for d, n in extents.items()}  # (call_te hands over TIR values)
    shape = list(data.shape)
    for axis, extent in at_axis.items():
        shape[axis] = extent

    def read(*ix):
        at = list(ix)
        for axis in at_axis:
            at[axis] = te.min(at[axis], data.shape[axis] - 1)
        return data[tuple(at)]

    return te.compute(shape, read, name=CROP + "_in")


def cropped(y: te.Tensor, layout: str, extents: dict[str, int]) -> te.Tensor:
    """The first ``extents[d]`` entries of ``y`` (in ``layout``) on each dimension ``d`` of them."""
    shape = list(y.shape)
    for d, extent in extents.items():
        shape[str(layout).index(str(d))] = int(extent)
    return te.compute(shape, lambda *ix: y[ix], name=CROP)


def conv_clamped(data: te.Tensor, kernel: te.Tensor, strides: Any, dilation: Any, groups: int,
                 layouts: tuple[str, str, str], out_dtype: str, extra: dict[str, int]) -> te.Tensor:
    """An unpadded convolution over ``extra`` (dimension letter -> entries) more input rows or columns
    (``clamped``), as the layout's legalization computes it otherwise (``layout.conv2d_nchw_nhwc`` for
    NCHW in, NHWC out; TOPI's)."""
    data_layout, kernel_layout, _ = layouts
    wide = clamped(data, data_layout, {str(d): int(data.shape[data_layout.index(str(d))]) + int(n)
                                       for d, n in extra.items()})
    if layouts == NCHW_IN_NHWC_OUT:
        return conv2d_nchw_nhwc(wide, kernel, strides, (0, 0, 0, 0), dilation, out_dtype)
    return topi.nn.conv(wide, kernel, strides, 0, dilation, groups, data_layout, kernel_layout, out_dtype)


def legalization(inner_conv: Callable[[relax.BlockBuilder, relax.Call], relax.Expr],
                 height: bool = False) -> Callable[..., relax.Expr]:
    """A ``LegalizeOps`` rule for ``relax.nn.conv2d`` that widens the convolutions where it applies
    (``height``: makes them taller too, where their output height tiles badly) and hands every other
    convolution, and each widened one with padding, to ``inner_conv``, the layout's rule
    (``layout.legalizations``); an unpadded one it computes as that rule would (``conv_clamped``)."""
    dims = "HW" if height else "W"

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        found = _widening(call, dims)
        if not found:
            return inner_conv(bb, call)
        a = call.attrs
        layouts = conv_layouts(a)  # (the kernel named as the layout's rule names it)
        out = layouts[2]
        extra = {out[axis]: (goal - extent) * stride for axis, extent, goal, stride in found}
        crop = {out[axis]: extent for axis, extent, _, _ in found}
        pt, pl, pb, pr = four_pads(a.padding)
        if not (pt or pl or pb or pr):
            hint = "conv2d_nchw_nhwc" if layouts == NCHW_IN_NHWC_OUT else "conv2d"
            conv = bb.emit(bb.call_te(conv_clamped, call.args[0], call.args[1], a.strides, a.dilation, int(a.groups),
                                      layouts, str(call.ty.dtype), extra, primfunc_name_hint=hint))
            return bb.call_te(cropped, conv, out, crop, primfunc_name_hint="width")
        wider = relax.op.nn.conv2d(call.args[0], call.args[1], a.strides,
                                   (pt, pl, pb + extra.get("H", 0), pr + extra.get("W", 0)),
                                   a.dilation, int(a.groups), a.data_layout, a.kernel_layout, a.out_layout,
                                   a.out_dtype)
        conv = bb.emit(inner_conv(bb, bb.normalize(wider)))
        return bb.call_te(cropped, conv, out, crop, primfunc_name_hint="width")

    return legalize
