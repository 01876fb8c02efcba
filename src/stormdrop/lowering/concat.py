"""Concatenations that are kernels of their own as one copy per input, each into its slice.

TVM legalizes ``concat`` as one block over the output whose every element picks its input with
an ``if_then_else`` on its index along the concatenated axis. Along a channel axis (NHWC's
innermost) that choice sits inside the vector loop, so the copy runs element by element, far
below the memory's bandwidth. ``as_copies`` rewrites each such kernel of a fused module, a
concatenation that fusion left alone, as one block per input, ``out[..., offset + i, ...] =
x[..., i, ...]``, which the search parallelizes and vectorizes like any copy: the same
arguments, the same output. A concatenation fused with its consumers (a DenseNet's batch norm
and ReLU) keeps TVM's block, so that fusion is not lost. Applied on CPUs.
"""

from __future__ import annotations

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T


def copies(shapes: list[list[int]], axis: int, dtype: str) -> tvm.tirx.PrimFunc:
    """A PrimFunc of ``len(shapes)`` inputs and the output last, the inputs concatenated along
    ``axis``, one block (``T_concat_i``) per input."""
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            T.func_name("concatenate")
            T.func_attr({"tirx.noalias": True})
            inputs = [T.arg(f"x{i}", T.Buffer(s, dtype)) for i, s in enumerate(shapes)]
            out = T.arg("T_concat", T.Buffer(out_shape, dtype))
            offset = 0
            for i, (x, shape) in enumerate(zip(inputs, shapes)):
                with T.grid(*shape) as loops:
                    with T.sblock(f"T_concat_{i}"):
                        at = list(T.axis.remap("S" * len(shape), list(loops)))
                        to = list(at)
                        to[axis] = to[axis] + offset
                        T.reads(x[tuple(at)])
                        T.writes(out[tuple(to)])
                        T.buffer_store(out, x[tuple(at)], to)
                offset += shape[axis]
    return ib.get().without_attr("global_symbol")  # as_copies gives it the kernel's own attributes


def _concat_shapes(func: tvm.tirx.PrimFunc) -> tuple[list[list[int]], int, str] | None:
    """(the inputs' shapes, the axis, the dtype) when ``func`` is TVM's concatenation of static
    shapes (one block named ``T_concat`` under the root, the output last), else ``None``."""
    try:
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - no root block: not a legalized concatenation
        return None
    if len(blocks) != 1 or sch.get(blocks[0]).name_hint != "T_concat":
        return None
    try:
        args = ms.arg_info.ArgInfo.from_prim_func(func)
    except Exception:  # noqa: BLE001 - an argument that is no buffer of static shape
        return None
    if len(args) < 3 or not all(isinstance(d, (int, tvm.tirx.IntImm)) for a in args for d in a.shape):
        return None
    shapes = [[int(d) for d in a.shape] for a in args]
    *ins, out = shapes
    if len({str(a.dtype) for a in args}) != 1 or any(len(s) != len(out) for s in ins):
        return None
    differ = [a for a in range(len(out)) if any(s[a] != out[a] for s in ins)]
    if len(differ) != 1 or sum(s[differ[0]] for s in ins) != out[differ[0]]:
        return None
    return ins, differ[0], str(args[0].dtype)


def as_copies(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (a fused module) with each kernel that is TVM's concatenation alone replaced by
    ``copies`` of the same shapes: the same name, arguments and output."""
    funcs, changed = {}, False
    for gv, func in mod.functions.items():
        found = _concat_shapes(func) if isinstance(func, tvm.tirx.PrimFunc) and \
            gv.name_hint.startswith("concatenate") else None
        if found is not None:
            new = copies(*found)
            for key, value in func.attrs.items():
                new = new.with_attr(key, value)
            func, changed = new, True
        funcs[gv] = func
    return tvm.IRModule(funcs, attrs=mod.attrs) if changed else mod
