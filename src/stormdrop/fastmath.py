"""Vectorizable transcendental functions for CPU models (fast-math legalization).

TVM lowers ``erf``/``exp``/``tanh``/``sigmoid`` to one scalar libm call per element
on LLVM CPU targets: a kernel with an erf-GELU epilogue (BERT's FFN matmul) ran at
a fifth of the plain matmul's speed. These legalizations replace them, before the
default ones, by TOPI's polynomial approximations, which vectorize:

- ``erf`` -> ``topi.fast_erf`` (Eigen's rational approximation, clamped to |x| <= 4);
- ``exp`` -> ``topi.fast_exp`` (Cephes-style, range-reduced, clamped to [-88.4, 88.4]);
- ``tanh`` -> ``topi.fast_tanh``; ``sigmoid(x)`` -> ``1 / (1 + fast_exp(-x))``;
- ``nn.softmax`` -> ``topi.nn.fast_softmax`` (the same reductions, ``fast_exp``).

float32 only (other dtypes keep TVM's legalization). Accuracy, measured by
``tests/test_fastmath.py`` against NumPy/SciPy on a dense grid: within a few float32
ulps of the exact functions (the bound asserted there is 2e-6 relative); whole models
are checked against ONNX Runtime as before (``--no-fast-math`` turns this off).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, te, topi


def _unary(name: str, fast: Callable[[te.Tensor], te.Tensor]) -> Callable:
    default = tvm.ir.Op.get(name).get_attr("FLegalize")

    def legalize(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
        if str(call.args[0].ty.dtype) != "float32":
            return default(bb, call)
        return bb.call_te(fast, call.args[0], primfunc_name_hint="fast_" + name.rsplit(".", 1)[-1])

    return legalize


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    one = tvm.tirx.const(1.0, x.dtype)
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="sigmoid")


def _softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    if str(call.args[0].ty.dtype) != "float32":
        return tvm.ir.Op.get("relax.nn.softmax").get_attr("FLegalize")(bb, call)
    return bb.call_te(topi.nn.fast_softmax, call.args[0], int(call.attrs.axis), primfunc_name_hint="fast_softmax")


def legalizations() -> dict[str, Any]:
    """``LegalizeOps`` overrides: op name -> fast legalization."""
    return {
        "relax.erf": _unary("relax.erf", topi.fast_erf),
        "relax.exp": _unary("relax.exp", topi.fast_exp),
        "relax.tanh": _unary("relax.tanh", topi.fast_tanh),
        "relax.sigmoid": _unary("relax.sigmoid", _fast_sigmoid),
        "relax.nn.softmax": _softmax,
    }
