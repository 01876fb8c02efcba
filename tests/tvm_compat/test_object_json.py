"""A module's JSON decodes to the same module whether TVM's schema upgrade runs or is skipped."""

from __future__ import annotations

import json

import tvm
import tvm_ffi
from tvm import te

from stormdrop.tvm_compat import trace_json
from stormdrop.tvm_compat.trace_json import load_object_json


def _module() -> tvm.IRModule:
    a = te.placeholder((8, 16), name="a")
    b = te.compute((8, 16), lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def test_a_current_graph_skips_the_upgrade_and_decodes_to_the_same_module(monkeypatch):
    mod = _module()
    text = tvm.ir.save_json(mod)
    upgrades = []
    real = tvm.ir.load_json
    monkeypatch.setattr(tvm.ir, "load_json", lambda t: upgrades.append(t) or real(t))
    got = load_object_json(text)
    assert upgrades == []  # nothing of an older schema in it: decoded as it is
    assert tvm_ffi.structural_equal(got, mod) and got.script() == mod.script()


def test_a_graph_of_an_older_schema_still_goes_through_the_upgrade(monkeypatch):
    mod = _module()
    graph = json.loads(tvm.ir.save_json(mod))
    renamed = 0
    for node in graph["nodes"]:  # variables named as before the rename: upgrade_json renames them back
        if node["type"] in ("ir.Var",) and isinstance(node.get("data"), dict) and "name" in node["data"]:
            node["data"]["name_hint"] = node["data"].pop("name")
            renamed += 1
    assert renamed > 0
    text = json.dumps(graph)
    assert trace_json._needs_upgrade(graph)
    upgrades = []
    real = tvm.ir.load_json
    monkeypatch.setattr(tvm.ir, "load_json", lambda t: upgrades.append(t) or real(t))
    got = load_object_json(text)
    assert len(upgrades) == 1
    assert tvm_ffi.structural_equal(got, mod) and got.script() == mod.script()
