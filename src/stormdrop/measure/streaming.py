"""Kernels that stream their weights: timed warm where a model's tasks are timed cold.

A model's tasks are timed on a CPU with the caches flushed of each kernel's weights and output
(``MeasureConfig.cache_flush``): inside a model the other kernels' weights evicted its own. A
kernel that uses each weight about once, a classifier's product for one row (two FLOPs a
weight), is bound by how fast its weights arrive. Flushed, they come from memory at the same
rate for every schedule, and the search ranks its candidates by noise; inside a model small
enough, its weights stay in the last-level cache between inferences, where the schedules
differ by more than twice. ``streams_weights`` says which kernels these are; the gateway times
them warm where ``MeasureConfig.warm_streams`` says so (the default). Where a model's weights do
not stay in the cache, its schedules run alike from memory, so ranking them warm costs nothing;
the raindrop's one-row register tiles (``DecisionSpace.register_tiles``) are the schedules that
warm ranking finds faster.
"""

from __future__ import annotations

import math

import tvm

from stormdrop.measure.config import MeasureConfig
from stormdrop.workloads import estimate_flops, kernel_args


def weight_elements(workload: tvm.IRModule) -> int:
    """How many elements a kernel's weights hold: its buffers that a model fills with constants
    (``layout_free_buffers``, which a model's tasks carry on a CPU); 0 where it says of none."""
    try:
        attrs = workload["main"].attrs
        shapes = [shape for _, shape, _ in kernel_args(workload)]
    except (KeyError, TypeError, ValueError):  # no main function, or a symbolic dimension
        return 0
    if attrs is None or "layout_free_buffers" not in attrs:
        return 0
    picked = [int(i) for i in attrs["layout_free_buffers"]]
    if not all(0 <= i < len(shapes) for i in picked):
        return 0
    return sum(math.prod(shapes[i]) for i in picked)


def streams_weights(workload: tvm.IRModule,
                    max_flops_per_weight: float = MeasureConfig.stream_flops_per_weight) -> bool:
    """Whether a kernel does at most ``max_flops_per_weight`` FLOPs per element of its weights
    (a kernel TVM cannot count FLOPs of is timed as the others)."""
    weights = weight_elements(workload)
    flops = estimate_flops(workload) if weights else 0
    return 0 < flops <= max_flops_per_weight * weights
