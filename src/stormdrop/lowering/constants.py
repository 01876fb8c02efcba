"""A model's constant weights laid out in NumPy, not compiled.

Converting a model's convolutions to NHWC leaves every weight and bias behind a ``permute_dims``
(OIHW to HWIO) or a ``reshape`` of a constant. Relax's ``FoldConstant`` computes each of them by
compiling and running a kernel of its own, over a hundred of them for a ResNet-50, most of the
model's extraction. NumPy's transpose and reshape give the same array, element for element:
``fold`` writes each such call as the constant it computes, before legalization.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

ROUNDS = 4  # a chain (a bias reshaped, then permuted) folds one link a round


def _folded(call: Any) -> np.ndarray | None:
    """The array ``call`` computes when it lays out a constant, else ``None``."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) or not call.args \
            or not isinstance(call.args[0], Constant):
        return None
    data = call.args[0].value.numpy()
    if call.op.name == "relax.permute_dims":
        axes = None if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        return np.ascontiguousarray(np.transpose(data, axes))
    if call.op.name == "relax.reshape" and isinstance(call.args[1], relax.ShapeExpr) \
            and all(isinstance(v, tvm.tirx.IntImm) for v in call.args[1].values):
        return np.ascontiguousarray(data.reshape([int(v) for v in call.args[1].values]))
    return None


def fold(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``permute_dims`` and static ``reshape`` of a constant written as the
    constant it computes (chains of them too)."""

    @relax.expr_functor.mutator
    class Fold(relax.PyExprMutator):
        changed = False

        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            data = _folded(call)
            if data is None:
                return call
            Fold.changed = True
            return relax.const(data, str(call.args[0].value.dtype))

    for _ in range(ROUNDS):
        Fold.changed = False
        mod = tvm.IRModule({gv: Fold(mod).visit_expr(f) if isinstance(f, relax.Function) else f
                            for gv, f in mod.functions.items()}, attrs=mod.attrs, global_infos=mod.global_infos)
        if not Fold.changed:
            break
        mod = relax.transform.CanonicalizeBindings()(mod)  # a var bound to a constant: the constant
    return mod
