"""TVM's JSON formats, written and read: schedules' traces and object graphs (modules). Text
from a file or a database row is checked before TVM decodes it, since TVM 0.27's decoders crash
the process on some input instead of raising:

- ``Trace.as_json`` holds ``IntImm``/``FloatImm`` that ``json.dumps`` cannot
  serialize, and ``tvm.ir.load_json`` of a saved Trace segfaults when replayed:
  traces travel as plain JSON (``trace_to_json`` / ``schedule_from_trace_json``).
- ``TuningRecord.from_json`` (and ``Trace.apply_json_to_schedule``) on a trace whose
  instructions use a random variable no earlier instruction defined (a truncated or edited
  file) crashes the process now and then (segmentation fault) instead of raising.
  ``check_trace_json`` refuses such a trace with a ``ValueError`` before TVM sees it.
- A JSON ``null`` where an instruction's attribute or decision should be a value (GetSBlock's
  block name, SamplePerfectTile's n, Split's flags, any decision) reaches a non-optional argument
  of the primitive unchecked and crashes the process (segmentation fault); a value of another
  type raises a ``TypeError``. A tile size of 0 in a SamplePerfectTile decision divides by zero
  (SIGFPE). A null input where the primitive takes any object (Annotate's and Unannotate's block
  or loop) crashes too. ``check_trace_json`` allows ``null`` only where TVM's primitive takes an
  optional (``_NULLABLE_ATTRS``; Split's and LoopPartition's factors: one may be inferred), and
  decisions of integers only, tile sizes >= 1.
- A trace's ``TransformLayout`` and ``TransformBlockLayout`` carry their index maps as object graphs
  (JSON text inside the trace), which TVM decodes as below: ``check_trace_json`` checks them too.
- ``tvm.ir.load_json`` decodes an object graph recursively: a graph whose node refers to itself
  or to a later node, or a chain of a few thousand nodes, overflows the stack (segmentation
  fault); so does deeply nested JSON text. A module from a file or a database row goes through
  ``load_object_json`` / ``check_workload_json``, which refuse those with a ``ValueError``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Container
from typing import Any

import tvm
from tvm.ir import json_compact
from tvm.s_tir import Schedule, Trace
from tvm.tirx import FloatImm, IntImm
from tvm_ffi.serialization import from_json_graph_str


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
_NULLABLE_INPUTS = frozenset({"Split", "LoopPartition"})  # their factors after the loop (one may be inferred)


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


def _null_at(values: list, optional: Container[int]) -> int | None:
    """The index of the first of ``values`` that holds a null, but for a null standing alone at an
    ``optional`` index; None when there is none."""
    for k, x in enumerate(values):
        if not (x is None and k in optional) and None in _leaves(x):
            return k
    return None


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
        inputs, attrs = _leaves(inst[1]), _leaves(inst[2])
        for x in inputs:
            if isinstance(x, str) and x not in defined and _RV_NAME.fullmatch(x):
                raise ValueError(f"instruction {i} uses {x}, which no earlier instruction defines")
        k = _null_at(inst[1], range(1, len(inst[1])) if inst[0] in _NULLABLE_INPUTS else ()) if None in inputs else None
        if k is not None:
            raise ValueError(f"instruction {i} ({inst[0]}) has a null input {k}")
        if not all(isinstance(o, str) and _RV_NAME.fullmatch(o) for o in inst[3]):
            raise ValueError(f"instruction {i} has outputs that are not random-variable names")
        k = _null_at(inst[2], {at for kind, at in _NULLABLE_ATTRS if kind == inst[0]}) if None in attrs else None
        if k is not None:
            raise ValueError(f"instruction {i} ({inst[0]}) has a null attribute {k}")
        for x in inputs + attrs:
            if isinstance(x, str) and x.lstrip()[:1] in ("{", "["):  # JSON TVM decodes: an index map's graph
                try:
                    _checked_once(x)
                except ValueError as e:
                    raise ValueError(f"instruction {i} ({inst[0]}) holds an object TVM cannot decode: {e}") from None
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
    would crash TVM rather than raise.

    Workaround: TVM 0.27's ``load_json`` first runs ``json_compact.upgrade_json`` on every graph,
    which parses the whole text in Python and writes it out again indented, even when nothing in
    it is of an older schema: eight times the decoding's own time on a kernel's module (a hub's
    workloads are decoded by the hundred). A graph with none of the node types or fields that
    upgrade rewrites (``_needs_upgrade``) goes to the decoder as it is."""
    graph = _checked_graph(text)
    try:
        if _needs_upgrade(graph):
            return tvm.ir.load_json(text)
        return from_json_graph_str(text)
    except Exception as e:  # noqa: BLE001 - TVM raises assorted errors (a required field missing, a wrong type)
        raise ValueError(str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__) from None


