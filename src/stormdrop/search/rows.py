"""Row vectors: a copy-like kernel vectorized along its innermost loop, not across its rows.

MetaSchedule's sketch of a kernel made only of copies, transposes, reshapes, slices and
concatenations (a ShuffleNet's channel shuffle: slice, transpose, concatenate, reshape, transpose,
reshape) inlines everything into the output's block and lets its postprocessor fuse all the
output's loops into one and split it into a parallel part and a vector of 8 or 16 lanes. Where the
innermost loop's extent is no multiple of the vector (a 14x14 feature map's rows of 14), the lanes
straddle rows: each lane's source index is a chain of divisions and remainders of the fused index,
and every vector load is a gather. A vector along the innermost loop alone (14 lanes) reads
contiguous rows. ``space`` is that schedule, one more sketch beside MetaSchedule's, which the
storm's measurements choose between; it has no decisions of its own.
"""

from __future__ import annotations

import tvm
from tvm.s_tir import Schedule

MIN_LANES = 4  # a shorter innermost loop is not worth a vector
MAX_LANES = 64  # a longer one is split by MetaSchedule's own sketch well enough


def space(mod: tvm.IRModule, lanes: int) -> Schedule | None:
    """``mod`` with every block inlined into its last one, that block's outer loops fused and run in
    parallel and its innermost loop vectorized whole; ``None`` unless every block is spatial (copies,
    layout changes, element-wise arithmetic: no reduction) and the innermost loop's extent is a
    ``MIN_LANES``-``MAX_LANES`` non-multiple of ``lanes`` (a multiple gives contiguous vectors across
    rows already)."""
    sch = Schedule(mod)
    try:
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - no root block: not such a kernel
        return None
    if not blocks or any(int(iv.iter_type) != 0 for b in blocks for iv in sch.get(b).iter_vars):
        return None
    try:
        for block in blocks[:-1]:
            sch.compute_inline(block)
    except Exception:  # noqa: BLE001 - a block that cannot be inlined: MetaSchedule's sketch only
        return None
    loops = sch.get_loops(blocks[-1])
    extent = sch.get(loops[-1]).extent
    if len(loops) < 2 or not isinstance(extent, tvm.tirx.IntImm):
        return None
    extent = int(extent.value)
    if not MIN_LANES <= extent <= MAX_LANES or extent % lanes == 0:
        return None
    sch.parallel(sch.fuse(*loops[:-1]))
    sch.vectorize(loops[-1])
    return sch
