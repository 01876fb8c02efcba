"""The CPU runtimes a model is compared with: ONNX Runtime, OpenVINO, PyTorch.

Each runs the same ONNX model (PyTorch: the same ``torch.export`` program) on the same inputs,
with the target's core count as its thread count, at its best fair setting: ONNX Runtime with
its default graph optimizations (CPU provider); OpenVINO with fp32 inference precision (its
CPU plugin would otherwise run bf16 or fp16 on processors that have them) and the latency
hint. A timer returns one latency sample (s): the median run over 0.5 s, under the timing lock.
OpenVINO is optional (``pip install stormdrop[openvino]``): ``openvino_timer`` is ``None``
without it.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stormdrop.measure.timing_lock import timing

Timer = Callable[[], float]


def _timed(fn: Any, min_s: float = 0.5, min_runs: int = 3) -> float:
    fn()
    times = []
    t_end = time.perf_counter() + min_s
    while time.perf_counter() < t_end or len(times) < min_runs:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _sampler(run: Callable[[], Any]) -> Timer:
    def sample() -> float:
        with timing():
            return _timed(run)

    return sample


def onnxruntime_timer(onnx_model: Any, inputs: dict[str, np.ndarray], threads: int
                      ) -> tuple[list[np.ndarray], Timer]:
    """ONNX Runtime's outputs (CPU provider, default graph optimizations, ``threads`` intra-op
    threads) and its latency timer."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(onnx_model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs), _sampler(lambda: sess.run(None, inputs))


def run_onnxruntime(onnx_model: Any, inputs: dict[str, np.ndarray], threads: int
                    ) -> tuple[list[np.ndarray], float]:
    outs, timer = onnxruntime_timer(onnx_model, inputs, threads)
    return outs, timer()


def openvino_available() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def openvino_timer(onnx_model: Any, inputs: dict[str, np.ndarray], threads: int
                   ) -> tuple[list[np.ndarray], Timer] | None:
    """OpenVINO's outputs (CPU plugin, fp32 precision, latency hint, ``threads`` inference
    threads), in the ONNX graph's output order, and its latency timer; ``None`` when OpenVINO
    is not installed."""
    if not openvino_available():
        return None
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(io.BytesIO(onnx_model.SerializeToString())), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads})
    request = compiled.create_infer_request()
    request.infer(inputs)
    outs = [np.array(request.get_tensor(compiled.output(o.name)).data) for o in onnx_model.graph.output]
    return outs, _sampler(lambda: request.infer(inputs))


def run_pytorch(program: Any, inputs: dict[str, np.ndarray], threads: int) -> tuple[list[np.ndarray], float]:
    import torch

    torch.set_num_threads(threads)
    module = program.module()
    args = [torch.from_numpy(v) for v in inputs.values()]
    with torch.no_grad():
        out = module(*args)
        outs = [o.numpy() for o in (out if isinstance(out, (list, tuple)) else [out])]
        return outs, _timed(lambda: module(*args))
