"""Channel shuffles of an NHWC model kept in NHWC.

A ShuffleNet block splits its input's channels in two halves, runs one half through its
convolutions, concatenates the halves again and shuffles the channels (ONNX: ``Reshape`` to
``[N, g, C/g, H, W]``, ``Transpose`` of the two group axes, ``Reshape`` back). Relax's
``ConvertLayout`` cannot carry a layout through a reshape, so once the convolutions are NHWC
every block permutes its convolutions' output back to NCHW for the shuffle and the slices and
concatenations after it, and the next block's convolution reads that NCHW half: a shuffle
kernel that transposes as it copies, and convolutions that read across channels' planes.

``nhwc`` rewrites each such shuffle of an NHWC tensor's NCHW permutation as the same shuffle
on the channel axis of the NHWC tensor, permuted to NCHW afterwards, and carries that
permutation down through the ops that do not care where the channel axis is (a strided slice,
a concatenation whose every input is permuted alike): the permutations meet the convolutions'
own NHWC permutations and cancel (``layout.fold_permutes``). The shuffles, slices and
concatenations only move data; the convolutions that read the halves compute the same sums.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from stormdrop.lowering.layout import op_name as _op
from stormdrop.lowering.layout import permute_axes as _axes
from stormdrop.lowering.layout import static_shape as _shape

TO_NCHW = [0, 3, 1, 2]

_PERMUTE = "relax.permute_dims"



def _ints(values: Any) -> list[int]:
    return [int(getattr(v, "value", v)) for v in values]


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def value(self, expr: Any) -> Any:
        """What ``expr`` is bound to (itself when it is no bound variable)."""
        bound = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        return expr if bound is None else bound

    def nchw_of(self, expr: Any) -> Any:
        """The NHWC tensor of which ``expr`` is the NCHW permutation, else ``None``."""
        inner = self.value(expr)
        if _op(inner) == _PERMUTE and _axes(inner) == TO_NCHW:
            return inner.args[0]
        return None

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        rule = {"relax.reshape": self.shuffle, "relax.strided_slice": self.slice,
                "relax.concat": self.concat}.get(_op(call))
        new = rule(call) if rule is not None else None
        return call if new is None else new

    def shuffle(self, call: relax.Call) -> Any:
        """``reshape(permute(reshape(x, [N, g, C/g, H, W]), [0, 2, 1, 3, 4]), [N, C, H, W])`` with
        ``x`` an NHWC tensor's NCHW permutation: the shuffle on the NHWC tensor's last axis."""
        out = _shape(call)
        middle = self.value(call.args[0])
        if out is None or len(out) != 4 or _op(middle) != _PERMUTE or _axes(middle) != [0, 2, 1, 3, 4]:
            return None
        split = self.value(middle.args[0])
        if _op(split) != "relax.reshape":
            return None
        nhwc = self.nchw_of(split.args[0])
        grouped = _shape(split)
        if nhwc is None or grouped is None or len(grouped) != 5 or _shape(nhwc) is None:
            return None
        n, c, h, w = out
        _, g, per, gh, gw = grouped
        if (gh, gw) != (h, w) or g * per != c or _shape(nhwc) != [n, h, w, c]:
            return None
        x = relax.op.reshape(nhwc, [n, h, w, g, per])
        x = relax.op.reshape(relax.op.permute_dims(x, [0, 1, 2, 4, 3]), [n, h, w, c])
        return relax.op.permute_dims(x, TO_NCHW)

    def slice(self, call: relax.Call) -> Any:
        """A strided slice of an NHWC tensor's NCHW permutation: the permutation of its slice."""
        nhwc = self.nchw_of(call.args[0])
        if nhwc is None:
            return None
        axes = [TO_NCHW[a] for a in _ints(call.args[1])]
        strides = _ints(call.args[4]) if len(call.args) > 4 else None
        sliced = relax.op.strided_slice(nhwc, axes, _ints(call.args[2]), _ints(call.args[3]), strides,
                                        assume_inbound=bool(call.attrs.assume_inbound))
        return relax.op.permute_dims(sliced, TO_NCHW)

    def concat(self, call: relax.Call) -> Any:
        """A concatenation of NHWC tensors' NCHW permutations only: the permutation of theirs."""
        parts = self.value(call.args[0])
        if not isinstance(parts, relax.Tuple) or call.attrs.axis is None:
            return None
        nhwc = [self.nchw_of(p) for p in parts.fields]
        if not nhwc or any(x is None for x in nhwc):
            return None
        axis = int(call.attrs.axis) % 4
        return relax.op.permute_dims(relax.op.concat(nhwc, TO_NCHW[axis]), TO_NCHW)


def nhwc(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its channel shuffles of NHWC tensors computed in NHWC (see the module's text);
    the NCHW permutations left over cancel in ``layout.fold_permutes``."""
    out = {gv: _Rewrite(mod).visit_expr(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    return relax.transform.DeadCodeElimination()(tvm.IRModule(out, attrs=mod.attrs))
