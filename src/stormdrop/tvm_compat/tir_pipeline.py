"""Work-around of TVM 0.27 in its TIR lowering: vector loops that cross a row (the index of all:
``tvm_compat``).

MetaSchedule's ``RewriteParallelVectorizeUnroll`` post-processor fuses all the loops of an
element-wise block and splits the fused loop into a parallel part and a vector part of the
annotated width (64 on CPUs). When that width does not divide the innermost axis, nor the axis
the width (a ReLU over 56x56x144 in NHWC: 64 lanes, rows of 144), the block's indices are
``floordiv``/``floormod`` of the fused loop by the row length; TVM's lowering flattens the buffers
but does not simplify those indices back to the fused loop before ``VectorizeLoop``, which then
computes every lane's index apart and loads and stores the lanes one by one, where the same
pass over rows of 128 loads and stores whole vectors.

``split_row_vectors`` splits each such vector loop into a serial loop over vectors that stay in
one row (the width's greatest common divisor with the row lengths it crosses, when that is at
least ``MIN_LANES``), the inner one vectorized: the same iterations in the same order, so the
same results. It runs first in the TIR pipeline named ``PIPELINE`` (TVM's default ``s_tir``
pipeline otherwise), which every kernel stormdrop builds goes through: the candidates the
builders time and the kernels of the compiled model alike (``pipeline``).
"""

from __future__ import annotations

import functools
import math

import tvm
from tvm import tirx

PIPELINE = "stormdrop"
MIN_LANES = 4  # narrower vectors are left as TVM lowers them
_STEPS = (tirx.Add, tirx.Sub, tirx.Mul, tirx.FloorDiv, tirx.FloorMod, tirx.Min, tirx.Max, tirx.Cast)


def _row_lengths(expr: tvm.ir.PrimExpr, var: tirx.Var, out: list[int]) -> None:
    """Append every constant divisor of a ``floordiv``/``floormod`` of ``var`` in ``expr``."""
    if isinstance(expr, (tirx.FloorDiv, tirx.FloorMod)) and isinstance(expr.b, tirx.IntImm) \
            and any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr.a)):
        out.append(int(expr.b.value))
    if isinstance(expr, _STEPS):
        for child in (expr.value,) if isinstance(expr, tirx.Cast) else (expr.a, expr.b):
            _row_lengths(child, var, out)


def _vector_width(loop: tirx.For) -> int | None:
    """The width the vector loop ``loop`` is split to, or None to keep it."""
    body = loop.body
    if not isinstance(body, tvm.s_tir.SBlockRealize) or not isinstance(loop.extent, tirx.IntImm):
        return None
    width = int(loop.extent.value)
    rows: list[int] = []
    for value in body.iter_values:
        _row_lengths(value, loop.loop_var, rows)
    crossed = [r for r in rows if r % width and width % r]
    if not crossed:
        return None
    lanes = math.gcd(width, *crossed)
    return lanes if lanes >= MIN_LANES else None


def split_row_vectors(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every vector loop that crosses a row split as the module docstring says
    (``func`` itself when there is none, or it has no schedulable blocks)."""
    try:
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        pending = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - a function without a root block: nothing of this kind to split
        return func
    changed = False
    while pending:
        block = pending.pop()
        pending.extend(sch.get_child_blocks(block))
        loops = sch.get_loops(block)
        if not loops:
            continue
        loop = sch.get(loops[-1])
        if loop.kind != tirx.ForKind.VECTORIZED:
            continue
        lanes = _vector_width(loop)
        if lanes is None:
            continue
        _, inner = sch.split(loops[-1], [None, lanes])
        sch.vectorize(inner)
        changed = True
    return sch.mod["main"] if changed else func


@tvm.transform.module_pass(opt_level=0, name="SplitRowVectors")
def _split_row_vectors_pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    out = {gv: split_row_vectors(func) if isinstance(func, tirx.PrimFunc) else func
           for gv, func in mod.functions.items()}
    if all(out[gv].same_as(func) for gv, func in mod.functions.items()):
        return mod
    return tvm.IRModule(out, attrs=mod.attrs)


def _stormdrop_pipeline() -> tuple:
    lower, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("s_tir")
    return tvm.transform.Sequential([_split_row_vectors_pass, lower]), finalize_host, finalize_device


@functools.cache
def pipeline() -> str:
    """The name of stormdrop's TIR pipeline (registered with TVM once per process), for
    ``tvm.build(..., pipeline=)`` and ``tvm.compile(..., tir_pipeline=)``."""
    tvm.tirx.compilation_pipeline.register_tir_pipeline(PIPELINE, _stormdrop_pipeline)
    return PIPELINE