# node types json_compact.upgrade_json renames (with its Var fields): what an older schema wrote
_LEGACY_TYPES = frozenset(getattr(json_compact, "_PRIM_TYPE_KEY_RENAMES", {})) | {"relax.expr.Var", "tirx.Var"}
_VAR_TYPES = ("ir.Var", "relax.expr.DataflowVar")


def _needs_upgrade(graph: dict) -> bool:
    """Whether ``json_compact.upgrade_json`` would change ``graph`` (a checked object graph): a
    node of a type it renames, a variable named by ``name_hint``, no metadata; always where this
    TVM's upgrade has no rename table to read (another version: its upgrade decides)."""
    if not hasattr(json_compact, "_PRIM_TYPE_KEY_RENAMES") or "metadata" not in graph:
        return True
    for node in graph["nodes"]:
        kind = node.get("type")
        if kind in _LEGACY_TYPES:
            return True
        if kind in _VAR_TYPES and isinstance(node.get("data"), dict) and "name_hint" in node["data"]:
            return True
    return False


def check_object_graph(text: str) -> int:
    """The depth of the TVM object graph in JSON ``text``; ``ValueError`` for what would crash
    TVM's loader: it decodes a graph recursively, so a node that refers to itself or to a later
    node (a cycle), a chain deeper than ``MAX_GRAPH_DEPTH`` or deeply nested JSON kills the
    process with a stack overflow. A graph as TVM writes it lists every node after the nodes it
    refers to."""
    return _graph_depth(_parsed_graph(text))


@functools.lru_cache(maxsize=1 << 12)
def _checked_once(text: str) -> int:
    """``check_object_graph(text)``, remembered for a text that passes (a refused one raises again):
    a hub's traces repeat their index maps."""
    return check_object_graph(text)


def _checked_graph(text: str) -> dict:
    """The object graph of ``text``, parsed, once ``check_object_graph`` passes it."""
    graph = _parsed_graph(text)
    _graph_depth(graph)
    return graph


def _parsed_graph(text: str) -> dict:
    try:
        graph = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON: {str(e)[:80]}") from None
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise ValueError("not a TVM object graph ({'root_index': ..., 'nodes': [...]})")
    nodes, root = graph["nodes"], graph.get("root_index")
    if not (isinstance(root, int) and 0 <= root < len(nodes)):
        raise ValueError(f"root_index {root!r} names no node")
    return graph


def _graph_depth(graph: dict) -> int:
    """``check_object_graph`` of a parsed graph (``_parsed_graph``)."""
    nodes = graph["nodes"]
    depth = [0] * len(nodes)
    for i, node in enumerate(nodes):
        refs = _refs(i, node)
        if refs:
            deepest = 0
            for j in refs:
                if type(j) is not int or not 0 <= j < i:  # bool is no node index either
                    raise ValueError(f"node {i} refers to {j!r}: not an earlier node")
                if depth[j] > deepest:
                    deepest = depth[j]
            depth[i] = deepest + 1
            if deepest >= MAX_GRAPH_DEPTH:
                raise ValueError(f"node {i} is {deepest + 1} references deep (at most {MAX_GRAPH_DEPTH})")
    return max(depth, default=0)


_NESTED = (list, dict)


def _refs(i: int, node: Any) -> list[Any]:
    """The node indices that node ``i`` of a graph refers to; ``ValueError`` for a node that is not
    ``{'type': ..., 'data': ...}`` with flat data, or of a type tvm-ffi does not know."""
    if type(node) is not dict or type(node.get("type")) is not str:
        raise ValueError(f"node {i} is not {{'type': ..., 'data': ...}}")
    kind, data = node["type"], node.get("data")
    flat = data if type(data) is list else data.values() if type(data) is dict else (data,)
    for x in flat:
        if isinstance(x, _NESTED):
            raise ValueError(f"node {i} ({kind}) has nested data")
    if kind in _SEQUENCES:
        if type(data) is not list:
            raise ValueError(f"node {i} ({kind}) data is not a list of node indices")
        return data
    if kind in _SCALARS:
        return []
    known = _fields_of(kind)
    if known is None:
        raise ValueError(f"node {i} has an unknown type {kind[:60]!r}")
    own, fields = known
    if own or type(data) is not dict:
        return []
    return [v for name, v in data.items() if v is not None and fields.get(name, True)]


_FIELDS: dict[str, tuple[bool, dict[str, bool]]] = {}  # type key -> _reference_fields, once a process


def _fields_of(kind: str) -> tuple[bool, dict[str, bool]] | None:
    """``_reference_fields`` of a type tvm-ffi knows, asked once a process (an unknown one every time)."""
    if kind not in _FIELDS:
        fields = _reference_fields(kind)
        if fields is None:
            return None
        if len(_FIELDS) >= 1 << 12:
            _FIELDS.clear()
        _FIELDS[kind] = fields
    return _FIELDS[kind]


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
