"""A small ONNX graph builder (opset 17) over :mod:`onnx.helper` for the model zoo.

The builder tracks every tensor's static shape while the graph is built, so model definitions
can ask for channel counts and feature-map sizes (e.g. to size a pooling window). Weights are
initializers drawn from a seeded :class:`numpy.random.Generator`:

* convolutions and linear layers use He scaling (``std = gain * sqrt(2 / fan_in)``) so that
  activations stay O(1) through ReLU networks; the last layer of a residual branch is built
  with a small ``gain`` so that the sum along the identity path does not blow up;
* batch normalization is folded away (with random weights a folded BN is just another random
  per-channel scale and bias, i.e. a convolution with bias);
* layer-norm scale is one and shift is zero, as at initialization.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the IR version that came with opset 17 (onnx 1.12); read by every runtime

Shape = tuple[int, ...]


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    a, b = v
    return (int(a), int(b))


def _pool_out(size: int, k: int, s: int, p0: int, p1: int, ceil: bool, d: int = 1) -> int:
    span = size + p0 + p1 - d * (k - 1) - 1
    if ceil:
        out = -(-span // s) + 1
        if (out - 1) * s >= size + p0:  # last window must start inside the input (PyTorch rule)
            out -= 1
        return out
    return span // s + 1


class GraphBuilder:
    """Builds one ONNX graph; every method returns the name of the tensor it produced."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.shapes: dict[str, Shape] = {}
        self._count = 0
        self._consts: dict[tuple, str] = {}

    # ---------------------------------------------------------------- bookkeeping

    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def shape(self, x: str) -> Shape:
        return self.shapes[x]

    def channels(self, x: str) -> int:
        return self.shapes[x][1]

    def _node(self, op: str, inputs: Sequence[str], shape: Shape, **attrs) -> str:
        out = self._fresh(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out + "_node", **attrs))
        self.shapes[out] = tuple(int(d) for d in shape)
        return out

    def initializer(self, prefix: str, array: np.ndarray) -> str:
        name = self._fresh(prefix)
        self.initializers.append(numpy_helper.from_array(array, name))
        self.shapes[name] = tuple(array.shape)
        return name

    def const(self, value, dtype=np.float32) -> str:
        """A (shared) constant initializer, e.g. a scalar or a shape vector."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._consts:
            self._consts[key] = self.initializer("const", arr)
        return self._consts[key]

    def weight(self, shape: Sequence[int], fan_in: int, gain: float = 1.0) -> str:
        std = gain * math.sqrt(2.0 / max(1, fan_in))
        w = self.rng.standard_normal(tuple(shape), dtype=np.float32)
        w *= np.float32(std)
        return self.initializer("w", w)

    def bias(self, n: int, scale: float = 0.01) -> str:
        b = self.rng.standard_normal((n,), dtype=np.float32)
        b *= np.float32(scale)
        return self.initializer("b", b)

    def input(self, name: str, shape: Sequence[int]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        self.shapes[name] = tuple(int(d) for d in shape)
        return name

    def output(self, x: str, name: str = "output") -> str:
        """Mark ``x`` as a graph output called ``name`` (via Identity when the names differ)."""
        if x != name:
            self.nodes.append(helper.make_node("Identity", [x], [name], name=name + "_node"))
            self.shapes[name] = self.shapes[x]
        self.outputs.append(
            helper.make_tensor_value_info(name, TensorProto.FLOAT, list(self.shapes[name]))
        )
        return name

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers
        )
        model = helper.make_model(
            graph,
            producer_name="stormdrop.zoo",
            opset_imports=[helper.make_opsetid("", OPSET)],
        )
        model.ir_version = IR_VERSION
        return model

    # ---------------------------------------------------------------- convolution / linear

    def conv(
        self,
        x: str,
        out_ch: int,
        kernel: int | Sequence[int],
        stride: int | Sequence[int] = 1,
        pad: int | Sequence[int] = 0,
        *,
        groups: int = 1,
        bias: bool = True,
        dilation: int = 1,
        gain: float = 1.0,
    ) -> str:
        n, c, h, w = self.shapes[x]
        kh, kw = _pair(kernel)
        sh, sw = _pair(stride)
        ph, pw = _pair(pad)
        if c % groups or out_ch % groups:
            raise ValueError(f"conv: channels {c}->{out_ch} not divisible by groups={groups}")
        fan_in = (c // groups) * kh * kw
        inputs = [x, self.weight((out_ch, c // groups, kh, kw), fan_in, gain)]
        if bias:
            inputs.append(self.bias(out_ch))
        oh = _pool_out(h, kh, sh, ph, ph, False, dilation)
        ow = _pool_out(w, kw, sw, pw, pw, False, dilation)
        if oh < 1 or ow < 1:
            raise ValueError(f"conv: {kh}x{kw} kernel does not fit the {h}x{w} input")
        return self._node(
            "Conv",
            inputs,
            (n, out_ch, oh, ow),
            kernel_shape=[kh, kw],
            strides=[sh, sw],
            pads=[ph, pw, ph, pw],
            dilations=[dilation, dilation],
            group=groups,
        )

    def linear(self, x: str, out_features: int, *, bias: bool = True, gain: float = 1.0) -> str:
        """``x @ W + b`` over the last axis (Gemm for 2-D inputs, MatMul + Add otherwise)."""
        shape = self.shapes[x]
        fan_in = shape[-1]
        w = self.weight((fan_in, out_features), fan_in, gain)
        out_shape = (*shape[:-1], out_features)
        if len(shape) == 2:
            inputs = [x, w] + ([self.bias(out_features)] if bias else [])
            return self._node("Gemm", inputs, out_shape)
        y = self._node("MatMul", [x, w], out_shape)
        return self.add(y, self.bias(out_features)) if bias else y

    def gemm(self, x: str, out_features: int, *, gain: float = 1.0) -> str:
        return self.linear(x, out_features, gain=gain)

    def matmul(self, a: str, b: str) -> str:
        sa, sb = self.shapes[a], self.shapes[b]
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self._node("MatMul", [a, b], (*batch, sa[-2], sb[-1]))

    # ---------------------------------------------------------------- elementwise

    def _binary(self, op: str, a: str, b: str) -> str:
        return self._node(op, [a, b], np.broadcast_shapes(self.shapes[a], self.shapes[b]))

    def add(self, a: str, b: str) -> str:
        return self._binary("Add", a, b)

    def mul(self, a: str, b: str) -> str:
        return self._binary("Mul", a, b)

    def relu(self, x: str) -> str:
        return self._node("Relu", [x], self.shapes[x])

    def relu6(self, x: str) -> str:
        return self._node("Clip", [x, self.const(0.0), self.const(6.0)], self.shapes[x])

    def sigmoid(self, x: str) -> str:
        return self._node("Sigmoid", [x], self.shapes[x])

    def silu(self, x: str) -> str:
        return self.mul(x, self.sigmoid(x))

    def gelu(self, x: str) -> str:
        """Exact GELU: ``0.5 * x * (1 + erf(x / sqrt(2)))``."""
        e = self._node("Erf", [self.mul(x, self.const(1.0 / math.sqrt(2.0)))], self.shapes[x])
        return self.mul(self.mul(x, self.const(0.5)), self.add(e, self.const(1.0)))

    def act(self, x: str, kind: str | None) -> str:
        if kind is None:
            return x
        return {"relu": self.relu, "relu6": self.relu6, "silu": self.silu,
                "sigmoid": self.sigmoid, "gelu": self.gelu}[kind](x)

    # ---------------------------------------------------------------- pooling

    def _pool(
        self,
        op: str,
        x: str,
        kernel: int | Sequence[int],
        stride: int | Sequence[int] | None,
        pad: int | Sequence[int],
        ceil_mode: bool,
        **extra,
    ) -> str:
        n, c, h, w = self.shapes[x]
        kh, kw = _pair(kernel)
        sh, sw = _pair(kernel if stride is None else stride)
        ph, pw = _pair(pad)
        # A window larger than the (padded) map would make the layer invalid (PyTorch raises);
        # clamp it so tiny test resolutions still build. No-op at the paper resolutions.
        kh, kw = min(kh, h + 2 * ph), min(kw, w + 2 * pw)
        ph, pw = min(ph, kh // 2), min(pw, kw // 2)
        oh = _pool_out(h, kh, sh, ph, ph, ceil_mode)
        ow = _pool_out(w, kw, sw, pw, pw, ceil_mode)
        attrs = dict(kernel_shape=[kh, kw], strides=[sh, sw], pads=[ph, pw, ph, pw], **extra)
        if ceil_mode:
            attrs["ceil_mode"] = 1
        return self._node(op, [x], (n, c, oh, ow), **attrs)

    def maxpool(self, x, kernel, stride=None, pad=0, *, ceil_mode: bool = False) -> str:
        return self._pool("MaxPool", x, kernel, stride, pad, ceil_mode)

    def avgpool(
        self, x, kernel, stride=None, pad=0, *, ceil_mode: bool = False,
        count_include_pad: bool = True,
    ) -> str:
        """Average pooling; ``count_include_pad`` defaults to PyTorch's AvgPool2d default."""
        return self._pool(
            "AveragePool", x, kernel, stride, pad, ceil_mode,
            count_include_pad=int(count_include_pad),
        )

    def global_avgpool(self, x: str) -> str:
        n, c = self.shapes[x][:2]
        return self._node("GlobalAveragePool", [x], (n, c, 1, 1))

    # ---------------------------------------------------------------- shape manipulation

    def concat(self, xs: Sequence[str], axis: int = 1) -> str:
        shapes = [self.shapes[x] for x in xs]
        rank = len(shapes[0])
        ax = axis % rank
        out = list(shapes[0])
        out[ax] = sum(s[ax] for s in shapes)
        return self._node("Concat", list(xs), out, axis=axis)

    def flatten(self, x: str, axis: int = 1) -> str:
        s = self.shapes[x]
        return self._node("Flatten", [x], (math.prod(s[:axis]), math.prod(s[axis:])), axis=axis)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        shape = [int(d) for d in shape]
        total = math.prod(self.shapes[x])
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = [total // known if d == -1 else d for d in shape]
        if math.prod(shape) != total:
            raise ValueError(f"reshape: {self.shapes[x]} -> {shape}")
        return self._node("Reshape", [x, self.const(shape, np.int64)], shape)

    def slice_channels(self, x: str, start: int, end: int) -> str:
        s = list(self.shapes[x])
        s[1] = end - start
        consts = [self.const([v], np.int64) for v in (start, end, 1)]
        return self._node("Slice", [x, *consts], s)

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        s = self.shapes[x]
        return self._node("Transpose", [x], [s[p] for p in perm], perm=list(perm))

    # ---------------------------------------------------------------- normalization / blocks

    def softmax(self, x: str, axis: int = -1) -> str:
        return self._node("Softmax", [x], self.shapes[x], axis=axis)

    def layernorm(self, x: str, eps: float = 1e-5) -> str:
        d = self.shapes[x][-1]
        scale = self.initializer("ln_scale", np.ones((d,), np.float32))
        shift = self.initializer("ln_bias", np.zeros((d,), np.float32))
        return self._node(
            "LayerNormalization", [x, scale, shift], self.shapes[x], axis=-1, epsilon=eps
        )

    def nonorm(self, x: str) -> str:
        """MobileBERT's NoNorm: an elementwise affine map (``x * w + b``) in place of a layer norm."""
        d = self.shapes[x][-1]
        w = self.initializer("nonorm_w", (1.0 + 0.05 * self.rng.standard_normal(d)).astype(np.float32))
        b = self.initializer("nonorm_b", (0.01 * self.rng.standard_normal(d)).astype(np.float32))
        return self.add(self.mul(x, w), b)

    def squeeze_excite(
        self, x: str, squeeze_ch: int, *, act: str = "relu", gate: str = "sigmoid"
    ) -> str:
        """``x * gate(fc2(act(fc1(mean(x)))))`` with 1x1 convolutions as the FC layers."""
        c = self.channels(x)
        s = self.global_avgpool(x)
        s = self.act(self.conv(s, squeeze_ch, 1), act)
        s = self.act(self.conv(s, c, 1), gate)
        return self.mul(x, s)

    def conv_act(self, x: str, out_ch: int, kernel, stride=1, pad=None, *,
                 groups: int = 1, act: str | None = "relu", gain: float = 1.0) -> str:
        """Conv + folded BN + activation (torchvision's ``Conv2dNormActivation``)."""
        if pad is None:
            kh, kw = _pair(kernel)
            pad = (kh // 2, kw // 2)
        return self.act(self.conv(x, out_ch, kernel, stride, pad, groups=groups, gain=gain), act)
