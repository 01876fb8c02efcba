"""The one place where stormdrop works around rough edges of TVM 0.27.

- ``import tvm.s_tir.tensor_intrin`` (done by every ``TuneContext`` and by
  MetaSchedule's builder) imports the intrinsics of every backend; the CUDA ones
  alone take ~22 s of a ~32 s import on a 2-core x86 machine. For CPU targets we
  register only the intrinsics of the target's CPU family (x86 0.6 s; ARM 4.6 s), by
  putting a package object in ``sys.modules`` whose ``__init__`` has not run
  (``load_tensor_intrinsics``). For CUDA the real package is imported. Measurement
  workers need none: they build and run modules that are already scheduled.
- TVM's CPU runtime starts ``hardware_concurrency / 2`` threads on x86 (one on
  a 2-core machine), whatever the target's ``num-cores`` says; the count is read
  from ``TVM_NUM_THREADS`` when the thread pool starts (``runtime_threads_env``).
- ``Trace.as_json`` holds ``IntImm``/``FloatImm`` that ``json.dumps`` cannot
  serialize, and ``tvm.ir.load_json`` of a saved Trace segfaults when replayed:
  traces travel as plain JSON (``trace_to_json`` / ``schedule_from_trace_json``).
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
  so every ReLU6 of an NHWC model became its own kernel between two transposes (18% of
  MobileNetV2's time at 224x224) and never fused into its convolution.
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
  (no cache across call sites): after ``SplitLayoutRewritePreproc`` MobileBERT's 360 weight
  prepacks (7 distinct functions) took 25-27 s of its 29-s compile after tuning, ResNet-50's
  3.3 s (2 cores), and the search's time budget had no room for them.
  ``fold_weight_prepacks`` runs every prepack with its function built once (0.6 s and 1.4 s,
  outputs bit for bit the same); ``FoldConstant`` then has nothing of them left to fold.
- A candidate library that allocates a large intermediate buffer (e.g. a packed-weight
  kernel that re-lays its weights out itself, as the checked function did before
  ``prepack.split``) leaves that
  memory behind when the library is unloaded: ~9 MB per BERT-base FFN candidate, so a
  runner process grew by ~1 GB a minute and a 30-minute BERT tune ran the machine out of
  memory (every build then timed out). The same library loaded once and called again does
  not grow. The gateway recycles its runner process when it has grown past a limit
  (``memory.runner_memory_limit_mb``).
- ``TuningRecord.from_json`` (and ``Trace.apply_json_to_schedule``) on a trace whose
  instructions use a random variable no earlier instruction defined (a truncated or edited
  file) crashes the process now and then (segmentation fault) instead of raising.
  ``check_trace_json`` refuses such a trace with a ``ValueError`` before TVM sees it.
- A JSON ``null`` where an instruction's attribute or decision should be a value (GetSBlock's
  block name, SamplePerfectTile's n, Split's flags, any decision) reaches a non-optional argument
  of the primitive unchecked and crashes the process (segmentation fault); a value of another
  type raises a ``TypeError``. A tile size of 0 in a SamplePerfectTile decision divides by zero
  (SIGFPE). ``check_trace_json`` allows ``null`` only where TVM's primitive takes an optional
  (``_NULLABLE_ATTRS``) and in inputs (Split's inferred factor), and decisions of integers only,
  tile sizes >= 1.
- ``tvm.ir.load_json`` decodes an object graph recursively: a graph whose node refers to itself
  or to a later node, or a chain of a few thousand nodes, overflows the stack (segmentation
  fault); so does deeply nested JSON text. A module from a file or a database row goes through
  ``load_object_json`` / ``check_workload_json``, which refuse those with a ``ValueError``.
- CUDA sources compiled to cubins on the host with NVRTC: ``_nvrtc`` (its notes say why).
- ``relax.transform.ConvertLayout`` dies with ``std::bad_alloc`` on a ``squeeze`` whose axis
  is negative (torchvision's ViT through PyTorch's exporter: ``Squeeze(axes=[-2])`` in its
  attention), wherever it is in the model. ``nonnegative_squeeze_axes`` rewrites those axes
  as their non-negative equal first (the same computation).
"""

from __future__ import annotations

import base64
import binascii
import functools
import importlib.util
import json
import math
import os
import platform
import re
import sys
import types
from typing import Any

