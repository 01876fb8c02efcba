"""Kernels that stream their weights (a classifier's product for one row) are timed warm where a
model's tasks are timed cold: flushed, every schedule waits on memory alike."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from stormdrop.lowering.pipeline import Lowering
from stormdrop.measure.gateway import Gateway, MeasureConfig
from stormdrop.measure.streaming import streams_weights, weight_elements
from stormdrop.model.tune import extract_tasks
from stormdrop.target import host_target
from stormdrop.workloads import parse_kernel
from stormdrop.workloads.models import from_onnx_model


@pytest.fixture(scope="module")
def tasks():
    """A 3x3 convolution at 8x8, a global average pool and a 32 x 500 classifier (Gemm), as a
    model's tasks on this CPU: name -> kernel."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((32, 3, 3, 3)) * 0.2).astype("float32"), "w")
    fc = numpy_helper.from_array((rng.standard_normal((500, 32)) * 0.1).astype("float32"), "fc")
    bias = numpy_helper.from_array(np.zeros(500, "float32"), "bias")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
         helper.make_node("Flatten", ["p"], ["f"]), helper.make_node("Gemm", ["f", "fc", "bias"], ["y"], transB=1)],
        "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 500])], initializer=[w, fc, bias])
    model = from_onnx_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), "head")
    _, found = extract_tasks(model, host_target(), Lowering())
    return {k.name: k for k, _ in found}


def test_only_the_classifier_streams_its_weights(tasks):
    streaming = [name for name, k in tasks.items() if streams_weights(k.mod)]
    assert len(streaming) == 1 and "matmul" in streaming[0], sorted(tasks)
    assert weight_elements(tasks[streaming[0]].mod) == 32 * 500 + 500  # the matrix and the bias
    conv = [k for name, k in tasks.items() if "conv2d" in name]
    assert conv and weight_elements(conv[0].mod) > 0 and not streams_weights(conv[0].mod)  # 128 FLOPs a weight
    # a kernel tuned alone says nothing of constant weights: nothing streams
    assert not streams_weights(parse_kernel("dense:M=1,N=500,K=32").mod)


@pytest.mark.alone
def test_the_gateway_times_a_streaming_kernel_warm_under_the_cache_flush(tasks):
    """A cold sample is one flushed run; a warm one runs for ``min_repeat_ms``: 2 samples of 1 s."""
    kernel = next(k for name, k in tasks.items() if "matmul" in name)
    elapsed = {}
    for warm in (True, False):  # warm: the default
        with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1000, cache_flush=True,
                                                  **({} if warm else {"warm_streams": False}))) as gw:
            gw.prepare("fc", kernel.mod)
            gw.measure("fc", [kernel.mod])  # the runner's start-up and the reference
            t0 = time.monotonic()
            (r,) = gw.measure("fc", [kernel.mod])
            elapsed[warm] = time.monotonic() - t0
        assert r.ok and len(r.run_secs) == 2
    assert elapsed[True] >= 2.0 and elapsed[False] < 2.0, elapsed
