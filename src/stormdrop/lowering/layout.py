"""Convolution layouts for CPU models: NHWC (the default on CPUs) or ``NCHW{b}c``.

A model's convolutions come from ONNX in NCHW, where the innermost output axis is
the image width (7-14 wide at 224x224 in ResNet's last stages): vector lanes go to
waste. The model is rewritten before legalization so that every convolution, and
what sits between convolutions (bias add, residual add, activations, pooling,
concat), works on activations whose innermost axis is channels: NHWC (weights
HWIO), or, as ONNX Runtime's CPU provider does, blocks of ``b`` channels, ``b`` the
target's fp32 vector width (16 with AVX-512, 8 with AVX2). Measured side by side
(README, "Layouts"), the tuner finds faster kernels in NHWC than in ``NCHW{b}c``
at the same trials, so ``auto`` is NHWC on CPU targets. For ``blocked``:

- ``relax.transform.ConvertLayout`` with a per-call choice (``_desired``) of the
  block: the largest power of two up to ``b`` that divides the channel count (a
  3-channel image input stays whole: ``NCHW3c``); a convolution whose channels
  fit no block, or a grouped (not depthwise) one, stays NCHW. Layout transforms
  of activations remain only at the model's boundaries and where blocks change;
  weight transforms apply to constants and are folded at compile time (the "zero"
  pipeline's FoldConstant), so the deployed model has none (``weight_transforms``).
- TVM's default conv2d legalization refuses blocked layouts ("channel chunk
  cannot be legalized by TOPI"): ``_legalize_conv2d`` maps them to
  ``topi.nn.conv2d_NCHWc`` (kernel ``OIHW{i}i{o}o``) and to a depthwise NCHWc
  compute (``topi.nn.depthwise_conv2d_NCHWc`` is an unregistered stub in 0.27).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax, te, topi
from tvm.target import Target

from stormdrop.target import vector_lanes
from stormdrop.tvm_compat.relax_passes import nonnegative_squeeze_axes

channel_block = vector_lanes  # the channel block of ``blocked`` is the target's fp32 vector width


def _block(channels: int, width: int) -> int | None:
    """The block for ``channels``: the largest power of two <= ``width`` dividing it (>= 4),
    or all of a small channel count (an image's 3 channels), else ``None``."""
    b = width
    while b >= 4:
        if channels % b == 0:
            return b
        b //= 2
    return channels if channels <= width else None


def _desired(width: int):
    """``ConvertLayout``'s per-call callback: the layouts one conv2d should take."""

    def callback(call: relax.Call) -> dict[str, list[str]]:
        if call.op.name != "relax.nn.conv2d":
            return {}
        attrs = call.attrs
        keep = {"relax.nn.conv2d": ["NCHW", "OIHW", "NCHW"]}
        if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW":
            return keep
        c = int(call.args[0].ty.shape[1])
        k = int(call.args[1].ty.shape[0])
        groups = int(attrs.groups)
        ob = _block(k, width)
        if ob is None or ob < 4:  # (a small channel count is a block only for the input side)
            return keep
        if groups == 1:
            ib = _block(c, width)
            if ib is None:
                return keep
            return {"relax.nn.conv2d": [f"NCHW{ib}c", f"OIHW{ib}i{ob}o", f"NCHW{ob}c"]}
        if groups == c == k:  # depthwise
            return {"relax.nn.conv2d": [f"NCHW{ob}c", f"OIHW1i{ob}o", f"NCHW{ob}c"]}
        return keep

    return callback


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values]


def four_pads(padding: Any) -> tuple[int, int, int, int]:
    """A conv2d's padding as (top, left, bottom, right), from one, two or four values."""
    pads = _ints(padding)
    pt, pl, pb, pr = pads if len(pads) == 4 else (pads * 2 if len(pads) == 2 else pads * 4)
    return pt, pl, pb, pr


NCHW_IN_NHWC_OUT = ("NCHW", "HWIO", "NHWC")  # (data, kernel, out) layouts of ``conv2d_nchw_nhwc``


def conv_layouts(attrs: Any) -> tuple[str, str, str]:
    """A conv2d call's (data, kernel, out) layouts (out: the data's where unset)."""
    return str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or attrs.data_layout)


