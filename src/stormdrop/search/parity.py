"""Parity planes: a stride-2 convolution's padded input stored as its even and odd columns.

A stride-2 convolution or pooling in NCHW (a kernel, ``tune --kernel``; models are NHWC on
CPUs) reads its padded input at ``2*j + dj`` along the row, the axis its output vectorizes:
every vector load gathers every other element. Stored as two planes of columns, even and odd
(``w -> (w % 2, w // 2)``), the same read is ``[dj % 2, j + dj // 2]``: contiguous in ``j``.

The change is two schedule instructions on the padded input's block, ``TransformLayout`` of the
buffer and ``TransformBlockLayout`` of the block (so that the block writes the planes row by
row), put in front of MetaSchedule's sketches of the rewritten function: the workload, and what
the database keys it by, stay as they are, and the planes are one more set of sketches beside
the usual ones, which the storm's cost model and measurements choose between. On MobileNetV2's
stride-2 depthwise 3x3 over 112x112x96, 64 trials against MetaSchedule's 192: 0.83x without the
planes, 1.24x with them (RESULTS, "Kernels against MetaSchedule").
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.s_tir import Schedule
from tvm.sym import detect_linear_equation
from tvm.tirx import IndexMap

STRIDE = 2


def _parity(*axes: Any) -> tuple:
    """The index map: the last axis split into (parity, column // 2)."""
    *outer, w = axes
    return (*outer, w % STRIDE, w // STRIDE)


def _blocks(mod: tvm.IRModule) -> tuple[list, list]:
    """The blocks under ``main``'s root block, and the buffers the root allocates."""
    sch = Schedule(mod)
    root = sch.get_sblock("root")
    return [sch.get(rv) for rv in sch.get_child_blocks(root)], list(sch.get(root).alloc_buffers)


def _strided_last_axis(block: Any, buffer: Any) -> bool:
    """Whether ``block`` reads ``buffer``'s last axis at ``STRIDE * v + ...`` where ``v`` is the
    spatial variable that indexes the last axis of what the block writes."""
    if len(block.writes) != 1:
        return False
    out_last = block.writes[0].region[-1].min
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == 0]  # data parallel
    if not (isinstance(out_last, tvm.tirx.Var) and any(out_last.same_as(v) for v in spatial)):
        return False
    for read in block.reads:
        if read.source.same_as(buffer):
            coeffs = detect_linear_equation(read.region[-1].min, [out_last])
            if len(coeffs) == 2 and isinstance(coeffs[0], tvm.tirx.IntImm) and int(coeffs[0]) == STRIDE:
                return True
    return False


def candidates(mod: tvm.IRModule) -> list[str]:
    """Names of ``mod``'s blocks that write a buffer of the function's own (a padded input) of
    an even last extent that another block reads at stride 2 along its output's rows."""
    blocks, own = _blocks(mod)
    names = []
    for producer in blocks:
        if len(producer.writes) != 1:
            continue
        buffer = producer.writes[0].source
        if not any(buffer.same_as(b) for b in own):
            continue
        last = buffer.shape[-1]
        if not (isinstance(last, tvm.tirx.IntImm) and int(last) % STRIDE == 0):
            continue
        if any(_strided_last_axis(b, buffer) for b in blocks if not b.same_as(producer)):
            names.append(producer.name_hint)
    return names


def planes(mod: tvm.IRModule) -> Schedule | None:
    """A schedule of ``mod`` whose padded inputs read at stride 2 are stored as parity planes (its
    trace holds the instructions that do it), or None when ``mod`` has none or TVM refuses."""
    try:
        names = candidates(mod)
        if not names:
            return None
        sch = Schedule(mod)
        for name in names:
            block = sch.get_sblock(name)
            shape = sch.get(block).writes[0].source.shape
            index_map = IndexMap.from_func(_parity, ndim=len(shape), index_dtype=str(shape[-1].ty))
            sch.transform_layout(block, ("write", 0), index_map)
            sch.transform_block_layout(block, index_map)
    except Exception:  # noqa: BLE001 - no root block, a symbolic extent, a block TVM cannot relayout: no planes
        return None
    return sch
