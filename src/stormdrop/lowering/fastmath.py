"""Vectorizable transcendental functions for CPU models (fast-math legalization).

TVM lowers ``erf``/``exp``/``tanh``/``log``/``pow`` (and ``sigmoid``, through ``exp``) to one
scalar libm call per element on LLVM CPU targets: a kernel with an erf-GELU epilogue (a
transformer's FFN matmul) ran several times slower than the plain matmul. These legalizations replace every
Relax operator whose default legalization computes one of them, before the default ones,
by polynomial approximations, which vectorize:

- ``erf`` -> ``topi.fast_erf`` (Eigen's rational approximation, clamped to |x| <= 4);
- ``exp`` -> ``topi.fast_exp`` (Cephes-style, range-reduced, clamped to [-88.4, 88.4]);
- ``tanh`` -> ``topi.fast_tanh``; ``sigmoid(x)`` -> ``1 / (1 + fast_exp(-x))``;
- ``log`` -> ``fast_log`` (Cephes' ``logf``: the exponent and mantissa from the bits, a
  degree-9 polynomial; 0 -> -inf, negative -> NaN, subnormals scaled first);
- ``power(x, y)``: a constant exponent 1, 2, 3, 0.5, -0.5 or -1 as multiplies and ``sqrt``
  (an LLVM intrinsic, vectorized), any other as ``fast_exp(y * fast_log(|x|))`` with the
  sign of an odd integer power and the zeros of ``x`` handled as ``pow`` does;
- the operators built from them: ``nn.gelu`` (ONNX ``Gelu``), ``nn.gelu_tanh``
  (``Gelu`` with ``approximate="tanh"``), ``nn.silu``, ``nn.selu``, ``nn.softplus``,
  ``nn.log_softmax``, and ``nn.softmax`` -> ``topi.nn.fast_softmax``. ONNX's ``Elu``,
  ``Selu``, ``Mish`` and ``Softplus`` reach Relax as ``exp``/``log``/``tanh`` compositions.

float32 only (other dtypes keep TVM's legalization). Accuracy, checked by
``tests/lowering/test_layout.py`` against NumPy/SciPy on 200,001 points of [-12, 12] ([-80, 80]
for exp; for log subnormals to 1e30 and [0.5, 2]): within 2e-6 of the exact value (relative
for exp, relative to max(|y|, 1) for the others); ``tests/lowering/test_fastmath.py`` compiles models of every such
ONNX operator and finds no call to a scalar libm function in their kernels; whole models
are checked against ONNX Runtime as before (``--no-fast-math`` turns this off).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, te, tirx, topi


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


def _c(value: float) -> tirx.PrimExpr:
    return tirx.const(value, "float32")


# Cephes' logf: log(1 + x) = x - x^2/2 + x^3 * P(x) on [sqrt(1/2) - 1, sqrt(2) - 1]
_LOG_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
          -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)


def _log_expr(v: tirx.PrimExpr) -> tirx.PrimExpr:
    """log(v) for one float32 value, from its bits: v = m * 2^e with m in [sqrt(1/2), sqrt(2))."""
    subnormal = v < _c(1.1754943508222875e-38)  # also zero and negatives: corrected below
    scaled = tirx.Select(subnormal, v * _c(8388608.0), v)  # 2^23: a normal number
    bits = tirx.reinterpret("int32", scaled)
    e = tirx.Cast("float32", ((bits >> 23) & 0xFF) - 126) - tirx.Select(subnormal, _c(23.0), _c(0.0))
    m = tirx.reinterpret("float32", (bits & 0x007FFFFF) | 0x3F000000)  # in [0.5, 1)
    low = m < _c(0.70710678118654752)
    e = tirx.Select(low, e - _c(1.0), e)
    x = tirx.Select(low, m + m - _c(1.0), m - _c(1.0))
    z = x * x
    p = _c(_LOG_P[0])
    for coef in _LOG_P[1:]:
        p = p * x + _c(coef)
    y = p * x * z + e * _c(-2.12194440e-4) - z * _c(0.5)
    out = x + y + e * _c(0.693359375)
    out = tirx.Select(v == _c(math.inf), v, out)
    out = tirx.Select(v == _c(0.0), _c(-math.inf), out)
    return tirx.Select(tirx.any(v < _c(0.0), tirx.isnan(v)), _c(math.nan), out)


def fast_log(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: _log_expr(x(*i)), name="T_fast_log")


def _constant_exponent(call: relax.Call) -> float | None:
    y = call.args[1]
    if isinstance(y, tvm.ir.expr.Constant):
        values = y.value.numpy()
        if values.size and (values == values.flat[0]).all() and len(call.args[0].ty.shape) >= values.ndim:
            return float(values.flat[0])
    return None


_EXACT_POWERS: dict[float, Callable[[te.Tensor], te.Tensor]] = {
    1.0: lambda x: topi.identity(x),
    2.0: lambda x: topi.multiply(x, x),
    3.0: lambda x: topi.multiply(topi.multiply(x, x), x),
    0.5: lambda x: topi.sqrt(x),
    -0.5: lambda x: topi.divide(_c(1.0), topi.sqrt(x)),
    -1.0: lambda x: topi.divide(_c(1.0), x),
}


def _general_power(x: te.Tensor, y: te.Tensor, shape: list) -> te.Tensor:
    """x ** y as exp(y log|x|): negative x only to an integer power (odd: negated), 0 ** y as pow."""
    x, y = topi.broadcast_to(x, shape), topi.broadcast_to(y, shape)
    magnitude = topi.fast_exp(topi.multiply(y, fast_log(topi.abs(x))))

    def power(*i: Any) -> tirx.PrimExpr:
        a, b, r = x(*i), y(*i), magnitude(*i)
        integer = tirx.floor(b) == b
        odd = tirx.all(integer, tirx.floor(b * _c(0.5)) * _c(2.0) != b)
        out = tirx.Select(tirx.all(a < _c(0.0), odd), -r, r)
        out = tirx.Select(tirx.all(a < _c(0.0), tirx.Not(integer)), _c(math.nan), out)
        at_zero = tirx.Select(b > _c(0.0), _c(0.0), tirx.Select(b == _c(0.0), _c(1.0), _c(math.inf)))
        return tirx.Select(a == _c(0.0), at_zero, out)

    return te.compute(shape, power, name="T_fast_power")


def _fast_power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    exact = _EXACT_POWERS.get(_constant_exponent(call))  # type: ignore[arg-type]
    if exact is not None:
        return bb.call_te(exact, call.args[0], primfunc_name_hint="power")
    return bb.call_te(_general_power, call.args[0], call.args[1], list(call.ty.shape),
                      primfunc_name_hint="fast_power")


def _fast_gelu(x: te.Tensor) -> te.Tensor:  # TVM's te_gelu with fast_erf
    erf = topi.fast_erf(topi.multiply(x, _c(0.5**0.5)))
    return topi.multiply(x, topi.add(_c(0.5), topi.multiply(erf, _c(0.5))))


def _fast_gelu_tanh(x: te.Tensor) -> te.Tensor:  # TVM's te_gelu_tanh with fast_tanh
    cube = topi.add(_c(1.0), topi.multiply(topi.multiply(x, x), _c(0.044715)))
    inner = topi.multiply(topi.multiply(x, cube), _c(math.sqrt(2.0 / math.pi)))
    return topi.multiply(topi.multiply(x, _c(0.5)), topi.add(_c(1.0), topi.fast_tanh(inner)))


def _fast_selu(x: te.Tensor) -> te.Tensor:  # TVM's te_selu with fast_exp
    negative = topi.minimum(_c(0.0), topi.multiply(topi.subtract(topi.fast_exp(x), _c(1.0)),
                                                   _c(1.6732632423543772848170429916717)))
    return topi.multiply(topi.add(topi.maximum(x, _c(0.0)), negative), _c(1.0507009873554804934193349852946))


def _fast_softplus(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    beta, threshold = float(call.attrs.beta), float(call.attrs.threshold)

    def softplus(x: te.Tensor) -> te.Tensor:  # topi.nn.softplus: x where beta * x > threshold
        bx = topi.multiply(x, _c(beta))
        smooth = topi.divide(fast_log(topi.add(topi.fast_exp(bx), _c(1.0))), _c(beta))
        return topi.where(topi.greater(bx, _c(threshold)), x, smooth)

    return bb.call_te(softplus, call.args[0], primfunc_name_hint="fast_softplus")


def _fast_log_softmax(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    axis = int(call.attrs.axis)

    def log_softmax(x: te.Tensor) -> te.Tensor:  # x - max - log(sum(exp(x - max)))
        shifted = topi.subtract(x, topi.max(x, axis=axis, keepdims=True))
        return topi.subtract(shifted, fast_log(topi.sum(topi.fast_exp(shifted), axis=axis, keepdims=True)))

    return bb.call_te(log_softmax, call.args[0], primfunc_name_hint="fast_log_softmax")


def legalizations() -> dict[str, Any]:
    """``LegalizeOps`` overrides: op name -> fast legalization."""
    return {
        "relax.erf": _unary("relax.erf", topi.fast_erf),
        "relax.exp": _unary("relax.exp", topi.fast_exp),
        "relax.tanh": _unary("relax.tanh", topi.fast_tanh),
        "relax.sigmoid": _unary("relax.sigmoid", _fast_sigmoid),
        "relax.log": _unary("relax.log", fast_log),
        "relax.power": _float32_only("relax.power", _fast_power),
        "relax.nn.softmax": _float32_only("relax.nn.softmax", _fast_softmax),
        "relax.nn.log_softmax": _float32_only("relax.nn.log_softmax", _fast_log_softmax),
        "relax.nn.gelu": _unary("relax.nn.gelu", _fast_gelu),
        "relax.nn.gelu_tanh": _unary("relax.nn.gelu_tanh", _fast_gelu_tanh),
        "relax.nn.silu": _unary("relax.nn.silu", lambda x: topi.multiply(x, _fast_sigmoid(x))),
        "relax.nn.selu": _unary("relax.nn.selu", _fast_selu),
        "relax.nn.softplus": _float32_only("relax.nn.softplus", _fast_softplus),
    }
