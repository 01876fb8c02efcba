"""Kernels to tune: built-in operators (``NAME:key=value,...``) and user files.

Spec grammar::

    matmul:M=512,N=512,K=512
    conv2d:N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1,layout=NHWC
    path/to/file.py:function_name

Every built-in accepts an optional ``dtype=`` (default ``float32``). The PrimFunc
of a kernel takes its inputs first and its output last.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import te

from stormdrop.errors import SpecError
from stormdrop.workloads._operators import OPERATORS, build_builtin
from stormdrop.workloads._spec import split_spec
from stormdrop.workloads._user import is_user_spec, load_user_function


@dataclass(frozen=True)
class Kernel:
    """One tunable kernel.

    Attributes:
        name: short, filename-safe display name, e.g. ``matmul_512x512x512``.
        spec: the spec string as given by the user.
        op_class: operator signature without shapes, the key for schedule reuse
            (``matmul``, ``conv2d_nhwc``, ``dense_bias_relu``, ``user:<function>``, ...).
        mod: ``IRModule({"main": PrimFunc})``.
        flops: floating point operations of one run (a multiply-add counts 2).
    """

    name: str
    spec: str
    op_class: str
    mod: tvm.IRModule
    flops: int


def builtin_operators() -> dict[str, str]:
    """Built-in operator name -> parameter help, e.g. ``{"matmul": "M=,N=,K=[,dtype=float32]"}``."""
    return {name: opdef.help() for name, opdef in OPERATORS.items()}


def estimate_flops(mod: tvm.IRModule) -> int:
    """TVM's FLOP estimate of ``mod`` as an int; 0 if the estimate fails."""
    try:
        from tvm.s_tir.analysis import estimate_tir_flops

        return max(0, int(estimate_tir_flops(mod)))
    except Exception:
        return 0


def kernel_args(mod: tvm.IRModule) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, dtype)`` of each argument of ``mod["main"]``, in order (output last).

    (In TVM 0.27 a PrimFunc has no ``buffer_map``: its params are buffer variables.)
    """
    return [(str(p.name), tuple(int(d) for d in p.shape), str(p.dtype)) for p in mod["main"].params]


def parameter_shapes(mod: tvm.IRModule) -> list[tuple[int, ...]] | None:
    """The shapes of ``mod["main"]``'s parameters, in order (``kernel_args``); None where one is symbolic."""
    try:
        return [shape for _, shape, _ in kernel_args(mod)]
    except (TypeError, ValueError):  # a symbolic dimension
        return None


def parse_kernel(spec: str) -> Kernel:
    """Parse a kernel spec into a :class:`Kernel`; ``SpecError`` (one line) if malformed."""
    if not isinstance(spec, str):
        raise SpecError(f"kernel spec must be a string, got {type(spec).__name__}")
    op, params = split_spec(spec)
    if op not in OPERATORS and is_user_spec(spec):
        mod, func_name = load_user_function(spec)
        return Kernel(func_name, spec, f"user:{func_name}", mod, estimate_flops(mod))
    built = build_builtin(op, params)
    mod = tvm.IRModule({"main": te.create_prim_func(built.tensors)})
    return Kernel(built.name, spec, built.op_class, mod, built.flops)
