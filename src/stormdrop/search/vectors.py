"""Whether a CPU schedule's reductions run as vectors: a measurement-free check of a schedule.

MetaSchedule's postprocessor vectorizes a block's innermost data-parallel loops, and only where
they run along contiguous memory. A transferred schedule (``search.reuse``) refits its donor's
tiles to this workload's loops; where the refit leaves the innermost tile of the output's last
(contiguous) axis at 1 and puts the register tile on another axis, nothing is vectorized, and the
product runs as scalar code: a MnasNet 1x1 convolution (16 to 48 channels at 62x62) so
transferred ran about three times slower than the same task's best after a short search. Reading
the scheduled loop nest costs a fraction of a millisecond, so reuse can pass over such a transfer
for one that vectorizes before any is measured (``StormConfig.vector_veto``).
"""

from __future__ import annotations

from typing import Any

from tvm.tirx import ForKind
from tvm.tirx.analysis import undefined_vars

MIN_LANES = 4  # an output whose last axis is shorter has nothing to vectorize along


def unvectorized(mod: Any) -> list[str]:
    """The reduction blocks of a scheduled module (``mod["main"]``) that do not run inside a vector
    loop along the last axis of the buffer they write: no vectorized loop encloses them, or the
    vectorized loops feed other axes only. Blocks writing a last axis shorter than ``MIN_LANES``
    are left out."""
    found: list[str] = []
    _walk(mod["main"].body, [], found)
    return found


def _walk(stmt: Any, vector_loops: list, found: list[str]) -> None:
    kind = type(stmt).__name__
    if kind == "For":
        inner = vector_loops + [stmt.loop_var] if stmt.kind == ForKind.VECTORIZED else vector_loops
        _walk(stmt.body, inner, found)
        return
    if kind == "SBlockRealize":
        block = stmt.block
        if _reduces(block) and not _along_last_axis(stmt, vector_loops):
            found.append(str(block.name_hint))
        _walk(block.body, vector_loops, found)
        return
    for field in ("body", "then_case", "else_case", "seq"):
        child = getattr(stmt, field, None)
        if child is None:
            continue
        for s in (child if isinstance(child, (list, tuple)) or type(child).__name__ == "Array" else [child]):
            _walk(s, vector_loops, found)


def _reduces(block: Any) -> bool:
    return any(int(iv.iter_type) == 2 for iv in block.iter_vars)  # IterVar.CommReduce


def _along_last_axis(realize: Any, vector_loops: list) -> bool:
    """Whether one of ``vector_loops`` feeds the index of the last axis the block writes (or that
    axis is too short to vectorize along)."""
    block = realize.block
    writes = [w for w in block.writes if len(w.region)]
    if not writes or all(_extent(w.region[-1].extent) < MIN_LANES and _extent(_written(w).shape[-1]) < MIN_LANES
                         for w in writes):
        return True
    if not vector_loops:
        return False
    fed = [iv.var for iv, value in zip(block.iter_vars, realize.iter_values)
           if any(v.same_as(loop) for v in undefined_vars(value) for loop in vector_loops)]
    return any(any(v.same_as(f) for v in undefined_vars(w.region[-1].min) for f in fed) for w in writes)


def _written(region: Any) -> Any:
    """The buffer of a block's write region (``source`` in TVM 0.27's TensorRegion)."""
    return getattr(region, "buffer", None) or region.source


def _extent(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):  # a symbolic extent: long enough
        return MIN_LANES
