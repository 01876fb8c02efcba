"""The runtimes a tuned model is compared with: OpenVINO beside ONNX Runtime, outputs checked."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from test_fastmath import transcendental_model

from stormdrop.model import run as model_run
from stormdrop.model.run import max_abs_diff, side_by_side
from stormdrop.model.runtimes import onnxruntime_timer, openvino_timer
from stormdrop.target import parse_target
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)


def _inputs() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(1).standard_normal((4, 64)).astype("float32")}


def test_openvino_runs_the_onnx_graph_at_fp32_in_the_graphs_output_order():
    onnx_model = transcendental_model()
    ref, _ = onnxruntime_timer(onnx_model, _inputs(), 2)
    found = openvino_timer(onnx_model, _inputs(), 2)
    assert found is not None, "OpenVINO is in the test extras"
    outs, timer = found
    assert [o.shape for o in outs] == [r.shape for r in ref]
    # fp32 precision: bf16 (OpenVINO's default on CPUs that have it) would be off by ~1e-2
    ok = [~np.isnan(r) for r in ref]
    err, scale = max_abs_diff([o[m] for o, m in zip(outs, ok)], [r[m] for r, m in zip(ref, ok)])
    assert err <= 1e-4 * scale
    assert 0 < timer() < 1.0


@pytest.mark.slow
def test_side_by_side_times_openvino_only_when_its_output_matches(monkeypatch):
    model = from_onnx_model(transcendental_model(), "transcendentals")
    ex = tvm.compile(model.mod, target=TARGET)
    latency, _ = side_by_side(model, ex, _inputs(), TARGET, rounds=1, untuned=False)
    assert latency["tuned"] > 0 and latency["onnxruntime"] > 0 and latency["openvino"] > 0

    def wrong(onnx_model, inputs, threads):
        outs, timer = openvino_timer(onnx_model, inputs, threads)
        return [o * 1.01 for o in outs], timer  # 1% off: past 1e-3 of the largest output

    monkeypatch.setattr(model_run, "openvino_timer", wrong)
    latency, _ = side_by_side(model, ex, _inputs(), TARGET, rounds=1, untuned=False)
    assert latency["openvino"] is None and latency["onnxruntime"] > 0
    monkeypatch.setattr(model_run, "openvino_timer", lambda *a: None)  # not installed
    latency, _ = side_by_side(model, ex, _inputs(), TARGET, rounds=1, untuned=False)
    assert latency["openvino"] is None and latency["tuned"] > 0


def test_a_nan_or_infinity_the_reference_does_not_have_is_an_infinite_difference_wherever_it_is():
    ref = [np.array([1.0, np.nan, np.inf]), np.array([2.0, 3.0])]
    assert max_abs_diff([np.array([1.0, np.nan, np.inf]), np.array([2.0, 3.5])], ref) == (0.5, 3.0)
    for outs in ([np.array([1.0, 0.0, np.inf]), np.array([2.0, 3.0])],  # a NaN of the reference missing
                 [np.array([1.0, np.nan, np.inf]), np.array([np.nan, 3.0])],  # a NaN in the second output
                 [np.array([1.0, np.nan, np.inf]), np.array([2.0, -np.inf])]):
        assert max_abs_diff(outs, ref)[0] == np.inf


def test_peers_time_openvino_only_when_it_runs_and_matches_and_say_why_not(monkeypatch):
    model = from_onnx_model(transcendental_model(), "transcendentals")
    found = model_run.peers(model, _inputs(), 2)
    assert set(found.timers) == {"onnxruntime", "openvino"} and not found.missing
    assert [r.shape for r in found.reference] == [r.shape for r in onnxruntime_timer(model.onnx_model, _inputs(), 2)[0]]

    def wrong(onnx_model, inputs, threads):
        outs, timer = openvino_timer(onnx_model, inputs, threads)
        return [o * 1.01 for o in outs], timer

    def broken(onnx_model, inputs, threads):
        raise RuntimeError("Cannot create Gelu layer\nmore lines")

    for fake, why in ((wrong, "wrong (max diff"), (lambda *a: None, "not installed"),
                      (broken, "failed: Cannot create Gelu layer")):
        monkeypatch.setattr(model_run, "openvino_timer", fake)
        found = model_run.peers(model, _inputs(), 2)
        assert set(found.timers) == {"onnxruntime"} and found.missing["openvino"].startswith(why), found.missing