def depthwise_conv2d_nchwc(data: te.Tensor, kernel: te.Tensor, strides: Any, padding: Any,
                           dilation: Any) -> te.Tensor:
    """Depthwise convolution, data ``[N, C/b, H, W, b]``, kernel ``[C/b, 1, R, S, 1, b]``."""
    n, cc, ih, iw, cb = _ints(data.shape)
    _, _, kh, kw, _, _ = _ints(kernel.shape)
    sh, sw = _ints(strides)
    dh, dw = _ints(dilation)
    pt, pl, pb, pr = _ints(padding)
    oh = (ih + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (iw + pl + pr - (kw - 1) * dw - 1) // sw + 1
    padded = data
    if pt or pl or pb or pr:
        padded = topi.nn.pad(data, (0, 0, pt, pl, 0), (0, 0, pb, pr, 0), name="data_pad")
    rh = te.reduce_axis((0, kh), "kh")
    rw = te.reduce_axis((0, kw), "kw")
    return te.compute(
        (n, cc, oh, ow, cb),
        lambda b, c, h, w, k: te.sum(
            padded[b, c, h * sh + rh * dh, w * sw + rw * dw, k] * kernel[c, 0, rh, rw, 0, k],
            axis=[rh, rw]),
        name="depthwise_conv2d_NCHWc")


def conv2d_nchw_nhwc(data: te.Tensor, kernel: te.Tensor, strides: Any, padding: Any, dilation: Any,
                     out_dtype: str) -> te.Tensor:
    """A convolution that reads NCHW activations and HWIO weights and writes NHWC: a model's first
    convolution, whose input stays as the model takes it (``read_inputs_nchw``)."""
    sh, sw = _ints(strides)
    dh, dw = _ints(dilation)
    pt, pl, pb, pr = four_pads(padding)
    n, c, h, w = (int(d) for d in data.shape)
    kh, kw, _, co = (int(d) for d in kernel.shape)
    padded = topi.nn.pad(data, [0, 0, pt, pl], [0, 0, pb, pr]) if pt or pl or pb or pr else data
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pl + pr - dw * (kw - 1) - 1) // sw + 1
    rc, rh, rw = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")
    return te.compute(
        (n, oh, ow, co),
        lambda b, y, x, o: te.sum(
            padded[b, rc, y * sh + rh * dh, x * sw + rw * dw].astype(out_dtype) * kernel[rh, rw, rc, o].astype(out_dtype),
            axis=[rc, rh, rw]),
        name="conv2d_nchw_nhwc")


def _legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    attrs = call.attrs
    if conv_layouts(attrs) == NCHW_IN_NHWC_OUT:
        return bb.call_te(conv2d_nchw_nhwc, call.args[0], call.args[1], attrs.strides, attrs.padding,
                          attrs.dilation, str(call.ty.dtype), primfunc_name_hint="conv2d_nchw_nhwc")
    if len(str(attrs.data_layout)) == 4:  # a convolution left in NCHW: TVM's own legalization
        return tvm.ir.Op.get("relax.nn.conv2d").get_attr("FLegalize")(bb, call)
    if int(attrs.groups) == 1:
        return bb.call_te(topi.nn.conv2d_NCHWc, call.args[0], call.args[1], attrs.strides, attrs.padding,
                          attrs.dilation, str(attrs.data_layout), str(attrs.out_layout), str(call.ty.dtype),
                          primfunc_name_hint="conv2d_NCHWc")
    return bb.call_te(depthwise_conv2d_nchwc, call.args[0], call.args[1], attrs.strides, attrs.padding,
                      attrs.dilation, primfunc_name_hint="depthwise_conv2d_NCHWc")


def static_shape(expr: Any) -> list[int] | None:
    """The static shape of a Relax tensor expression, else ``None`` (no shape, or a symbolic one)."""
    shape = getattr(expr.ty, "shape", None)
    if shape is None or not hasattr(shape, "values"):
        return None
    try:
        return [int(v) for v in shape.values]
    except TypeError:  # symbolic
        return None


def op_name(expr: Any) -> str:
    """The name of the Relax operator ``expr`` calls (``""``: no operator call)."""
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else ""


def op_calls(func: relax.Function) -> list[relax.Call]:
    """Every call of a Relax operator in ``func``, in post order."""
    calls: list[relax.Call] = []

    def visit(expr: Any) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            calls.append(expr)

    relax.analysis.post_order_visit(func, visit)
    return calls


def has_conv2d(mod: tvm.IRModule) -> bool:
    return any(call.op.name == "relax.nn.conv2d" for func in mod.functions.values()
               if isinstance(func, relax.Function) for call in op_calls(func))


LAYOUTS = ("auto", "nhwc", "blocked", "nchw")


def resolve(layout: str, target: Target) -> str:
    """``auto``: NHWC on CPU targets (it measured best, see the README), the model's own elsewhere."""
    if layout != "auto":
        return layout
    return "nhwc" if target.kind.name == "llvm" else "nchw"


