"""Models handed over from Python: a Relax IRModule and a torch.export program, tuned and deployed."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from stormdrop import ModelOptions, tune_model  # the public entry points, as the README uses them
from stormdrop.model.run import run_model
from stormdrop.target import host_target


def _run_artifact(path, x: np.ndarray) -> np.ndarray:
    """Load the written .so as a user would and run its main function (first output)."""
    return run_model(tvm.runtime.load_module(str(path)), {"x": x}, host_target(), time_it=False)[0][0]


def _dense_relu_module(w: np.ndarray) -> tvm.IRModule:
    """x[1, 64] -> relu(x @ w) with w a constant, written with Relax's block builder."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, w.shape[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(w)))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.slow
def test_relax_module_tuned_compiled_and_checked(tmp_path):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((64, 32)) * 0.1).astype("float32")
    so = tmp_path / "dense.so"
    result = tune_model(_dense_relu_module(w),
                        ModelOptions(trials=8, trials_per_task=4, output=str(so), seed=0),
                        db=tmp_path / "m.db")
    assert result.model == "relax_module"
    assert result.tasks and all(t.verified for t in result.tasks)
    assert result.stopped_by.startswith("every task done")  # 8 global trials, one task capped at 4
    assert 0 < sum(t.tuning_s for t in result.tasks) <= result.tuning_s  # each task's own share
    assert result.latency_s["onnxruntime"] is None  # no ONNX graph: checked against the untuned build,
    assert result.latency_s["untuned"] > 0  # which therefore runs
    assert result.latency_s["tuned"] > 0 and result.max_abs_error is not None and result.max_abs_error < 1e-4
    x = rng.standard_normal((1, 64)).astype("float32")
    np.testing.assert_allclose(_run_artifact(so, x), np.maximum(x @ w, 0), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_torch_export_program_tuned_and_matches_pytorch(tmp_path):
    torch = pytest.importorskip("torch")  # PyTorch is an optional extra, never required

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.fc = torch.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(1, 3, 8, 8)
    program = torch.export.export(net, (x,))
    so = tmp_path / "net.so"
    result = tune_model(program, ModelOptions(trials=8, trials_per_task=4, output=str(so), seed=0),
                        db=tmp_path / "m.db")
    assert result.model == "torch_export"
    assert result.tasks and all(t.verified for t in result.tasks)
    with torch.no_grad():
        expected = net(x).numpy()
    np.testing.assert_allclose(_run_artifact(so, x.numpy()), expected, rtol=1e-4, atol=1e-4)
