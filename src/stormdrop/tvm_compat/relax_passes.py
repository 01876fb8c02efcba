"""Work-arounds of TVM 0.27 in Relax's importer and passes (the index of all: ``tvm_compat``).

- The ONNX importer turns ``Clip`` (ReLU6 in MobileNets) into TE ``maximum``/``minimum``
  ``call_tir`` functions rather than Relax ops: ``ConvertLayout`` cannot see through them,
  so every ReLU6 of an NHWC model became its own kernel between two transposes (a large share
  of a MobileNet's time) and never fused into its convolution.
  ``clips_as_relax_ops`` (a context manager: the importer is TVM's own again after it) makes the
  importer emit Relax ``maximum``/``minimum`` ops when the bounds are constant scalars (other
  Clips keep the importer's own conversion), and for ``HardSigmoid`` and ``HardSwish``
  (float32), whose converters call ``relax.op.clip``: in an NHWC MobileNetV3 each SE gate and
  hardswish was a kernel with transposes inside.
- ``relax.transform.CombineParallelMatmul`` (one GEMM for a transformer's Q, K and V
  projections, which share their input) matches only weights and biases bound to
  variables; an imported model's are inline constants, so it merged nothing.
  ``combine_parallel_matmuls`` binds them to variables first, runs the pass, and folds
  the concatenated weights back into constants.
- Relax's ``FoldConstant`` builds and JIT-compiles the function of every call it folds anew
  (no cache across call sites): after ``SplitLayoutRewritePreproc`` a model with hundreds of
  weight prepacks of a few distinct functions (MobileBERT) spent most of its compile after
  tuning on them, more than the search's time budget kept for it.
  ``fold_weight_prepacks`` runs every prepack with its function built once (outputs bit for bit
  the same); ``FoldConstant`` then has nothing of them left to fold.
- ``relax.transform.ConvertLayout`` dies with ``std::bad_alloc`` on a ``squeeze`` whose axis
  is negative (torchvision's ViT through PyTorch's exporter: ``Squeeze(axes=[-2])`` in its
  attention), wherever it is in the model. ``nonnegative_squeeze_axes`` rewrites those axes
  as their non-negative equal first (the same computation).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import tvm


def _scalar_bound(expr: Any) -> float | None:
    """The value of a constant scalar Clip bound (``None``: not a constant scalar, or NaN)."""
    import numpy as np

    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = np.asarray(expr.value.numpy())
    if value.size != 1 or not np.issubdtype(value.dtype, np.floating) or math.isnan(float(value.flat[0])):
        return None
    return float(value.flat[0])


def _relax_clip(x: Any, lo: float, hi: float) -> Any:
    """``minimum(maximum(x, lo), hi)`` as Relax ops (``relax.op.clip`` has no layout inference)."""
    from tvm import relax

    out = x if lo == -math.inf else relax.op.maximum(x, relax.const(lo, "float32"))
    return out if hi == math.inf else relax.op.minimum(out, relax.const(hi, "float32"))


@contextlib.contextmanager
def clips_as_relax_ops() -> Iterator[None]:
    """Inside: the ONNX importer emits Relax ops for Clips with constant bounds, HardSigmoid and
    HardSwish; on exit its converters are TVM's own again (nothing else in the process sees the
    change once the import is done)."""
    from tvm.relax.frontend.onnx import onnx_frontend as onnx_fe

    converters = _clip_converters(onnx_fe)
    saved = {(cls, name): cls.__dict__[name] for cls, name in converters}
    try:
        for (cls, name), impl in converters.items():
            setattr(cls, name, impl)
        yield
    finally:
        for (cls, name), impl in saved.items():
            setattr(cls, name, impl)


def _clip_converters(onnx_fe: Any) -> dict[tuple[type, str], classmethod]:
    """The converters ``clips_as_relax_ops`` puts in place: (class, ``_impl_vN``) -> classmethod."""
    clip = onnx_fe.Clip
    v13 = clip._impl_v13.__func__

    def impl_v13(cls: Any, bb: Any, inputs: Any, attr: Any, params: Any) -> Any:
        x = inputs[0]
        if str(x.ty.dtype) != "float32":
            return v13(cls, bb, inputs, attr, params)
        lo = -math.inf if inputs[1] is None else _scalar_bound(inputs[1])
        hi = math.inf if inputs[2] is None else _scalar_bound(inputs[2])
        if lo is None or hi is None:
            return v13(cls, bb, inputs, attr, params)
        return _relax_clip(x, lo, hi)

    def impl_v1(cls: Any, bb: Any, inputs: Any, attr: Any, params: Any) -> Any:
        return _relax_clip(inputs[0], float(attr.get("min", -math.inf)), float(attr.get("max", math.inf)))

    # HardSigmoid and HardSwish (MobileNetV3's SE gates and activations) are clips too
    def hard_sigmoid(cls: Any, bb: Any, inputs: Any, attr: Any, params: Any) -> Any:
        from tvm import relax

        x, dtype = inputs[0], str(inputs[0].ty.dtype)
        if dtype != "float32":
            return hard_sigmoid_v1(cls, bb, inputs, attr, params)
        alpha, beta = float(attr.get("alpha", 0.2)), float(attr.get("beta", 0.5))
        return _relax_clip(relax.op.add(relax.op.multiply(relax.const(alpha, dtype), x), relax.const(beta, dtype)),
                           0.0, 1.0)

    def hard_swish(cls: Any, bb: Any, inputs: Any, attr: Any, params: Any) -> Any:
        from tvm import relax

        x, dtype = inputs[0], str(inputs[0].ty.dtype)
        if dtype != "float32":
            return hard_swish_v14(cls, bb, inputs, attr, params)
        gate = _relax_clip(relax.op.add(x, relax.const(3.0, dtype)), 0.0, 6.0)
        return relax.op.multiply(x, relax.op.divide(gate, relax.const(6.0, dtype)))

    hard_sigmoid_v1 = onnx_fe.HardSigmoid._impl_v1.__func__
    hard_swish_v14 = onnx_fe.HardSwish._impl_v14.__func__
    return {(clip, "_impl_v13"): classmethod(impl_v13), (clip, "_impl_v11"): classmethod(impl_v13),
            (clip, "_impl_v1"): classmethod(impl_v1), (onnx_fe.HardSigmoid, "_impl_v1"): classmethod(hard_sigmoid),
            (onnx_fe.HardSwish, "_impl_v14"): classmethod(hard_swish)}


def _bind_constant_operands(func: Any) -> Any:
    """``func`` with the constant right-hand operands of matmuls and adds bound to variables."""
    from tvm import relax

    @relax.expr_functor.mutator
    class Bind(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if (isinstance(call.op, tvm.ir.Op) and call.op.name in ("relax.matmul", "relax.add")
                    and isinstance(call.args[1], tvm.ir.expr.Constant)):
                operand = self.builder_.emit(call.args[1], "operand")
                return relax.Call(call.op, [call.args[0], operand], call.attrs, call.ty_args)
            return call

    return Bind().visit_expr(func)


def combine_parallel_matmuls(mod: tvm.IRModule) -> tvm.IRModule:
    """Matmuls of one input by constant weights (with their bias adds) merged into one matmul
    and a split: TVM's ``CombineParallelMatmul`` once the constants are bound (see above)."""
    from tvm import relax

    bound = tvm.IRModule({gv: _bind_constant_operands(f) if isinstance(f, relax.Function) else f
                          for gv, f in mod.functions.items()}, attrs=mod.attrs)
    combined = relax.transform.CombineParallelMatmul()(bound)
    return relax.transform.CanonicalizeBindings()(relax.transform.FoldConstant()(combined))