import tvm
from tvm.s_tir import Schedule, Trace
from tvm.tirx import FloatImm, IntImm

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

    ``target``: a Target (its CPU family only: x86 0.6 s, ARM 4.6 s here) or a kind
    name (``"llvm"``: every CPU family, for traces of unknown origin).
    """
    kind = target if isinstance(target, str) else target.kind.name
    if kind != "llvm":
        import tvm.s_tir.tensor_intrin  # noqa: F401  (all backends; slow but needed for GPUs)

        # after a CPU target's cheap import, the package in sys.modules is the stub whose
        # __init__ never ran: a GPU target's intrinsics must still be registered
        importlib.import_module(f"{_INTRIN_PKG}.cuda")
        return
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


def to_py(obj: Any) -> Any:
    """Convert TVM containers/immediates of a trace JSON object into plain Python."""
    if isinstance(obj, (list, tuple)) or type(obj).__name__ == "Array":
        return [to_py(x) for x in obj]
    if isinstance(obj, IntImm):
        return int(obj.value)
    if isinstance(obj, FloatImm):
        return float(obj.value)
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if hasattr(obj, "value"):
        return to_py(obj.value)
    return str(obj)


def trace_to_json(trace: Trace, remove_postproc: bool = False) -> str:
    """The trace as canonical JSON text (decisions included)."""
    return json.dumps(to_py(trace.as_json(remove_postproc=remove_postproc)), separators=(",", ":"))


_RV_NAME = re.compile(r"[a-z]\d+")  # how a trace's JSON names its random variables: b0, l1, v2
# (instruction kind, attribute index) whose primitive takes an optional there: TransformLayout's pad value
_NULLABLE_ATTRS = frozenset({("TransformLayout", 2)})
_TILE_SAMPLES = frozenset({"SamplePerfectTile", "SamplePartitionedTile"})  # a tile size of 0 divides by zero


MAX_TRACE_NESTING = 16  # a trace's values nest 2-3 lists deep (SampleCategorical's candidates)


def _leaves(x: Any) -> list:
    """The non-list values inside ``x`` (``x`` itself if it is not a list); ``ValueError`` when
    lists nest deeper than ``MAX_TRACE_NESTING`` (walked without recursion)."""
    out, stack = [], [(x, 0)]
    while stack:
        y, depth = stack.pop()
        if not isinstance(y, list):
            out.append(y)
        elif depth >= MAX_TRACE_NESTING:
            raise ValueError(f"a trace's value nests lists more than {MAX_TRACE_NESTING} deep")
        else:
            stack.extend((z, depth + 1) for z in y)
    return out


def check_trace_json(obj: Any) -> None:
    """Raise ``ValueError`` unless ``obj`` is shaped like a trace's JSON ``[instructions,
    decisions]`` whose instructions use only random variables defined by earlier ones and whose
    decisions name existing instructions, and with no ``null`` where TVM's primitive takes no
    optional (TVM may crash on such a trace rather than raise)."""
    if not (isinstance(obj, list) and len(obj) == 2 and all(isinstance(x, list) for x in obj)):
        raise ValueError("a trace is [instructions, decisions]")
    insts, decisions = obj
    defined: set[str] = set()

    for i, inst in enumerate(insts):
        if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)
                and all(isinstance(part, list) for part in inst[1:])):
            raise ValueError(f"instruction {i} is not [kind, inputs, attributes, outputs]")
        for x in _leaves(inst[1]):
            if isinstance(x, str) and _RV_NAME.fullmatch(x) and x not in defined:
                raise ValueError(f"instruction {i} uses {x}, which no earlier instruction defines")
        if not all(isinstance(o, str) and _RV_NAME.fullmatch(o) for o in inst[3]):
            raise ValueError(f"instruction {i} has outputs that are not random-variable names")
        for k, attr in enumerate(inst[2]):
            if None in _leaves(attr) and (attr is not None or (inst[0], k) not in _NULLABLE_ATTRS):
                raise ValueError(f"instruction {i} ({inst[0]}) has a null attribute {k}")
        defined.update(inst[3])
    for d in decisions:
        if not (isinstance(d, list) and len(d) == 2 and isinstance(d[0], int) and not isinstance(d[0], bool)
                and 0 <= d[0] < len(insts)):
            raise ValueError(f"decision {d!r} names no instruction of the trace")
        values = _leaves(d[1])
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError(f"the decision of instruction {d[0]} is not integers")
        if insts[d[0]][0] in _TILE_SAMPLES and not (isinstance(d[1], list) and values and min(values) >= 1):
            raise ValueError(f"the decision of instruction {d[0]} is not tile sizes of at least 1")


_INLINE_FIELDS = (0, 1, 2, 3, 5)  # tvm-ffi's None, Int, Bool, Float, DataType: written in place, not as nodes
_SEQUENCES = ("ffi.Array", "ffi.List", "ffi.Map", "ffi.Dict")
_SCALARS = ("None", "bool", "int", "float", "DataType", "Device", "ffi.String", "ffi.Bytes", "ffi.Shape")
MAX_GRAPH_DEPTH = 500  # TVM decodes a graph recursively (an 8 MB stack overflowed at ~1900 nested
# expressions); the deepest kernel seen in the project's databases is ~50


def _reference_fields(type_key: str) -> tuple[bool, dict[str, bool]] | None:
    """For an object type: whether its data is its own (decoded without other nodes), and each
    field's name -> whether it holds a node index. None for a type tvm-ffi does not know."""
    from tvm_ffi import core

    try:
        index = core._object_type_key_to_index(type_key)
    except Exception:  # noqa: BLE001 - any failure: an unknown type
        return None
    if index is None:
        return None
    if core._lookup_type_attr(index, "__data_from_json__", True) is not None:
        return True, {}
    fields: dict[str, bool] = {}
    info = core._type_index_to_type_info(index)
    while info is not None:
        for f in info.fields:
            fields.setdefault(f.name, f.field_static_type_index not in _INLINE_FIELDS)
        info = info.parent_type_info
    return False, fields


