"""Attention over a sequence whose length tiles badly, computed at a padded length.

A vision transformer's 197 tokens (196 patches and a class token) is prime: the search can
split neither the query nor the key axis of ``softmax(Q K^T) V`` into vector lanes and
register tiles, and its softmax reduces rows of 197. ``pad_sequences`` rewrites each

    matmul(Q, Kt) -> elementwise ops -> softmax(axis=-1) -> matmul(., V)

whose key length ``T`` (or query length ``S``) is not a multiple of ``MULTIPLE`` and is at
least ``MIN_LENGTH`` into the same chain on ``Q``, ``Kt`` and ``V`` padded with zeros to the
next multiple, with a bias of ``MASK`` added to the padded key columns before the softmax
(their probabilities underflow to zero; ``V``'s padded rows are zeros besides) and the
padded query rows sliced off the result. The pads and the slice are layout ops that fuse
with the transposes around an attention. Other operands of the elementwise ops (a mask, a
scale) are padded alike (with ones for a divisor); what they hold in the padded columns
does not matter, the bias dominates it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax

from stormdrop.lowering.layout import static_shape

MULTIPLE = 16  # lanes of an AVX-512 float32 vector, two AVX2 vectors
MIN_LENGTH = 64  # below, padding to MULTIPLE costs over a quarter more work
MASK = -1e30  # finite: with any score it stays far below the row's maximum
ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")
_MATMUL, _SOFTMAX = tvm.ir.Op.get("relax.matmul"), tvm.ir.Op.get("relax.nn.softmax")


def padded(length: int) -> int:
    """The length ``pad_sequences`` computes an attention at (``length`` when it tiles well)."""
    if length < MIN_LENGTH or length % MULTIPLE == 0:
        return length
    return -(-length // MULTIPLE) * MULTIPLE


def _pad(expr: Any, shape: list[int], targets: dict[int, int], value: float = 0.0) -> Any:
    """``expr`` padded at the end of its axes ``-k`` to ``targets[-k]`` where its extent is the
    unpadded one (broadcast axes of size 1 stay)."""
    widths = []
    for axis, extent in enumerate(shape):
        goal = targets.get(axis - len(shape))
        widths += [0, goal[1] - extent if goal is not None and extent == goal[0] and goal[0] != 1 else 0]
    return relax.op.nn.pad(expr, widths, pad_value=value) if any(widths) else expr


def _uses(func: relax.Function) -> dict[Any, int]:
    counts: dict[Any, int] = {}

    @relax.expr_functor.visitor
    class Count(relax.PyExprVisitor):
        def visit_var_(self, var: Any) -> None:
            counts[var] = counts.get(var, 0) + 1

        def visit_dataflow_var_(self, var: Any) -> None:
            counts[var] = counts.get(var, 0) + 1

    Count().visit_expr(func)
    return counts


@relax.expr_functor.mutator
class _Pad(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, uses: dict[Any, int]) -> None:
        super().__init__(mod)
        self.uses = uses

    def bound(self, expr: Any) -> Any:
        """The call ``expr`` is bound to, if it is a once-used variable."""
        if isinstance(expr, relax.Var) and self.uses.get(expr, 0) == 1:
            value = self.lookup_binding(expr)
            return value if isinstance(value, relax.Call) else None
        return None

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if not call.op.same_as(_MATMUL):
            return call
        probs = self.bound(call.args[0])
        if probs is None or not probs.op.same_as(_SOFTMAX):
            return call
        found = self.chain(probs.args[0])
        return call if found is None else self.rewrite(call, probs, *found)

    def chain(self, expr: Any) -> tuple[list, Any] | None:
        """The elementwise ops (each with the side the scores flow in) from the Q K^T
        matmul to ``expr``, and that matmul."""
        node = self.bound(expr)
        if node is None:
            return None
        if node.op.same_as(_MATMUL):
            return [], node
        if node.op.name not in ELEMENTWISE:
            return None
        for side in (0, 1):
            found = self.chain(node.args[side])
            if found is not None:
                return found[0] + [(node, side)], found[1]
        return None

    def rewrite(self, pv: Any, probs: Any, chain: list, qk: Any) -> Any:
        scores = static_shape(probs)
        v_shape, q_shape, k_shape = static_shape(pv.args[1]), static_shape(qk.args[0]), static_shape(qk.args[1])
        if None in (scores, v_shape, q_shape, k_shape) or len(scores) < 2:
            return pv
        if int(probs.attrs.axis) not in (-1, len(scores) - 1) or str(probs.ty.dtype) != "float32":
            return pv
        s, t = scores[-2:]
        if static_shape(qk) is None or static_shape(qk)[-2:] != [s, t] or q_shape[-2] != s or k_shape[-1] != t:
            return pv
        sp, tp = padded(s), padded(t)
        if (sp, tp) == (s, t):
            return pv
        rows, cols = {-2: (s, sp)}, {-1: (t, tp)}
        x = relax.op.matmul(_pad(qk.args[0], q_shape, rows), _pad(qk.args[1], k_shape, cols))
        for node, side in chain:
            args = list(node.args)
            other = 1 - side
            shape = static_shape(args[other])
            if shape is None:
                return pv
            one = node.op.name == "relax.divide" and other == 1
            args[other] = _pad(args[other], shape, {**rows, **cols}, 1.0 if one else 0.0)
            args[side] = x
            x = relax.Call(node.op, args, node.attrs)
        if tp != t:
            bias = np.zeros(tp, dtype="float32")
            bias[t:] = MASK
            x = relax.op.add(x, relax.const(bias))
        x = relax.op.nn.softmax(x, axis=-1)
        x = relax.op.matmul(x, _pad(pv.args[1], v_shape, {-2: (t, tp)}))
        if sp != s:
            x = relax.op.strided_slice(x, [len(scores) - 2], [0], [s])
        return x


def pad_sequences(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each attention whose sequence tiles badly computed at ``padded`` lengths."""
    out = {gv: _Pad(mod, _uses(f)).visit_expr(f) if isinstance(f, relax.Function) else f
           for gv, f in mod.functions.items()}
    return relax.transform.DeadCodeElimination()(tvm.IRModule(out, attrs=mod.attrs))
