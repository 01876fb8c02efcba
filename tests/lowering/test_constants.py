"""A model's weights laid out in NumPy before legalization: the same kernels and the same constants
as Relax's FoldConstant computes, with no layout call of a constant left for it to compile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.ir.expr import Constant

from stormdrop.lowering import constants
from stormdrop.lowering.pipeline import Lowering
from stormdrop.target import host_target
from stormdrop.workloads.models import load_model

EXPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "exports"


def _constants(mod: tvm.IRModule) -> list[np.ndarray]:
    """The constants the model's kernels are called with, in the order of the calls."""
    found = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            for arg in value.args if isinstance(value, relax.Call) else ():
                for x in arg.fields if isinstance(arg, relax.Tuple) else [arg]:
                    if isinstance(x, Constant):
                        found.append(x.value.numpy())
    return found


def _layout_calls_of_constants(mod: tvm.IRModule) -> int:
    count = 0

    @relax.expr_functor.visitor
    class Count(relax.PyExprVisitor):
        def visit_call_(self, call: relax.Call) -> None:
            nonlocal count
            count += isinstance(call.op, tvm.ir.Op) and call.op.name in ("relax.permute_dims", "relax.reshape") \
                and isinstance(call.args[0], Constant)
            super().visit_call_(call)

    Count().visit_expr(mod["main"])
    return count


@pytest.mark.slow  # lowers a real export twice, once with FoldConstant compiling every weight's layout
def test_weights_laid_out_in_numpy_give_the_kernels_and_constants_fold_constant_gives(monkeypatch):
    target = host_target()
    model = load_model(str(EXPORTS / "tv_regnet.onnx"))
    with target:
        laid_out = Lowering()._laid_out(model.mod, target)
    assert _layout_calls_of_constants(laid_out) > 0
    folded = constants.fold(laid_out)
    assert _layout_calls_of_constants(folded) == 0
    new = Lowering().lower(model.mod, target, prepack_weights=True)
    monkeypatch.setattr(constants, "fold", lambda mod: mod)  # as before: every one left to FoldConstant
    old = Lowering().lower(model.mod, target, prepack_weights=True)

    def kernels(mod: tvm.IRModule) -> list[int]:
        return sorted(tvm_ffi.structural_hash(f) for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))

    assert kernels(new) == kernels(old)
    new_consts, old_consts = _constants(new), _constants(old)
    assert len(new_consts) == len(old_consts) > 0
    for a, b in zip(new_consts, old_consts):
        assert a.dtype == b.dtype and np.array_equal(a, b)
