"""Tests of stormdrop.workloads: built-in operators and spec errors (user files: test_user_workloads.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from stormdrop.errors import SpecError
from stormdrop.workloads import (
    Kernel,
    builtin_operators,
    estimate_flops,
    kernel_args,
    parse_kernel,
)

# ----------------------------------------------------------------------------- shapes & flops

# spec, op_class, name, argument shapes (output last), flops
BUILTIN_CASES = [
    (
        "matmul:M=512,N=256,K=128",
        "matmul",
        "matmul_512x256x128",
        [(512, 128), (128, 256), (512, 256)],
        2 * 512 * 256 * 128,
    ),
    (
        "dense:M=16,N=32,K=64",
        "dense",
        "dense_16x32x64",
        [(16, 64), (32, 64), (16, 32)],
        2 * 16 * 32 * 64,
    ),
    (
        "batch_matmul:B=4,M=8,N=16,K=32",
        "batch_matmul",
        "batch_matmul_4x8x16x32",
        [(4, 8, 32), (4, 32, 16), (4, 8, 16)],
        2 * 4 * 8 * 16 * 32,
    ),
    (
        "conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1",
        "conv2d",
        "conv2d_n1_c64_h56_w56_k64_r3_s3_st1_p1",
        [(1, 64, 56, 56), (64, 64, 3, 3), (1, 64, 56, 56)],
        2 * 64 * 56 * 56 * 64 * 9,
    ),
    (
        "conv2d:N=2,C=3,H=32,W=30,K=8,R=5,S=3,stride=2,pad=2,layout=NHWC",
        "conv2d_nhwc",
        "conv2d_n2_c3_h32_w30_k8_r5_s3_st2_p2_nhwc",
        [(2, 32, 30, 3), (5, 3, 3, 8), (2, 16, 16, 8)],
        2 * 2 * 8 * 16 * 16 * 3 * 15,
    ),
    (
        "depthwise_conv2d:N=1,C=32,H=28,W=28,R=3,S=3,stride=2,pad=1",
        "depthwise_conv2d",
        "depthwise_conv2d_n1_c32_h28_w28_r3_s3_st2_p1",
        [(1, 32, 28, 28), (32, 1, 3, 3), (1, 32, 14, 14)],
        2 * 32 * 14 * 14 * 9,
    ),
    (
        "conv2d_bias_relu:N=1,C=16,H=14,W=14,K=32,R=3,S=3",
        "conv2d_bias_relu",
        "conv2d_bias_relu_n1_c16_h14_w14_k32_r3_s3_st1_p0",
        [(1, 16, 14, 14), (32, 16, 3, 3), (1, 32, 1, 1), (1, 32, 12, 12)],
        2 * 32 * 12 * 12 * 16 * 9 + 2 * 32 * 12 * 12,
    ),
    (
        "conv2d_bias_relu:N=1,C=16,H=14,W=14,K=32,R=1,S=1,layout=NHWC",
        "conv2d_bias_relu_nhwc",
        "conv2d_bias_relu_n1_c16_h14_w14_k32_r1_s1_st1_p0_nhwc",
        [(1, 14, 14, 16), (1, 1, 16, 32), (1, 1, 1, 32), (1, 14, 14, 32)],
        2 * 32 * 14 * 14 * 16 + 2 * 32 * 14 * 14,
    ),
    (
        "dense_bias_relu:M=8,N=24,K=40",
        "dense_bias_relu",
        "dense_bias_relu_8x24x40",
        [(8, 40), (24, 40), (24,), (8, 24)],
        2 * 8 * 24 * 40 + 2 * 8 * 24,
    ),
]


@pytest.mark.parametrize(
    "spec,op_class,name,shapes,flops", BUILTIN_CASES, ids=lambda x: str(x)[:20]
)
def test_builtin_shapes_and_flops(spec, op_class, name, shapes, flops):
    k = parse_kernel(spec)
    assert isinstance(k, Kernel)
    assert (k.spec, k.op_class, k.name, k.flops) == (spec, op_class, name, flops)
    assert isinstance(k.mod, tvm.IRModule) and isinstance(k.mod["main"], tvm.tirx.PrimFunc)
    args = kernel_args(k.mod)
    assert [shape for _, shape, _ in args] == shapes
    assert all(dtype == "float32" for _, _, dtype in args)
    assert args[0][0] in ("A", "data") and args[-1][0] not in ("A", "B", "data", "weight", "bias")
    # exact formulas agree with TVM's estimate (bias+relu = add + max per output element)
    assert estimate_flops(k.mod) == flops
    assert all(c.isalnum() or c == "_" for c in k.name)


def test_every_builtin_is_covered():
    ops = builtin_operators()
    assert set(ops) == {
        "matmul",
        "dense",
        "batch_matmul",
        "conv2d",
        "depthwise_conv2d",
        "conv2d_bias_relu",
        "dense_bias_relu",
    }
    assert {spec.split(":")[0] for spec, *_ in BUILTIN_CASES} == set(ops)
    assert ops["matmul"].startswith("M=,N=,K=")
    assert (
        "stride=1" in ops["conv2d"] and "pad=0" in ops["conv2d"] and "layout=NCHW" in ops["conv2d"]
    )


def test_whitespace_defaults_and_dtype():
    a = parse_kernel("  conv2d : N = 1 , C=4, H=8 ,W=8,K=6,R=3,S=3  ")
    b = parse_kernel("conv2d:N=1,C=4,H=8,W=8,K=6,R=3,S=3,stride=1,pad=0,layout=nchw,dtype=float32")
    assert a.name == b.name == "conv2d_n1_c4_h8_w8_k6_r3_s3_st1_p0"
    assert a.flops == b.flops and a.op_class == "conv2d"
    h = parse_kernel("matmul:M=4,N=4,K=4,dtype=float16")
    assert h.name == "matmul_4x4x4_float16" and h.op_class == "matmul_float16"
    assert {dtype for _, _, dtype in kernel_args(h.mod)} == {"float16"}


# ----------------------------------------------------------------------------- numerics


def _conv_nchw(x, w, stride, pad):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, k, oh, ow), dtype=np.float64)
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
    return out


def _depthwise_nchw(x, w, stride, pad):
    c, r, s = w.shape[0], w.shape[2], w.shape[3]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (x.shape[2] + 2 * pad - r) // stride + 1, (x.shape[3] + 2 * pad - s) // stride + 1
    out = np.zeros((x.shape[0], c, oh, ow), dtype=np.float64)
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += patch * w[None, :, 0, i, j, None, None]
    return out


def _relu(x):
    return np.maximum(x, 0)


CONV = "N=2,C=3,H=7,W=6,K=4,R=3,S=2,stride=2,pad=1"
NUMERIC_CASES = [
    ("matmul:M=5,N=7,K=3", lambda a, b: a @ b),
    ("dense:M=5,N=7,K=3", lambda x, w: x @ w.T),
    ("batch_matmul:B=2,M=5,N=7,K=3", lambda a, b: a @ b),
    ("dense_bias_relu:M=5,N=7,K=3", lambda x, w, b: _relu(x @ w.T + b)),
    (f"conv2d:{CONV}", lambda x, w: _conv_nchw(x, w, 2, 1)),
    (
        f"conv2d:{CONV},layout=NHWC",
        lambda x, w: _conv_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), 2, 1).transpose(
            0, 2, 3, 1
        ),
    ),
    (f"conv2d_bias_relu:{CONV}", lambda x, w, b: _relu(_conv_nchw(x, w, 2, 1) + b)),
    (
        f"conv2d_bias_relu:{CONV},layout=NHWC",
        lambda x, w, b: _relu(
            _conv_nchw(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), 2, 1).transpose(0, 2, 3, 1)
            + b
        ),
    ),
    (
        "depthwise_conv2d:N=1,C=3,H=6,W=5,R=3,S=3,stride=1,pad=1",
        lambda x, w: _depthwise_nchw(x, w, 1, 1),
    ),
]


@pytest.mark.parametrize("spec,reference", NUMERIC_CASES, ids=[c[0] for c in NUMERIC_CASES])
def test_builtin_matches_numpy(spec, reference):
    k = parse_kernel(spec)
    args = kernel_args(k.mod)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in args[:-1]]
    _, out_shape, out_dtype = args[-1]
    expected = reference(*inputs)
    assert expected.shape == out_shape
    ex = tvm.compile(k.mod, target={"kind": "llvm"})
    dev = tvm.cpu()
    out = tvm.runtime.empty(out_shape, out_dtype, dev)
    ex["main"](*[tvm.runtime.tensor(x, dev) for x in inputs], out)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    if "relu" in spec:
        assert (expected == 0).any() and (expected > 0).any()  # the epilogue is exercised


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("op", ["conv2d", "conv2d_bias_relu"])
def test_winograd_spec_matches_a_direct_convolution(op, m):
    """``winograd=m``: the kernel takes the transformed weights a model's Winograd kernel takes
    (``winograd.weight_transform``, done here as the model's build does it) and computes the
    same convolution (a 7x9 output: partial tiles)."""
    from tvm import te

    from stormdrop.lowering.winograd import weight_transform

    k = parse_kernel(f"{op}:N=1,C=8,H=7,W=9,K=16,R=3,S=3,pad=1,layout=NHWC,winograd={m}")
    direct = parse_kernel(f"{op}:N=1,C=8,H=7,W=9,K=16,R=3,S=3,pad=1,layout=NHWC")
    assert k.name == direct.name + f"_winograd{m}"
    assert k.op_class == direct.op_class.replace("conv2d", "conv2d_winograd") != direct.op_class
    assert k.flops == direct.flops  # a direct convolution's FLOPs: GFLOPS stay comparable
    assert [shape for _, shape, _ in kernel_args(k.mod)][1] == (m + 2, m + 2, 8, 16)
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    args = kernel_args(direct.mod)
    inputs = [rng.standard_normal(shape).astype("float32") for _, shape, _ in args[:-1]]
    g = te.placeholder((3, 3, 8, 16), "float32", name="g")
    transform = tvm.compile(te.create_prim_func([g, weight_transform(g, m)]), target="llvm")
    packed = tvm.runtime.empty((m + 2, m + 2, 8, 16), "float32", dev)
    transform(tvm.runtime.tensor(inputs[1], dev), packed)
    outs = []
    for kernel, weights in ((direct, inputs[1]), (k, packed.numpy())):
        out = tvm.runtime.empty(args[-1][1], "float32", dev)
        ex = tvm.compile(kernel.mod, target={"kind": "llvm"})
        ex["main"](*[tvm.runtime.tensor(x, dev) for x in [inputs[0], weights, *inputs[2:]]], out)
        outs.append(out.numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- spec errors

MM = "matmul:M=4,N=4"
ERROR_CASES = [
    ("", ["empty"]),
    ("   ", ["empty"]),
    ("matmull:M=1,N=1,K=1", ["unknown operator", "matmull", "matmul", "conv2d", "dense_bias_relu"]),
    ("matmul", ["no parameters", "M=,N=,K="]),
    ("matmul:", ["missing parameter M"]),
    (MM, ["missing parameter K", "matmul:M=,N=,K="]),
    (MM + ",K=4,X=3", ["unknown parameter 'X'", "M, N, K"]),
    (MM + ",K=4,layout=NHWC", ["unknown parameter 'layout'"]),
    (MM + ",K=abc", ["K=abc", "not an integer"]),
    (MM + ",K=2.5", ["K=2.5", "not an integer"]),
    (MM + ",K=0", ["K=0", "positive integer"]),
    (MM + ",K=-3", ["K=-3", "positive integer"]),
    (MM + ",K=", ["K has no value"]),
    (MM + ",K4", ["bad parameter 'K4'", "key=value"]),
    (MM + ",,K=4", ["empty parameter"]),
    (MM + ",M=8,K=4", ["duplicate parameter M"]),
    (MM + ",K=4,dtype=int7", ["unsupported dtype 'int7'", "float32"]),
    ("conv2d:N=1,C=3,H=2,W=2,K=4,R=3,S=3", ["output size", "not positive"]),
    ("depthwise_conv2d:N=1,C=3,H=8,W=8,R=3,S=9,pad=0", ["output size", "not positive"]),
    ("conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=-1", ["pad=-1", "non-negative"]),
    ("conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,stride=0", ["stride=0", "positive"]),
    ("conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,layout=NCWH", ["bad layout 'NCWH'", "NCHW or NHWC"]),
    ("conv2d_bias_relu:N=1,C=3,H=8,W=8,K=4,R=3,S=3,layout=HWC", ["bad layout"]),
    ("conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,layout=NHWC,winograd=3", ["winograd=3", "winograd=2 or 4"]),
    ("conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,winograd=4", ["layout=NHWC", "got layout=NCHW"]),
    ("conv2d:N=1,C=8,H=8,W=8,K=8,R=3,S=3,stride=2,layout=NHWC,winograd=2", ["stride=1", "stride=2"]),
    ("conv2d:N=1,C=8,H=8,W=8,K=8,R=1,S=1,layout=NHWC,winograd=2", ["R=3", "R=1"]),
    ("nosuchfile.py", ["names no function", "file.py:function_name"]),
]


@pytest.mark.parametrize("spec,fragments", ERROR_CASES, ids=[repr(c[0]) for c in ERROR_CASES])
def test_spec_errors(spec, fragments):
    _assert_spec_error(spec, fragments)


def _assert_spec_error(spec: str, fragments: list[str]) -> None:
    """The spec is refused with one line naming every fragment."""
    with pytest.raises(SpecError) as info:
        parse_kernel(spec)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_tensor_intrinsics_of_the_target_cpu_family_only():
    from stormdrop.tvm_compat.intrinsics import _cpu_family

    assert _cpu_family(tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu"})) == "x86"
    assert _cpu_family(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})) == "arm_cpu"
