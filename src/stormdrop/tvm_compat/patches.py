"""The one place where stormdrop works around rough edges of TVM 0.27.

- ``import tvm.s_tir.tensor_intrin`` (done by every ``TuneContext`` and by
  MetaSchedule's builder) imports the intrinsics of every backend; the CUDA ones
  take half of that import's time. For CPU targets we
  register only the intrinsics of the target's CPU family, by
  putting a package object in ``sys.modules`` whose ``__init__`` has not run
  (``load_tensor_intrinsics``); for CUDA targets only the CUDA ones (half of the whole
  import), for other GPU kinds the real package. Measurement
  workers need none: they build and run modules that are already scheduled.
- TVM-FFI imports PyTorch at its own import whenever PyTorch is installed (a symbol-conflict
  workaround of its own), which more than triples TVM's import time; stormdrop's child processes
  (measurement workers, isolated steps) never use PyTorch and start with it made unimportable
  (``measure.workers.child_entry``).
- TVM's CPU runtime starts ``hardware_concurrency / 2`` threads on x86 (one on
  a 2-core machine), whatever the target's ``num-cores`` says; the count is read
  from ``TVM_NUM_THREADS`` when the thread pool starts (``runtime_threads_env``).
- ``VMExecutable.export_library`` logs ``Warning: Scope Saving:`` from C++ once per
  saved item (a few hundred lines for ResNet-18) straight to file descriptor 2:
  ``export_library`` runs it with those lines filtered out of stderr.
- Relax's legalized pooling blocks carry ``schedule_rule = "meta_schedule.pool_max"``
  (and ``pool_avg``, ``adaptive_pool_*``) but TVM registers no rule of that name for
  CPUs: ``ApplyCustomRule`` logs an "Unknown schedule rule" warning through the user's
  progress display, removes the annotation and goes on with the default rules.
  ``register_default_pool_rules`` registers rules that do exactly that, silently (the
  trace is the same: one ``Unannotate``).
- The ONNX importer turns ``Clip`` (ReLU6 in MobileNets) into TE ``maximum``/``minimum``
  ``call_tir`` functions rather than Relax ops: ``ConvertLayout`` cannot see through them,
  so every ReLU6 of an NHWC model became its own kernel between two transposes (a large share
  of a MobileNet's time) and never fused into its convolution.
  ``clip_as_relax_op`` makes the importer emit Relax ``maximum``/``minimum`` ops when the
  bounds are constant scalars (other Clips keep the importer's own conversion), and for
  ``HardSigmoid`` and ``HardSwish`` (float32), whose converters call ``relax.op.clip``: in an
  NHWC MobileNetV3 each SE gate and hardswish was a kernel with transposes inside.
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
- A candidate library that allocates a large intermediate buffer (e.g. a packed-weight
  kernel that re-lays its weights out itself, as the checked function did before
  ``prepack.split``) leaves that
  memory behind when the library is unloaded (megabytes per transformer FFN candidate), so a
  runner process grew without bound and a long BERT tune ran the machine out of
  memory (every build then timed out). The same library loaded once and called again does
  not grow. The gateway recycles its runner process when it has grown past a limit
  (``memory.runner_memory_limit_mb``).
- TVM's JSON formats (traces, object graphs), which its decoders crash on instead of raising
  for some inputs: ``_tvm_json`` (its notes say which).
- CUDA sources compiled to cubins on the host with NVRTC: ``_nvrtc`` (its notes say why).
- ``relax.transform.ConvertLayout`` dies with ``std::bad_alloc`` on a ``squeeze`` whose axis
  is negative (torchvision's ViT through PyTorch's exporter: ``Squeeze(axes=[-2])`` in its
  attention), wherever it is in the model. ``nonnegative_squeeze_axes`` rewrites those axes
  as their non-negative equal first (the same computation).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import platform
import sys
import types
from typing import Any

import tvm
from tvm.s_tir import Schedule

_INTRIN_PKG = "tvm.s_tir.tensor_intrin"


_POOL_RULES = ("pool_max", "pool_avg", "adaptive_pool_max", "adaptive_pool_avg")


def _unannotate_rule(sch: Schedule, block: Any) -> list[Schedule]:
    sch.unannotate(block, "schedule_rule")
    return [sch]


@functools.cache
def register_default_pool_rules() -> None:
    """Register TVM's own fallback for the pooling rules it names but does not define (once)."""
    import tvm_ffi

    for name in _POOL_RULES:
        full = f"s_tir.meta_schedule.cpu.meta_schedule.{name}"
        if tvm_ffi.get_global_func(full, allow_missing=True) is None:
            tvm_ffi.register_global_func(full, _unannotate_rule)


