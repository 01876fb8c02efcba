"""No scalar transcendental in a compiled CPU model: every ONNX operator that computes an
erf, exp, tanh, sigmoid, log or pow is lowered to vectorizable code (``fastmath``), checked
in the compiled kernels' assembly, and its outputs still match ONNX Runtime."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import onnx
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from onnx import TensorProto
from onnx import helper as oh

from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.target import parse_target
from stormdrop.workloads.models import from_onnx_model

TARGET = parse_target(None)
# libm's scalar transcendental functions (float and double), as the compiled kernels would call them
LIBM = re.compile(r"\bcall\w*\s+\*?((?:exp|exp2|exp10|expm1|log|log2|log10|log1p|erf|erfc|tanh|sinh|cosh|pow|"
                  r"sin|cos|tan|asin|acos|atan|atan2)f?)(?:@PLT)?\b")


def libm_calls(model, fast_math: bool = True) -> tuple[Counter, list[np.ndarray]]:
    """Calls to scalar libm functions in the model's compiled kernels (untuned), and its outputs."""
    fused = Lowering(fast_math=fast_math).lower(model.mod, TARGET, True)
    ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
    asm = "".join(m.inspect_source("asm") for m in ex.mod.imports if m.kind == "llvm")
    assert "ret" in asm  # the kernels' assembly really is there
    return Counter(LIBM.findall(asm)), ex


def transcendental_model(opset: int = 20) -> onnx.ModelProto:
    """One ONNX graph with every operator whose lowering computes a transcendental function."""
    nodes: list = []
    outputs: list[str] = []

    def op(name: str, *inputs: str, **attrs) -> str:
        out = f"{name}_{len(nodes)}"
        nodes.append(oh.make_node(name, list(inputs), [out], **attrs))
        return out

    x = "x"
    for out in [op("Gelu", x), op("Gelu", x, approximate="tanh"), op("Erf", x), op("Exp", x), op("Tanh", x),
                op("Sigmoid", x), op("Softplus", x), op("Mish", x), op("HardSwish", x), op("Elu", x), op("Selu", x),
                op("Log", op("Abs", x)), op("Pow", x, "two"), op("Pow", op("Abs", x), "half"),
                op("Pow", x, "three"), op("Pow", op("Abs", x), "x"), op("Pow", x, "n"), op("Softmax", x),
                op("LogSoftmax", x), op("LayerNormalization", x, "scale", "bias")]:
        outputs.append(out)
    init = [oh.make_tensor("two", TensorProto.FLOAT, [], [2.0]), oh.make_tensor("half", TensorProto.FLOAT, [], [0.5]),
            oh.make_tensor("three", TensorProto.FLOAT, [], [3.0]),
            oh.make_tensor("n", TensorProto.FLOAT, [64], np.arange(-32, 32, dtype=np.float32) * 0.25),
            oh.make_tensor("scale", TensorProto.FLOAT, [64], np.ones(64, np.float32)),
            oh.make_tensor("bias", TensorProto.FLOAT, [64], np.zeros(64, np.float32))]
    graph = oh.make_graph(nodes, "transcendentals", [oh.make_tensor_value_info(x, TensorProto.FLOAT, [4, 64])],
                          [oh.make_tensor_value_info(o, TensorProto.FLOAT, [4, 64]) for o in outputs], init)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


@pytest.mark.slow
def test_no_transcendental_operator_leaves_a_scalar_libm_call_and_outputs_match_onnxruntime():
    model = from_onnx_model(transcendental_model(), "transcendentals")
    slow, _ = libm_calls(model, fast_math=False)
    assert {"erff", "expf", "logf", "powf"} <= set(slow)  # the check sees them when they are there
    calls, ex = libm_calls(model)
    assert calls == Counter(), f"scalar libm calls left: {dict(calls)}"
    rng = np.random.default_rng(0)
    inputs = {"x": (rng.standard_normal((4, 64)) * 4).astype("float32")}
    inputs["x"][0, :8] = [0.0, -0.0, -2.0, -3.0, 1e-30, -1e-30, 80.0, -80.0]  # zeros, negative integers, extremes
    outs, _ = run_model(ex, inputs, TARGET, time_it=False)
    refs, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    for name, out, ref in zip([o.name for o in model.onnx_model.graph.output], outs, refs):
        assert (np.isnan(out) == np.isnan(ref)).all(), name
        ok = ~np.isnan(ref)
        np.testing.assert_allclose(out[ok], ref[ok], rtol=2e-5, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("opset", [13, 20])
def test_gelu_reaches_the_kernels_vectorized_at_both_opsets(opset):
    """Opset 20 has ONNX's own ``Gelu``; before it, exporters compose ``x * 0.5 * (1 + Erf(x / sqrt 2))``."""
    nodes = [oh.make_node("Gelu", ["x"], ["y"])] if opset >= 20 else [
        oh.make_node("Div", ["x", "sqrt2"], ["d"]), oh.make_node("Erf", ["d"], ["e"]),
        oh.make_node("Add", ["e", "one"], ["a"]), oh.make_node("Mul", ["x", "a"], ["m"]),
        oh.make_node("Mul", ["m", "half"], ["y"])]
    init = [oh.make_tensor(n, TensorProto.FLOAT, [], [v]) for n, v in (("sqrt2", 2**0.5), ("one", 1.0), ("half", 0.5))]
    graph = oh.make_graph([oh.make_node("MatMul", ["x0", "w"], ["x"]), *nodes], "ffn",
                          [oh.make_tensor_value_info("x0", TensorProto.FLOAT, [8, 32])],
                          [oh.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])],
                          [oh.make_tensor("w", TensorProto.FLOAT, [32, 64], np.linspace(-1, 1, 2048, dtype=np.float32)),
                           *init])
    model = from_onnx_model(oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)]), f"ffn{opset}")
    calls, _ = libm_calls(model)
    assert calls == Counter()
