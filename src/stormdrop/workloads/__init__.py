"""What is tuned: built-in operators and user-defined kernels (see :mod:`.kernels`)."""

from __future__ import annotations

from stormdrop.workloads.kernels import (
    Kernel,
    builtin_operators,
    estimate_flops,
    kernel_args,
    parameter_shapes,
    parse_kernel,
)

__all__ = ["Kernel", "builtin_operators", "estimate_flops", "kernel_args", "parameter_shapes", "parse_kernel"]
