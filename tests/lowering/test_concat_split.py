"""Channel concatenations that feed convolutions, computed as partial convolutions of their inputs
(``concat_split``): which concatenations go, which stay, and the model's outputs against ONNX
Runtime's."""

from __future__ import annotations

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms

from stormdrop.lowering import concat_split
from stormdrop.lowering.pipeline import Lowering
from stormdrop.model.run import apply_records, max_abs_diff, random_inputs, run_model
from stormdrop.model.runtimes import run_onnxruntime
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads._onnx_builder import GraphBuilder
from stormdrop.workloads.models import from_onnx_model, load_model

TARGET = parse_target(None)


def _fire(g: GraphBuilder, x: str, squeeze: int, expand: int) -> str:
    s = g.relu(g.conv(x, squeeze, 1))
    return g.concat([g.relu(g.conv(s, expand, 1)), g.relu(g.conv(s, expand, 3, pad=1))], axis=1)


def _model():
    """SqueezeNet fire modules: the first one's concatenation read by a max pool and then a narrow
    1x1 convolution (it goes: the pool moves before it), the second's by a 3x3 convolution as
    narrow (it goes), the third's by a convolution wider than the concatenation (partial sums
    would cost more than the concatenation: it stays), the fourth's by a narrow convolution and a
    ReLU (it stays)."""
    g = GraphBuilder("fires", 0)
    x = g.input("x", (1, 8, 13, 13))
    a = g.maxpool(_fire(g, x, 4, 8), 3, 2, ceil_mode=True)
    b = g.relu(g.conv(_fire(g, a, 4, 8), 4, 3, pad=1))
    g.output(g.conv(_fire(g, b, 4, 8), 40, 1))
    d = _fire(g, b, 4, 8)
    g.output(g.conv(d, 4, 1), "narrow")
    g.output(g.relu(d), "relu")
    return from_onnx_model(g.model(), "fires")


def _ops(mod: tvm.IRModule) -> dict[str, int]:
    text = mod.script(show_meta=False)
    return {op: text.count(f"R.{op}(") for op in ("concat", "nn.conv2d", "nn.max_pool2d", "add")}


def test_concatenations_read_only_by_narrow_convolutions_go_and_the_model_matches_onnxruntime():
    model = _model()
    with TARGET:
        before = Lowering()._before_legalization(model.mod, TARGET)
    after = concat_split.split(before)
    old, new = _ops(before), _ops(after)
    assert (old["concat"], new["concat"]) == (4, 2)  # the max-pooled one moves and goes; the last two stay
    assert new["nn.max_pool2d"] == old["nn.max_pool2d"] + 1  # one pool per input of the moved concatenation
    assert new["nn.conv2d"] == old["nn.conv2d"] + 2  # the pool's and the 3x3 convolution: two parts each
    assert new["add"] == old["add"] + 2
    assert Lowering()._before_legalization(model.mod, TARGET).script() == before.script()  # off by default

    inputs = random_inputs(model, 0)
    ref, _ = run_onnxruntime(model.onnx_model, inputs, 2)
    fused, tasks = extract_tasks(model, TARGET, Lowering(split_concats=True))
    names = [k.name for k, _ in tasks]
    assert sum(w for k, w in tasks if "concatenate" in k.name) == 2, names  # the third and the fourth
    assert any(n.count("add") >= 2 for n in names), names  # a part, the partial sum and the bias in one kernel
    ex = tvm.compile(apply_records(fused, ms.database.MemoryDatabase(), TARGET), target=TARGET)
    outs, _ = run_model(ex, inputs, TARGET, time_it=False)
    err, scale = max_abs_diff(outs, ref)
    assert err <= 1e-5 * scale, (err, scale)


@pytest.mark.parametrize("name,concats", [("squeezenet1_0", (8, 1)), ("googlenet", (9, 9))])
def test_which_zoo_concatenations_go(name, concats):
    """SqueezeNet keeps only the one before its 1000-channel classifier; GoogLeNet's inception
    outputs feed four branches each, whose partial sums would cost more than the concatenation,
    so nothing of it changes (its max pools after a concatenation stay where they are)."""
    model = load_model(name, resolution=64)
    with TARGET:
        before = Lowering()._before_legalization(model.mod, TARGET)
    after = concat_split.split(before)
    assert (_ops(before)["concat"], _ops(after)["concat"]) == concats
    if concats[0] == concats[1]:
        assert after.script() == before.script()