def load_tensor_intrinsics(target: str | Any) -> None:
    """Register the tensor intrinsics ``target`` can use, cheaply for CPUs.

    ``target``: a Target (its CPU family's only) or a kind
    name (``"llvm"``: every CPU family, for traces of unknown origin).
    """
    kind = target if isinstance(target, str) else target.kind.name
    if kind not in ("llvm", "cuda"):
        import tvm.s_tir.tensor_intrin  # noqa: F401  (all backends)

        # after a CPU target's cheap import, the package in sys.modules is the stub whose
        # __init__ never ran: a GPU target's intrinsics must still be registered
        importlib.import_module(f"{_INTRIN_PKG}.cuda")
        return
    if kind == "cuda":
        families: tuple[str, ...] = ("cuda",)
    else:
        families = ("x86", "arm_cpu") if isinstance(target, str) else (_cpu_family(target),)
    if _INTRIN_PKG not in sys.modules:
        spec = importlib.util.find_spec(_INTRIN_PKG)
        if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
            return
        pkg = types.ModuleType(_INTRIN_PKG)
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        pkg.__package__ = _INTRIN_PKG
        sys.modules[_INTRIN_PKG] = pkg
    try:
        for family in families:
            importlib.import_module(f"{_INTRIN_PKG}.{family}")
    except Exception:  # pragma: no cover - fall back to the full import
        for name in [n for n in sys.modules if n == _INTRIN_PKG or n.startswith(_INTRIN_PKG + ".")]:
            del sys.modules[name]
        import tvm.s_tir.tensor_intrin  # noqa: F401


def _cpu_family(target: Any) -> str:
    """``arm_cpu`` for ARM LLVM targets (by triple, device or host), else ``x86``."""
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple:
        return "arm_cpu" if triple.startswith(("aarch64", "arm")) else "x86"
    if str(target.attrs.get("device", "") or "") == "arm_cpu":
        return "arm_cpu"
    return "arm_cpu" if platform.machine().lower() in ("aarch64", "arm64") else "x86"


def runtime_threads_env(num_cores: int, env: dict | None = None) -> dict:
    """Set ``TVM_NUM_THREADS`` to ``num_cores`` in ``env`` (default: this process) unless the user set it.

    Must happen before the first parallel kernel of the process runs.
    """
    env = os.environ if env is None else env
    if "TVM_NUM_THREADS" not in env and num_cores > 0:
        env["TVM_NUM_THREADS"] = str(num_cores)
    return env


_EXPORT_NOISE = "Warning: Scope Saving:"


def export_library(executable: Any, path: str) -> None:
    """``executable.export_library(path)`` without TVM's per-item "Scope Saving" warnings, and
    whole or not at all: linked beside ``path``, then renamed over it.

    The C++ logger writes to file descriptor 2, out of Python's reach: fd 2 points to a
    temporary file during the call, and every other line is written back to stderr.
    """
    import tempfile

    where, name = os.path.split(os.path.abspath(path))
    partial = os.path.join(where, f".{name}.{os.getpid()}.partial{os.path.splitext(name)[1]}")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            executable.export_library(partial)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if _EXPORT_NOISE not in ln]
            sys.stderr.write("".join(kept))


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


@functools.cache
def clip_as_relax_op() -> None:
    """Make the ONNX importer emit Relax ops for Clips with constant bounds (once)."""
    from tvm.relax.frontend.onnx import onnx_frontend as onnx_fe

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

    clip._impl_v13 = classmethod(impl_v13)
    clip._impl_v11 = classmethod(impl_v13)
    clip._impl_v1 = classmethod(impl_v1)

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
    onnx_fe.HardSigmoid._impl_v1 = classmethod(hard_sigmoid)
    onnx_fe.HardSwish._impl_v14 = classmethod(hard_swish)


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