def load_object_json(text: str) -> Any:
    """``tvm.ir.load_json(text)``, refusing first (``ValueError``, ``check_object_graph``) what
    would crash TVM rather than raise."""
    check_object_graph(text)
    try:
        return tvm.ir.load_json(text)
    except Exception as e:  # noqa: BLE001 - TVM raises assorted errors (a required field missing, a wrong type)
        raise ValueError(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__) from None


def check_object_graph(text: str) -> int:
    """The depth of the TVM object graph in JSON ``text``; ``ValueError`` for what would crash
    TVM's loader: it decodes a graph recursively, so a node that refers to itself or to a later
    node (a cycle), a chain deeper than ``MAX_GRAPH_DEPTH`` or deeply nested JSON kills the
    process with a stack overflow. A graph as TVM writes it lists every node after the nodes it
    refers to."""
    try:
        graph = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ValueError("not a TVM object graph ({'root_index': ..., 'nodes': [...]})")
    nodes, root = graph["nodes"], graph.get("root_index")
    if not (isinstance(root, int) and 0 <= root < len(nodes)):
        raise ValueError(f"root_index {root!r} names no node")
    known: dict[str, Any] = {}
    depth = [0] * len(nodes)

    def refs(i: int, node: Any) -> list[Any]:
        if not (isinstance(node, dict) and isinstance(node.get("type"), str)):
            raise ValueError(f"node {i} is not {{'type': ..., 'data': ...}}")
        kind, data = node["type"], node.get("data")
        flat = data if isinstance(data, list) else list(data.values()) if isinstance(data, dict) else [data]
        if any(isinstance(x, (list, dict)) for x in flat):
            raise ValueError(f"node {i} ({kind}) has nested data")
        if kind in _SEQUENCES:
            if not isinstance(data, list):
                raise ValueError(f"node {i} ({kind}) data is not a list of node indices")
            return data
        if kind in _SCALARS:
            return []
        if kind not in known:
            known[kind] = _reference_fields(kind)
        if known[kind] is None:
            raise ValueError(f"node {i} has an unknown type {kind[:60]!r}")
        own, fields = known[kind]
        if own or not isinstance(data, dict):
            return []
        return [v for name, v in data.items() if fields.get(name, True) and v is not None]

    for i, node in enumerate(nodes):
        for j in refs(i, node):
            if not (isinstance(j, int) and not isinstance(j, bool) and 0 <= j < i):
                raise ValueError(f"node {i} refers to {j!r}: not an earlier node")
            depth[i] = max(depth[i], depth[j] + 1)
        if depth[i] > MAX_GRAPH_DEPTH:
            raise ValueError(f"node {i} is {depth[i]} references deep (at most {MAX_GRAPH_DEPTH})")
    return max(depth, default=0)


def check_workload_json(obj: Any) -> None:
    """``ValueError`` unless ``obj`` is a MetaSchedule workload's JSON, ``[structural hash,
    base64 of (its length, 8 bytes little-endian, then the module's JSON)]``, whose module graph
    passes ``check_object_graph``."""
    if not (isinstance(obj, list) and len(obj) == 2 and all(isinstance(x, str) for x in obj)):
        raise ValueError("a workload is [structural hash, module in base64]")
    try:
        blob = base64.b64decode(obj[1], validate=True)
    except binascii.Error as e:
        raise ValueError(f"its module is not base64: {e}") from None
    if len(blob) < 8 or int.from_bytes(blob[:8], "little") != len(blob) - 8:
        raise ValueError("its module's length does not match its bytes")
    try:
        text = blob[8:].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("its module is not UTF-8 text") from None
    check_object_graph(text)


def schedule_from_trace_json(mod: tvm.IRModule, text: str) -> Schedule:
    """Replay a stored trace (as written by ``trace_to_json``) on ``mod``."""
    obj = json.loads(text)
    check_trace_json(obj)
    sch = Schedule(mod)
    Trace.apply_json_to_schedule(obj, sch)
    return sch


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
