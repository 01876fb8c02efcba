"""Channel concatenations that feed convolutions, computed without the concatenation.

A SqueezeNet's fire module concatenates its two expand branches along the channels and hands the
result to the next module's 1x1 convolution (or to a max pool and then that convolution). The
concatenation is a kernel of its own that reads and writes every channel once more, and the
convolution then reads them again. A convolution is linear in its input channels, so
``conv(concat(a, b), W) == conv(a, W_a) + conv(b, W_b)`` with ``W`` cut along its input channels:
``split`` writes each such convolution as one partial convolution per input, each added to the
previous one (fusion puts every add and the original epilogue into the partial convolutions'
kernels), and a max or average pool between them is moved before the concatenation (pooling works
channel by channel). The concatenation goes where every user of it is rewritten this way and the
partial sums are few: the partial convolutions write and read back ``(inputs - 1)`` outputs of
their own, kept to at most half of what the concatenation itself writes. Applied to float32
NHWC convolutions (groups 1, constant HWIO weights) on CPUs; the outputs are the same up to the
order of the additions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import Constant

from stormdrop.lowering.layout import op_name as _op
from stormdrop.lowering.layout import static_shape

MAX_INPUTS = 4  # more parts than this: the kernels' own overheads add up
_POOLS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d")



def _shape(expr: Any) -> list[int] | None:
    """A float32 tensor's static shape, else ``None``."""
    return static_shape(expr) if str(getattr(expr.ty, "dtype", "")) == "float32" else None


def _channel_concat(value: Any) -> list[Any] | None:
    """The inputs of an NHWC channel concatenation of 2..MAX_INPUTS float32 tensors, else ``None``."""
    if _op(value) != "relax.concat" or not isinstance(value.args[0], relax.Tuple):
        return None
    inputs = list(value.args[0].fields)
    shapes = [_shape(x) for x in inputs]
    if not 2 <= len(inputs) <= MAX_INPUTS or any(s is None or len(s) != 4 for s in shapes):
        return None
    return inputs if int(value.attrs.axis) in (3, -1) else None


def _splittable_conv(value: Any, var: Any) -> bool:
    """A float32 NHWC conv2d of ``var`` by constant HWIO weights, groups 1."""
    if _op(value) != "relax.nn.conv2d" or not value.args[0].same_as(var) or not isinstance(value.args[1], Constant):
        return False
    a = value.attrs
    return (int(a.groups) == 1 and a.data_layout == "NHWC" and a.kernel_layout == "HWIO"
            and a.out_layout == "NHWC" and str(value.args[1].value.dtype) == "float32")


def _pool_nhwc(value: Any) -> bool:
    return _op(value) in _POOLS and value.attrs.layout == "NHWC" and value.attrs.out_layout == "NHWC"


class _Plan:
    """Which bindings of one function change: pools moved before their concatenation, and the
    concatenations (original or moved) whose convolutions are split."""

    def __init__(self, func: relax.Function) -> None:
        self.bindings: dict[Any, Any] = {}
        users: dict[Any, list[Any]] = {}
        for block in func.body.blocks:
            for b in block.bindings:
                if isinstance(b, relax.VarBinding):
                    self.bindings[b.var] = b.value
            if isinstance(block, relax.DataflowBlock):
                users.update(relax.analysis.udchain(block))
        self.pushed: set[Any] = set()  # pool vars now computed as concat(pool(x_i)), then split
        self.split: set[Any] = set()  # concat (or pushed pool) vars whose users are all split
        for var, value in self.bindings.items():
            inputs = _channel_concat(value)
            if inputs is None or var not in users:
                continue
            uses = list(users[var])
            if len(uses) == 1 and _pool_nhwc(self.bindings.get(uses[0])) and uses[0] in users \
                    and isinstance(uses[0], relax.DataflowVar):  # the pool moves only if the split follows
                if self._pays(uses[0], inputs, list(users[uses[0]])):
                    self.pushed.add(uses[0])
                    self.split.add(uses[0])
            elif self._pays(var, inputs, uses):
                self.split.add(var)

    def _pays(self, var: Any, inputs: list[Any], uses: list[Any]) -> bool:
        """Every user a splittable convolution, and their partial sums at most half the concatenation."""
        concat = _shape(var)
        if not uses or concat is None:
            return False
        partials = 0
        for u in uses:
            value, out = self.bindings.get(u), _shape(u)
            if value is None or out is None or not isinstance(u, relax.DataflowVar) or not _splittable_conv(value, var):
                return False
            partials += (len(inputs) - 1) * int(np.prod(out))
        return 2 * partials <= int(np.prod(concat))


def split(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every channel concatenation that feeds only convolutions (directly or through a
    pool) computed as partial convolutions of its inputs, where the partial sums pay (module doc)."""

    @relax.expr_functor.mutator
    class Split(relax.PyExprMutator):
        def __init__(self, mod: tvm.IRModule, plan: _Plan) -> None:
            super().__init__(mod)
            self.plan = plan
            self.parts: dict[Any, list[Any]] = {}  # a split concatenation's var -> its inputs, visited

        def visit_var_binding_(self, binding: Any) -> None:
            var, value = binding.var, binding.value
            # a split concatenation (or pool) is not emitted: every user of it is a convolution split below
            if var in self.plan.pushed:
                concat = self.plan.bindings[value.args[0]]
                self.parts[var] = [self.builder_.emit(relax.Call(value.op, [self.visit_expr(x)], value.attrs))
                                   for x in _channel_concat(concat)]
                return
            if var in self.plan.split:
                self.parts[var] = [self.visit_expr(x) for x in _channel_concat(value)]
                return
            data = value.args[0] if _op(value) == "relax.nn.conv2d" else None
            if data is not None and data in self.parts:
                self.set_var_remap(var, self._partial_sums(value, self.parts[data]))
                return
            super().visit_var_binding_(binding)

        def _partial_sums(self, conv: Any, parts: list[Any]) -> Any:
            weights = conv.args[1].value.numpy()
            total, offset = None, 0
            for part in parts:
                channels = _shape(part)[3]
                w = relax.const(np.ascontiguousarray(weights[:, :, offset:offset + channels, :]), "float32")
                offset += channels
                y = self.builder_.emit(relax.Call(conv.op, [part, w], conv.attrs))
                total = y if total is None else self.builder_.emit(relax.op.add(y, total))
            return total

    out = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            plan = _Plan(func)
            if plan.split or plan.pushed:
                func = relax.analysis.remove_all_unused(Split(mod, plan).visit_expr(func))
        out[gv] = func
    return tvm.IRModule(out, attrs=mod.attrs, global_infos=mod.global_infos)
