"""Networks as PyTorch's default ONNX exporter writes them (torchvision and Hugging Face
definitions in tiny configurations, ``benchmarks/export_networks.py --set fixtures``): each
one imports, lowers, compiles with no scalar transcendental left, and matches ONNX Runtime
and OpenVINO; one is tuned end to end. No PyTorch needed: the files are committed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_fastmath import libm_calls

from stormdrop.model.options import ModelOptions
from stormdrop.model.run import random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import tune_model
from stormdrop.target import parse_target
from stormdrop.workloads.models import load_model

TARGET = parse_target(None)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exports"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())


def test_the_fixtures_cover_what_the_exporters_write():
    ops = set().union(*(m["ops"] for m in MANIFEST))
    assert {"Gelu", "LayerNormalization", "GatherND", "IsNaN", "Where", "HardSwish", "HardSigmoid", "Sigmoid",
            "Softmax", "Tanh", "Pow"} <= ops
    assert all(m["opset"] >= 18 for m in MANIFEST)  # the dynamo-based exporter's opsets
    assert any("int64" in m["inputs"].values() for m in MANIFEST)  # token ids and masks
    assert {m["file"] for m in MANIFEST} == {p.name for p in FIXTURES.glob("*.onnx")}


@pytest.mark.slow
@pytest.mark.parametrize("name", [m["name"] for m in MANIFEST])
def test_an_exported_network_compiles_vectorized_and_matches_onnxruntime(name):
    model = load_model(str(FIXTURES / f"{name}.onnx"))
    calls, ex = libm_calls(model)
    assert calls == Counter(), f"scalar libm calls left: {dict(calls)}"
    inputs = random_inputs(model, 0)
    outs, _ = run_model(ex, inputs, TARGET, time_it=False)
    refs, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for out, ref in zip(outs, refs):
        assert np.std(ref) > 0.05  # the fixtures' weights keep activations near 1: a real check
        assert np.abs(out - ref).max() <= 1e-4 * np.abs(ref).max()


@pytest.mark.slow
def test_an_exported_convnext_is_tuned_compiled_and_checked_against_both_runtimes(tmp_path):
    result = tune_model(str(FIXTURES / "tv_convnext.onnx"), ModelOptions(trials=48, trials_per_task=2, seed=0),
                        db=tmp_path / "c.db")
    assert len(result.tasks) >= 4 and all(t.verified for t in result.tasks)
    assert any("gelu" in t.name for t in result.tasks)  # the GELU fused into its matmul's kernel
    assert result.latency_s["onnxruntime"] > 0 and result.latency_s["openvino"] > 0
    assert result.max_abs_error < 1e-3


@pytest.mark.slow
def test_mobilenet_v3s_hard_activations_stay_nhwc():
    """HardSigmoid and HardSwish as Relax max/min: in NHWC only the input's and the head's
    transposes are left (with relax.op.clip each SE gate and hardswish was a kernel with
    transposes inside: 68 tasks instead of 52)."""
    from stormdrop.model.tune import extract_tasks

    _, tasks = extract_tasks(load_model(str(FIXTURES / "tv_mobilenet_v3.onnx")), TARGET)
    names = [k.name for k, _ in tasks]
    assert not [n for n in names if "clip" in n]
    assert len([n for n in names if "transpose" in n]) <= 2, names


def test_the_importer_patch_lasts_only_while_stormdrop_imports():
    """Loading a model gives Clips, HardSigmoid and HardSwish as Relax ops; afterwards TVM's own
    ONNX importer is as it was (no process-wide change for other users of TVM in the process)."""
    from tvm.relax.frontend.onnx import onnx_frontend as onnx_fe

    classes = (onnx_fe.Clip, onnx_fe.HardSigmoid, onnx_fe.HardSwish)
    before = [dict(vars(c)) for c in classes]
    mod = load_model(str(FIXTURES / "tv_mobilenet_v3.onnx")).mod
    assert [dict(vars(c)) for c in classes] == before
    text = mod.script()
    assert "R.maximum" in text and "R.minimum" in text and "R.clip" not in text
