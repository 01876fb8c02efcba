"""Kernels that stream their weights: timed warm where a model's tasks are timed cold.

A model's tasks are timed on a CPU with the caches flushed of each kernel's weights and output
(``MeasureConfig.cache_flush``): inside a model the other kernels' weights evicted its own. A
kernel that uses each weight about once, a classifier's product for one row (two FLOPs a
weight), is bound by how fast its weights arrive. Flushed, they come from memory at the same
rate for every schedule, and the search ranks its candidates by noise; inside a model small
enough, its weights stay in the last-level cache between inferences, where the schedules
differ by more than twice. ``streams_weights`` says which kernels these are; the gateway times
them warm where ``MeasureConfig.warm_streams`` says so (off by default: timed warm, such a kernel
came out faster inside one held out model and slower inside another).
"""

from __future__ import annotations

import math

import tvm

MAX_FLOPS_PER_WEIGHT = 4  # each weight feeds at most two output rows' multiply-adds


def _main(workload: tvm.IRModule) -> tvm.tirx.PrimFunc | None:
    funcs = [f for f in workload.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return funcs[0] if len(funcs) == 1 else None


def weight_elements(workload: tvm.IRModule) -> int:
    """How many elements a kernel's weights hold: its buffers that a model fills with constants
    (``layout_free_buffers``, which a model's tasks carry on a CPU); 0 where it says of none."""
    func = _main(workload)
    if func is None or func.attrs is None or "layout_free_buffers" not in func.attrs:
        return 0
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    try:
        args = ArgInfo.from_prim_func(func)
    except Exception:  # noqa: BLE001 - an argument that is no buffer: no weights to count
        return 0
    total = 0
    for i in func.attrs["layout_free_buffers"]:
        shape = args[int(i)].shape if 0 <= int(i) < len(args) else None
        if shape is None or not all(isinstance(d, (int, tvm.tirx.IntImm)) for d in shape):
            return 0
        total += math.prod(int(d) for d in shape)
    return total


def streams_weights(workload: tvm.IRModule) -> bool:
    """Whether a kernel does at most ``MAX_FLOPS_PER_WEIGHT`` FLOPs per element of its weights."""
    weights = weight_elements(workload)
    if weights == 0:
        return False
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        flops = float(estimate_tir_flops(workload))
    except Exception:  # noqa: BLE001 - a kernel TVM cannot count: timed as the others
        return False
    return flops <= MAX_FLOPS_PER_WEIGHT * weights
