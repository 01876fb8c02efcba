"""Register spills of a candidate on a CPU, as LLVM compiles it: a measurement-free check of a schedule.

A transferred schedule (``search.reuse``) keeps its donor's unroll depth and refits its tiles to this
workload's loops; the refit can put more accumulators and reused weight vectors into the unrolled
body than the CPU has vector registers, and LLVM then spills them to the stack inside the
innermost loop. Such kernels ran several times slower than the task's best a few raindrop steps
later (docs/guide.md, "Reuse"). Compiling a kernel to assembly takes a fraction of building and
timing it, so reuse can pass over a spilling transfer for one that does not before any is measured
(``StormConfig.spill_veto``).
"""

from __future__ import annotations

import logging

import tvm
from tvm.target import Target

log = logging.getLogger("stormdrop")


def vector_spills(mod: tvm.IRModule, target: Target) -> int | None:
    """How many instructions of the compiled kernel move a vector register to or from the stack
    (spills, reloads; a few in any function's prologue), or None where that cannot be told: not an
    LLVM CPU target, or the kernel does not compile here."""
    if target.kind.name != "llvm":
        return None
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from stormdrop.tvm_compat.tir_pipeline import pipeline

    try:  # the kernel as a model runs it: the weights' layout rewrite is done once, at compile time
        lib = tvm.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target,
                        pipeline=pipeline())
        asm = lib.inspect_source("asm")
    except Exception as err:  # noqa: BLE001 -- TVM raises many kinds; the builder reports it as it measures
        log.debug("spill check: the kernel did not compile here: %s", err)
        return None
    return sum(1 for line in asm.splitlines()
               if line.startswith("\t") and "(%rsp)" in line and "mm" in line.split("#")[0])