def convert_layout(mod: tvm.IRModule, target: Target, layout: str, nhwc_shuffles: bool = True) -> tvm.IRModule:
    """The model with its convolutions (and their neighbours) in ``layout`` (not yet legalized).

    ``nhwc``: NHWC activations, HWIO weights (TVM's own legalization, ``topi.nn.conv``);
    ``blocked``: ``NCHW{b}c`` (x86 targets with a known vector width; others keep NCHW),
    legalized by ``legalizations``; ``nchw``: unchanged; ``auto``: see ``resolve``.
    ``nhwc_shuffles``: an NHWC model's channel shuffles computed in NHWC (``shuffles.nhwc``).
    """
    layout = resolve(layout, target)
    if layout == "nchw" or not has_conv2d(mod):
        return mod
    mod = nonnegative_squeeze_axes(mod)
    if layout == "nhwc":
        from stormdrop.lowering import shuffles  # (shuffles reads this module's helpers)

        mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"]})(mod)
        return read_inputs_nchw(fold_permutes(shuffles.nhwc(mod) if nhwc_shuffles else mod))
    width = channel_block(target)
    if width is None:
        return mod
    return relax.transform.ConvertLayout({}, _desired(width))(mod)


def permute_axes(call: relax.Call) -> list[int]:
    """The axes of a ``permute_dims`` call (``None``: reversed)."""
    ndim = len(call.ty.shape)
    return list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]


def fold_permutes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each ``permute_dims`` of a ``permute_dims`` written as one, and those that
    permute nothing dropped. A model that permutes its own activations (ConvNeXt: to NHWC
    for its LayerNorm and back) gets, once its convolutions are NHWC, pairs that undo each
    other; each was a memory pass (a transpose kernel, or one fused into its neighbour)."""
    permute = tvm.ir.Op.get("relax.permute_dims")

    def is_permute(expr: Any) -> bool:
        return isinstance(expr, relax.Call) and expr.op.same_as(permute)

    @relax.expr_functor.mutator
    class Fold(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not is_permute(call):
                return call
            axes, x = permute_axes(call), call.args[0]
            inner = self.lookup_binding(x) if isinstance(x, relax.Var) else None
            composed = is_permute(inner)
            if composed:
                axes, x = [permute_axes(inner)[a] for a in axes], inner.args[0]
            if axes == list(range(len(axes))):
                return x
            return relax.op.permute_dims(x, axes) if composed else call

    folded = {gv: Fold(mod).visit_expr(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    return relax.transform.DeadCodeElimination()(tvm.IRModule(folded, attrs=mod.attrs))


def read_inputs_nchw(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each NHWC convolution (one group) of an NCHW tensor's NHWC permutation
    reading the NCHW tensor itself (``conv2d_nchw_nhwc``), so that the model's NCHW input is
    not a transpose kernel of its own before the first convolution."""
    permute = tvm.ir.Op.get("relax.permute_dims")
    conv = tvm.ir.Op.get("relax.nn.conv2d")

    @relax.expr_functor.mutator
    class Read(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if not call.op.same_as(conv):
                return call
            a = call.attrs
            if ((str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NHWC", "HWIO", "NHWC")
                    or int(a.groups) != 1):
                return call
            x = call.args[0]
            inner = self.lookup_binding(x) if isinstance(x, relax.Var) else None
            if not (isinstance(inner, relax.Call) and inner.op.same_as(permute) and permute_axes(inner) == [0, 2, 3, 1]):
                return call
            return relax.op.nn.conv2d(inner.args[0], call.args[1], a.strides, a.padding, a.dilation, a.groups,
                                      "NCHW", "HWIO", "NHWC", a.out_dtype)

    read = {gv: Read(mod).visit_expr(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    return relax.transform.DeadCodeElimination()(tvm.IRModule(read, attrs=mod.attrs))


def legalizations() -> dict[str, Any]:
    """``LegalizeOps`` overrides for the blocked layouts and for NCHW-in, NHWC-out convolutions
    (``read_inputs_nchw``); other NCHW and NHWC convolutions keep TVM's own."""
    return {"relax.nn.conv2d": _legalize_conv2d}


def weight_transforms(mod: tvm.IRModule) -> int:
    """How many calls of ``main`` compute on constants only (a per-call weight transform)."""
    count = 0
    for call in op_calls(mod["main"]):
        if call.op.name == "relax.call_tir":
            args = call.args[1]
            tensors = list(args.fields) if isinstance(args, relax.Tuple) else [args]
        elif call.op.name == "relax.layout_transform":
            tensors = [call.args[0]]
        else:
            continue
        count += bool(tensors) and all(isinstance(t, tvm.ir.expr.Constant) for t in tensors)
    return count
