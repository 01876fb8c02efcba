"""Workload identity: what makes two stored kernels one workload beyond TVM's structural equality
(their block names, ``block_names``), and the one form a kernel is stored in (``as_module``).
Pure functions of a module: nothing here reads or writes a database."""

from __future__ import annotations

from typing import Any

import tvm
from tvm.s_tir import Schedule


def block_names(mod: tvm.IRModule | Schedule) -> tuple[str, ...]:
    """The names of the blocks under the root block of ``mod`` (a module or a schedule of one), in
    order (``lv224_red``). Structural equality leaves names
    out, but a trace finds its blocks by name: two equal kernels whose blocks are named apart (a
    global mean over ``lv235`` in one model, over ``lv397`` in another) cannot replay each other's
    records, so they are two workloads (reuse transfers between them, renaming the blocks)."""
    sch = mod if isinstance(mod, Schedule) else Schedule(mod)
    return tuple(sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root")))


def same_workload(a: tvm.IRModule, b: tvm.IRModule) -> bool:
    """One workload: structurally equal (names of variables and buffers aside) with the same block names."""
    import tvm_ffi

    return bool(tvm_ffi.structural_equal(a, b)) and block_names(a) == block_names(b)


def as_module(mod: Any) -> tvm.IRModule:
    """``mod`` as an IRModule (a PrimFunc becomes its ``main``); TypeError for anything else."""
    if isinstance(mod, tvm.IRModule):
        return mod
    if isinstance(mod, tvm.tirx.PrimFunc):
        return tvm.IRModule({"main": mod})
    raise TypeError(f"expected an IRModule, got {type(mod).__name__}")
