"""Winograd convolutions for CPU models: 3x3, stride 1 convolutions in NHWC as F(m x m, 3 x 3).

Ansor's CPU results on ResNets rest on them: a 3x3 convolution over an m x m output
tile takes (m + 2)^2 multiplications per input/output channel pair instead of 9 m^2
(4x fewer with m = 4). The convolution becomes four stages in one kernel: the input
tiles transformed (``data_pack``: B^T d B), one GEMM per tile element over the
channels (``bgemm``), the inverse transform (``inverse``: A^T M A) and the output
gather. The weights' transform (G g G^T) runs once, at compile time: it is a call on
a constant that the build folds (``layout.weight_transforms`` counts none), and the
transformed weights are a layout-free buffer of the kernel like the packed weights of
direct convolutions. MetaSchedule's CPU rules for ``data_pack`` and ``inverse`` (named
by the blocks' ``schedule_rule``) tile, unroll and place them; the GEMM gets the
multi-level tiling of every GEMM, and the raindrop walks all of their decisions.

Which m (``choose_tile``, ``auto``): the GEMMs read (m + 2)^2 / 9 times more weight bytes
than a direct convolution and reuse each only over the image's tiles. Inside a model the
weights come from memory, so a Winograd kernel on a small image is bound by streaming its
larger weights (a kernel faster than direct when tuned alone can be slower inside the
model): m = 4 from 28x28 outputs, m = 2 from 14x14, direct below and under 16 channels.
Small convolutions stay direct too (under ``MIN_FLOPS`` as direct convolutions): the
transforms cost per tile and channel, and only enough GEMM work hides them. A Winograd
kernel also needs trials (four stages to schedule): a model tuned under a trial cap of
fewer than ``MIN_TRIALS_PER_TASK`` a task, or a time budget of fewer at ``TRIAL_S`` a trial,
keeps every convolution direct (``Lowering.for_budget``). The measurements behind each threshold are in RESULTS.md (the
"Winograd" sections and the Winograd model runs, with their commands); ResNets and the
small shapes that set them are not held out.
"""

from __future__ import annotations

from typing import Any

from tvm import relax, te, topi
from tvm.topi.nn.winograd_util import winograd_transform_matrices
from tvm.topi.utils import get_const_tuple

from stormdrop.lowering.layout import _ints

MODES = ("auto", "off", "2", "4")


def weight_transform(kernel: te.Tensor, m: int) -> te.Tensor:
    """HWIO 3x3 weights -> ``[alpha, alpha, CI, CO]`` (G g G^T), alpha = m + 2."""
    kh, kw, ci, co = get_const_tuple(kernel.shape)
    m = int(m)  # (call_te hands scalars over as TIR integers)
    alpha = m + kh - 1
    _, _, g = winograd_transform_matrices(m, kh, str(kernel.dtype))
    r_kh = te.reduce_axis((0, kh), name="r_kh")
    r_kw = te.reduce_axis((0, kw), name="r_kw")
    return te.compute(
        (alpha, alpha, ci, co),
        lambda eps, nu, c, k: te.sum(kernel[r_kh, r_kw, c, k] * g[eps, r_kh] * g[nu, r_kw], axis=[r_kh, r_kw]),
        name="winograd_weight")


