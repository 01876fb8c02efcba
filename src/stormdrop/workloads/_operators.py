"""The built-in operator library: TE definitions, exact FLOP counts and names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import tvm
from tvm import te, topi

from stormdrop.errors import SpecError
from stormdrop.workloads._spec import parse_int, parse_params

DTYPES = ("float16", "bfloat16", "float32", "float64")
LAYOUTS = ("NCHW", "NHWC")
_STRING_KEYS = ("dtype", "layout")
_NON_NEGATIVE_KEYS = ("pad", "winograd")


@dataclass(frozen=True)
class Built:
    """A built-in operator instance: TE tensors (inputs, then the output) and metadata."""

    tensors: list[te.Tensor]
    flops: int
    name: str
    op_class: str


@dataclass(frozen=True)
class OpDef:
    """Parameters of one built-in operator and the function that builds it."""

    required: tuple[str, ...]
    optional: tuple[tuple[str, str], ...]  # (key, default value as written in a spec)
    build: Callable[[dict[str, Any]], Built]

    def help(self) -> str:
        """Parameter help, e.g. ``M=,N=,K=[,dtype=float32]``."""
        text = ",".join(f"{key}=" for key in self.required)
        if self.optional:
            text += "[," + ",".join(f"{k}={v}" for k, v in self.optional) + "]"
        return text

    def keys_help(self) -> str:
        """The accepted keys in words, for error messages."""
        text = ", ".join(self.required)
        if self.optional:
            text += "; optional " + ", ".join(k for k, _ in self.optional)
        return text


# ----------------------------------------------------------------------------- helpers


def _suffix(v: dict[str, Any]) -> str:
    return "" if v["dtype"] == "float32" else "_" + v["dtype"]


def _conv_out(op: str, v: dict[str, Any], k_key: str = "K") -> tuple[int, int]:
    """Output height and width of a convolution; ``SpecError`` if not positive."""
    oh = (v["H"] + 2 * v["pad"] - v["R"]) // v["stride"] + 1
    ow = (v["W"] + 2 * v["pad"] - v["S"]) // v["stride"] + 1
    if oh <= 0 or ow <= 0:
        raise SpecError(
            f"{op}: output size {oh}x{ow} is not positive (H={v['H']}, W={v['W']}, R={v['R']}, "
            f"S={v['S']}, stride={v['stride']}, pad={v['pad']}): the filter must fit the padded input"
        )
    return oh, ow


def _conv_name(op: str, v: dict[str, Any], keys: tuple[str, ...]) -> str:
    parts = [f"{k.lower()}{v[k]}" for k in keys] + [f"st{v['stride']}", f"p{v['pad']}"]
    layout = "_nhwc" if v.get("layout") == "NHWC" else ""
    layout += f"_winograd{v['winograd']}" if v.get("winograd") else ""
    return f"{op}_" + "_".join(parts) + layout + _suffix(v)


def _bias_relu(x: te.Tensor, bias: te.Tensor) -> te.Tensor:
    """``max(x + bias, 0)`` in one block; ``bias`` broadcasts over its size-1 dims."""
    zero = tvm.tirx.const(0, x.dtype)
    unit = [int(d) == 1 for d in bias.shape]

    def body(*idx: Any) -> Any:
        if len(unit) == len(idx):  # same rank: broadcast over the size-1 dims
            bidx = [0 if one else i for i, one in zip(idx, unit, strict=True)]
        else:  # a 1-D bias over the last dim
            bidx = [idx[-1]]
        return te.max(x(*idx) + bias(*bidx), zero)

    return te.compute(x.shape, body, name="out")


# ----------------------------------------------------------------------------- operators


def _matmul(v: dict[str, Any]) -> Built:
    m, n, k, dt = v["M"], v["N"], v["K"], v["dtype"]
    a = te.placeholder((m, k), dt, name="A")
    b = te.placeholder((k, n), dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return Built([a, b, c], 2 * m * n * k, f"matmul_{m}x{n}x{k}{_suffix(v)}", "matmul")


def _dense_core(v: dict[str, Any], out_name: str) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    m, n, k, dt = v["M"], v["N"], v["K"], v["dtype"]
    x = te.placeholder((m, k), dt, name="data")
    w = te.placeholder((n, k), dt, name="weight")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name=out_name)
    return x, w, y


def _dense(v: dict[str, Any]) -> Built:
    x, w, y = _dense_core(v, "out")
    m, n, k = v["M"], v["N"], v["K"]
    return Built([x, w, y], 2 * m * n * k, f"dense_{m}x{n}x{k}{_suffix(v)}", "dense")


def _dense_bias_relu(v: dict[str, Any]) -> Built:
    x, w, y = _dense_core(v, "dense")
    m, n, k = v["M"], v["N"], v["K"]
    bias = te.placeholder((n,), v["dtype"], name="bias")
    out = _bias_relu(y, bias)
    name = f"dense_bias_relu_{m}x{n}x{k}{_suffix(v)}"
    return Built([x, w, bias, out], 2 * m * n * k + 2 * m * n, name, "dense_bias_relu")


def _batch_matmul(v: dict[str, Any]) -> Built:
    bs, m, n, k, dt = v["B"], v["M"], v["N"], v["K"], v["dtype"]
    a = te.placeholder((bs, m, k), dt, name="A")
    b = te.placeholder((bs, k, n), dt, name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((bs, m, n), lambda p, i, j: te.sum(a[p, i, r] * b[p, r, j], axis=r), name="C")
    name = f"batch_matmul_{bs}x{m}x{n}x{k}{_suffix(v)}"
    return Built([a, b, c], 2 * bs * m * n * k, name, "batch_matmul")


_CONV_KEYS = ("N", "C", "H", "W", "K", "R", "S")


def _conv_core(op: str, v: dict[str, Any]) -> tuple[te.Tensor, te.Tensor, te.Tensor, int]:
    n, c, h, w, k, r, s, dt = (*(v[key] for key in _CONV_KEYS), v["dtype"])
    oh, ow = _conv_out(op, v)
    st, pad = v["stride"], v["pad"]
    if v["winograd"]:  # the weights come transformed, [m + 2, m + 2, C, K], as a model's are
        m = v["winograd"]
        if m not in (2, 4) or v["layout"] != "NHWC" or (r, s, st) != (3, 3, 1):
            raise SpecError(f"{op}: winograd={m} needs winograd=2 or 4 (0: off), layout=NHWC, R=3, S=3, "
                            f"stride=1 (got layout={v['layout']}, R={r}, S={s}, stride={st})")
        from stormdrop.lowering.winograd import conv2d_nhwc as winograd_conv2d_nhwc

        data = te.placeholder((n, h, w, c), dt, name="data")
        weight = te.placeholder((m + 2, m + 2, c, k), dt, name="weight")
        out = winograd_conv2d_nhwc(data, weight, (pad,) * 4, m, dt)
    elif v["layout"] == "NHWC":
        data = te.placeholder((n, h, w, c), dt, name="data")
        weight = te.placeholder((r, s, c, k), dt, name="weight")
        out = topi.nn.conv2d_nhwc(data, weight, st, pad, 1, out_dtype=dt)
    else:
        data = te.placeholder((n, c, h, w), dt, name="data")
        weight = te.placeholder((k, c, r, s), dt, name="weight")
        out = topi.nn.conv2d_nchw(data, weight, st, pad, 1, out_dtype=dt)
    return data, weight, out, n * k * oh * ow


def _conv2d(v: dict[str, Any]) -> Built:
    data, weight, out, outputs = _conv_core("conv2d", v)
    flops = 2 * outputs * v["C"] * v["R"] * v["S"]
    op_class = "conv2d_nhwc" if v["layout"] == "NHWC" else "conv2d"
    op_class = "conv2d_winograd_nhwc" if v["winograd"] else op_class
    return Built([data, weight, out], flops, _conv_name("conv2d", v, _CONV_KEYS), op_class)


def _conv2d_bias_relu(v: dict[str, Any]) -> Built:
    data, weight, conv, outputs = _conv_core("conv2d_bias_relu", v)
    k = v["K"]
    shape = (1, 1, 1, k) if v["layout"] == "NHWC" else (1, k, 1, 1)
    bias = te.placeholder(shape, v["dtype"], name="bias")
    out = _bias_relu(conv, bias)
    flops = 2 * outputs * v["C"] * v["R"] * v["S"] + 2 * outputs
    op_class = "conv2d_bias_relu_nhwc" if v["layout"] == "NHWC" else "conv2d_bias_relu"
    op_class = "conv2d_winograd_bias_relu_nhwc" if v["winograd"] else op_class
    name = _conv_name("conv2d_bias_relu", v, _CONV_KEYS)
    return Built([data, weight, bias, out], flops, name, op_class)


_DW_KEYS = ("N", "C", "H", "W", "R", "S")


def _depthwise_conv2d(v: dict[str, Any]) -> Built:
    n, c, h, w, r, s, dt = (*(v[key] for key in _DW_KEYS), v["dtype"])
    oh, ow = _conv_out("depthwise_conv2d", v)
    data = te.placeholder((n, c, h, w), dt, name="data")
    weight = te.placeholder((c, 1, r, s), dt, name="weight")
    out = topi.nn.depthwise_conv2d_nchw(data, weight, v["stride"], v["pad"], 1, out_dtype=dt)
    flops = 2 * n * c * oh * ow * r * s
    name = _conv_name("depthwise_conv2d", v, _DW_KEYS)
    return Built([data, weight, out], flops, name, "depthwise_conv2d")


_DT = (("dtype", "float32"),)
_CONV_OPT = (("stride", "1"), ("pad", "0"), ("layout", "NCHW"), ("winograd", "0"), *_DT)

OPERATORS: dict[str, OpDef] = {
    "matmul": OpDef(("M", "N", "K"), _DT, _matmul),
    "dense": OpDef(("M", "N", "K"), _DT, _dense),
    "batch_matmul": OpDef(("B", "M", "N", "K"), _DT, _batch_matmul),
    "conv2d": OpDef(_CONV_KEYS, _CONV_OPT, _conv2d),
    "depthwise_conv2d": OpDef(_DW_KEYS, (("stride", "1"), ("pad", "0"), *_DT), _depthwise_conv2d),
    "conv2d_bias_relu": OpDef(_CONV_KEYS, _CONV_OPT, _conv2d_bias_relu),
    "dense_bias_relu": OpDef(("M", "N", "K"), _DT, _dense_bias_relu),
}


def _values(op: str, opdef: OpDef, raw: dict[str, str]) -> dict[str, Any]:
    """Check keys against ``opdef`` and convert values (defaults filled in)."""
    allowed = set(opdef.required) | {k for k, _ in opdef.optional}
    for key in raw:
        if key not in allowed:
            raise SpecError(f"{op}: unknown parameter '{key}' (expected {opdef.keys_help()})")
    for key in opdef.required:
        if key not in raw:
            raise SpecError(f"{op}: missing parameter {key} (expected {op}:{opdef.help()})")
    merged = {**dict(opdef.optional), **raw}
    values: dict[str, Any] = {}
    for key, text in merged.items():
        if key not in _STRING_KEYS:
            minimum = 0 if key in _NON_NEGATIVE_KEYS else 1
            values[key] = parse_int(op, key, text, minimum=minimum)
    if merged["dtype"] not in DTYPES:
        raise SpecError(
            f"{op}: unsupported dtype '{merged['dtype']}' (expected one of {', '.join(DTYPES)})"
        )
    values["dtype"] = merged["dtype"]
    if "layout" in merged:
        layout = merged["layout"].upper()
        if layout not in LAYOUTS:
            raise SpecError(f"{op}: bad layout '{merged['layout']}' (expected NCHW or NHWC)")
        values["layout"] = layout
    return values


def build_builtin(op: str, text: str | None) -> Built:
    """Build built-in operator ``op`` from its parameter text (``None``: no ``:`` given)."""
    opdef = OPERATORS.get(op)
    if opdef is None:
        raise SpecError(
            f"unknown operator '{op}': known operators are {', '.join(OPERATORS)}"
            " (or give a user file as path/to/file.py:function)"
        )
    if text is None:
        raise SpecError(f"{op}: no parameters given (expected {op}:{opdef.help()})")
    values = _values(op, opdef, parse_params(op, text))
    built = opdef.build(values)
    if values["dtype"] != "float32":  # the dtype is part of the operator signature
        built = replace(built, op_class=built.op_class + _suffix(values))
    return built
