"""Vectorizable transcendental functions for CPU models (fast-math legalization).

TVM lowers ``erf``/``exp``/``tanh``/``sigmoid`` to one scalar libm call per element
on LLVM CPU targets: a kernel with an erf-GELU epilogue (BERT's FFN matmul) ran at
a fifth of the plain matmul's speed. These legalizations replace them, before the
default ones, by TOPI's polynomial approximations, which vectorize:

- ``erf`` -> ``topi.fast_erf`` (Eigen's rational approximation, clamped to |x| <= 4);
- ``exp`` -> ``topi.fast_exp`` (Cephes-style, range-reduced, clamped to [-88.4, 88.4]);
- ``tanh`` -> ``topi.fast_tanh``; ``sigmoid(x)`` -> ``1 / (1 + fast_exp(-x))``;
- ``nn.softmax`` -> ``topi.nn.fast_softmax`` (the same reductions, ``fast_exp``).

float32 only (other dtypes keep TVM's legalization). Accuracy, checked by
``tests/test_layout.py`` against NumPy/SciPy on 200,001 points of [-12, 12] ([-80, 80]
for exp): within 2e-6 of the exact value (relative; for sigmoid relative to max(|y|, 1)); whole models
are checked against ONNX Runtime as before (``--no-fast-math`` turns this off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, te, topi


def _float32_only(name: str, fast: Callable[[relax.BlockBuilder, relax.Call], relax.Expr]) -> Callable:
    """``fast`` for float32 calls of op ``name``, TVM's own legalization for other dtypes."""
    default = tvm.ir.Op.get(name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        return fast(bb, call) if str(call.args[0].ty.dtype) == "float32" else default(bb, call)

    return legalize


def _unary(name: str, fast: Callable[[te.Tensor], te.Tensor]) -> Callable:
    hint = "fast_" + name.rsplit(".", 1)[-1]
    return _float32_only(name, lambda bb, call: bb.call_te(fast, call.args[0], primfunc_name_hint=hint))


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    one = tvm.tirx.const(1.0, x.dtype)
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid")


def _fast_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    return bb.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis), primfunc_name_hint="fast_softmax")


def legalizations() -> dict[str, Any]:
    """``LegalizeOps`` overrides: op name -> fast legalization."""
    return {
        "relax.erf": _unary("relax.erf", topi.fast_erf),
        "relax.exp": _unary("relax.exp", topi.fast_exp),
        "relax.tanh": _unary("relax.tanh", topi.fast_tanh),
        "relax.sigmoid": _unary("relax.sigmoid", _fast_sigmoid),
        "relax.nn.softmax": _float32_only("relax.nn.softmax", _fast_softmax),
    }