def conv2d_nhwc(data: te.Tensor, kernel_pack: te.Tensor, padding: Any, m: int, out_dtype: str) -> te.Tensor:
    """NHWC 3x3 stride-1 convolution from transformed weights ``[alpha, alpha, CI, CO]``.

    TVM's ``topi.nn.conv2d_winograd_nhwc`` without the weight transform (its
    pre-computed path is disabled in 0.27), with the transformed weights laid out
    ``CI, CO`` so the GEMM's output channels are contiguous.
    """
    n, h, w, ci = get_const_tuple(data.shape)
    m = int(m)  # (call_te hands scalars over as TIR integers)
    alpha, _, _, co = get_const_tuple(kernel_pack.shape)
    r = alpha - m + 1
    pt, pl, pb, pr = _ints(padding)
    a_mat, b_mat, _ = winograd_transform_matrices(m, r, str(out_dtype))
    oh, ow = h + pt + pb - r + 1, w + pl + pr - r + 1
    nh, nw = (oh + m - 1) // m, (ow + m - 1) // m
    tiles = n * nh * nw
    data_pad = topi.nn.pad(data, (0, pt, pl, 0),
                           (0, (nh - 1) * m + alpha - h - pt, (nw - 1) * m + alpha - w - pl, 0),
                           name="data_pad", attrs={"schedule_rule": "None"})
    input_tile = te.compute(
        (alpha, alpha, tiles, ci),
        lambda eps, nu, p, c: data_pad[p // (nh * nw), ((p // nw) % nh) * m + eps, (p % nw) * m + nu, c],
        name="input_tile", attrs={"schedule_rule": "None"})
    r_a = te.reduce_axis((0, alpha), "r_a")
    r_b = te.reduce_axis((0, alpha), "r_b")
    data_pack = te.compute(
        (alpha, alpha, tiles, ci),
        lambda eps, nu, p, c: te.sum(input_tile[r_a, r_b, p, c] * b_mat[r_a, eps] * b_mat[r_b, nu],
                                     axis=[r_a, r_b]),
        name="data_pack",
        attrs={"auto_scheduler_simplify_const_tensor_indices": ["eps", "nu", "r_a", "r_b"],
               "schedule_rule": "conv2d_nhwc_winograd_data_pack"})
    rc = te.reduce_axis((0, ci), name="ci")
    bgemm = te.compute(
        (alpha, alpha, tiles, co),
        lambda eps, nu, p, k: te.sum(data_pack[eps, nu, p, rc] * kernel_pack[eps, nu, rc, k], axis=[rc]),
        name="bgemm", attrs={"layout_free_placeholders": [kernel_pack],
                             "meta_schedule.write_cache_level": [2]})
    r_a = te.reduce_axis((0, alpha), "r_a")
    r_b = te.reduce_axis((0, alpha), "r_b")
    inverse = te.compute(
        (m, m, tiles, co),
        lambda vh, vw, p, k: te.sum(bgemm[r_a, r_b, p, k] * a_mat[r_a, vh] * a_mat[r_b, vw], axis=[r_a, r_b]),
        name="inverse",
        attrs={"auto_scheduler_simplify_const_tensor_indices": ["vh", "vw", "r_a", "r_b"],
               "schedule_rule": "conv2d_nhwc_winograd_inverse"})
    return te.compute(
        (n, oh, ow, co),
        lambda b, y, x, k: inverse[y % m, x % m, b * nh * nw + (y // m) * nw + (x // m), k],
        name="conv2d_winograd")


MIN_FLOPS = 24e6  # a direct convolution's FLOPs under which Winograd's transforms cost more than they save
MIN_TRIALS_PER_TASK = 64  # fewer (a model's trial cap over its tasks): no Winograd, see the module docstring
TRIAL_S = 0.5  # a time budget's trials, for the rule above: a CPU host's build and run of a candidate, about


def choose_tile(mode: str, out_hw: tuple[int, int], ci: int, co: int) -> int | None:
    """The output tile m for a 3x3 stride-1 convolution, or ``None`` to keep it direct."""
    if mode == "off":
        return None
    if mode in ("2", "4"):
        return int(mode)
    if min(out_hw) < 14 or min(ci, co) < 16 or 18 * out_hw[0] * out_hw[1] * ci * co < MIN_FLOPS:
        return None
    return 4 if min(out_hw) >= 28 else 2


def eligible(call: relax.Call) -> bool:
    """A conv2d that Winograd can compute: NHWC/HWIO, 3x3, stride 1, no dilation, one group."""
    a = call.attrs
    if (str(a.data_layout), str(a.kernel_layout), str(a.out_layout)) != ("NHWC", "HWIO", "NHWC"):
        return False
    kshape = call.args[1].ty.shape
    return (int(a.groups) == 1 and _ints(a.strides) == [1, 1] and _ints(a.dilation) == [1, 1]
            and [int(kshape[0]), int(kshape[1])] == [3, 3])


def tile_of(call: relax.Call, mode: str) -> int | None:
    """The output tile m that ``legalization(mode, ...)`` computes this conv2d call with, or ``None``
    where it stays the layout's convolution."""
    if mode == "off" or not eligible(call) or str(call.args[0].ty.dtype) != "float32":
        return None
    _, _, ci, co = _ints(call.args[1].ty.shape)
    out = call.ty.shape
    return choose_tile(mode, (int(out[1]), int(out[2])), ci, co)


def planned_key(call: relax.Call, mode: str) -> tuple | None:
    """(input shape, output channels, alpha) of the Winograd kernel ``legalization(mode, ...)``
    makes of this conv2d call, or ``None``: the shapes ``kernel_key`` reads off the kernel."""
    m = tile_of(call, mode)
    if m is None:
        return None
    return tuple(_ints(call.args[0].ty.shape)), _ints(call.args[1].ty.shape)[3], m + 2


def _kernel_shapes(mod: Any) -> tuple[tuple, tuple, tuple] | None:
    """(input, transformed weights ``[alpha, alpha, CI, CO]``, output) shapes of a Winograd kernel
    (a task's module, from its arguments: the input first, the output last), or ``None``."""
    from stormdrop.workloads import kernel_args

    shapes = [tuple(shape) for _, shape, _ in kernel_args(mod)]
    if len(shapes) < 3 or len(shapes[-1]) != 4:
        return None
    for shape in shapes[:-1]:
        if len(shape) == 4 and shape[0] == shape[1] and shape[0] in (4, 6) and shape[3] == shapes[-1][3]:
            return shapes[0], shape, shapes[-1]
    return None


def kernel_key(mod: Any) -> tuple | None:
    """(input shape, output channels, alpha) of a Winograd kernel (a task's module), or ``None``."""
    found = _kernel_shapes(mod)
    if found is None:
        return None
    data, (alpha, _, _, co), _ = found
    return data, co, alpha


def legalization(mode: str, fallback: Any) -> Any:
    """A ``LegalizeOps`` rule for ``relax.nn.conv2d``: Winograd where ``choose_tile`` says so
    (``tile_of``), ``fallback(bb, call)`` (the layout's legalization) for every other convolution."""

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        m = tile_of(call, mode)
        if m is None:
            return fallback(bb, call)
        weights = bb.emit_te(weight_transform, call.args[1], m, primfunc_name_hint="winograd_weight")
        return bb.call_te(conv2d_nhwc, call.args[0], weights, _ints(call.attrs.padding), m, "float32",
                          primfunc_name_hint="conv2d_winograd")

    return legalize


def direct_flops(mod: Any) -> int | None:
    """The FLOPs of the direct convolution a Winograd kernel computes (``None`` if ``mod`` is
    not one): GFLOPS of Winograd and direct kernels then count the same work."""
    found = _kernel_shapes(mod)
    if found is None:
        return None
    _, (_, _, ci, co), (n, oh, ow, _) = found
    return 2 * n * oh * ow * co * ci * 9