def fold_weight_prepacks(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every call of a ``*_weight_prepack`` function on constants (what
    ``SplitLayoutRewritePreproc`` cuts off a kernel) replaced by its outputs, each such function
    built once (see the module's notes), and the functions no longer called dropped."""
    from tvm import relax

    call_tir, built = tvm.ir.Op.get("relax.call_tir"), {}

    def run(gv: Any, args: Any, ty: Any) -> Any:
        if gv not in built:
            built[gv] = tvm.compile(tvm.IRModule({"main": mod[gv].with_attr("global_symbol", "main")}),
                                    target="llvm")["main"]
        types = list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]
        outs = [tvm.runtime.empty([int(x) for x in t.shape.values], t.dtype, tvm.cpu()) for t in types]
        built[gv](*[a.value for a in args], *outs)
        consts = [relax.const(o) for o in outs]
        return relax.Tuple(consts) if isinstance(ty, relax.TupleType) else consts[0]

    @relax.expr_functor.mutator
    class Fold(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            if (call.op.same_as(call_tir) and call.args[0].name_hint.endswith("_weight_prepack")
                    and all(isinstance(a, tvm.ir.expr.Constant) for a in call.args[1].fields)):
                return run(call.args[0], call.args[1].fields, call.ty_args[0])
            return call

    folded = {gv: Fold(mod).visit_expr(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    return relax.transform.DeadCodeElimination()(tvm.IRModule(folded, attrs=mod.attrs))


def gpu_default_schedule(mod: tvm.IRModule, target: Any) -> tvm.IRModule:
    """``mod`` with dlight's default GPU schedules (an unscheduled kernel binds no GPU threads): the
    reference build of a CUDA workload."""
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)


def nonnegative_squeeze_axes(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every ``squeeze`` axis written non-negative (see the module's notes)."""
    from tvm import relax

    squeeze = tvm.ir.Op.get("relax.squeeze")

    @relax.expr_functor.mutator
    class Axes(relax.PyExprMutator):
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            axes = call.attrs.axis if call.op.same_as(squeeze) else None
            if axes and any(int(a) < 0 for a in axes):
                ndim = len(call.args[0].ty.shape)
                return relax.op.squeeze(call.args[0], [int(a) % ndim for a in axes])
            return call

    return tvm.IRModule({gv: Axes(mod).visit_expr(f) if isinstance(f, relax.Function) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs)
