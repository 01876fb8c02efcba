"""The small-input benchmark's networks (benchmarks/small_networks.py) and its case syntax:
valid ONNX that ONNX Runtime runs and stormdrop imports with the same input, no torch needed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_small import parse_cases  # noqa: E402
from small_networks import HELD_OUT, NETWORKS, write  # noqa: E402

from stormdrop.model.runtimes import run_onnxruntime  # noqa: E402
from stormdrop.workloads.models import load_model  # noqa: E402

SIDES = {"smallcnn": 64, "smallres": 96, "smallmb": 128}


def test_small_networks_run_in_onnxruntime_and_import(tmp_path):
    paths = write(str(tmp_path))
    assert [Path(p).stem for p in paths] == list(NETWORKS) == list(SIDES)
    assert set(HELD_OUT) < set(NETWORKS) and "smallcnn" not in HELD_OUT  # smallcnn chose the defaults
    for path in paths:
        model = load_model(path)
        side = SIDES[Path(path).stem]
        assert model.inputs["input"] == ((1, 3, side, side), "float32")
        x = {"input": np.random.default_rng(0).standard_normal((1, 3, side, side)).astype("float32")}
        (out,), _ = run_onnxruntime(model.onnx_model, x, 1)
        assert out.shape == (1, 10) and np.isfinite(out).all() and np.abs(out).max() > 1e-6


def test_bench_small_cases():
    assert parse_cases("smallcnn:128/256,mobilenet_v2@96:256") == [
        ("smallcnn", None, 128), ("smallcnn", None, 256), ("mobilenet_v2", 96, 256)]
    assert parse_cases("smallres") == [("smallres", None, 128)]
