"""The reference build's loop nest run across the cores: the same values as the serial nest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from stormdrop.measure.reference import (
    GROUP_MAX,
    reference_groups,
    reference_module,
    reference_target,
)
from stormdrop.target import host_target

EXPORTS = Path(__file__).resolve().parents[1] / "fixtures" / "exports"


def _two_cores() -> tvm.target.Target:
    return tvm.target.Target({**dict(host_target().export()), "num-cores": 2})


def _outputs(mod: tvm.IRModule, target: tvm.target.Target) -> list[np.ndarray]:
    """Every argument's values after one run; integer arguments (a gather's indices) are zero, in range."""
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(x) for x in a.shape]).astype(str(a.dtype))
                               if not str(a.dtype).startswith("int")
                               else np.zeros([int(x) for x in a.shape], str(a.dtype)))
            for a in ArgInfo.from_prim_func(mod["main"])]
    tvm.build(mod, target=reference_target(target))["main"](*args)
    return [a.numpy() for a in args]


@pytest.mark.slow  # builds every task of a fixture network twice
@pytest.mark.parametrize("fixture", ["tv_mobilenet_v3.onnx", "hf_distilbert.onnx"])
def test_every_task_runs_in_parallel_and_computes_the_serial_values(fixture):
    from stormdrop.model.tune import extract_tasks
    from stormdrop.workloads.models import load_model

    target = _two_cores()
    _, tasks = extract_tasks(load_model(str(EXPORTS / fixture)), target)
    parallel = 0
    for kernel, _ in tasks:
        mod = reference_module(kernel.mod, target)
        parallel += "T.parallel" in mod.script()
        for a, b in zip(_outputs(kernel.mod, target), _outputs(mod, target)):
            assert np.array_equal(a, b, equal_nan=True), kernel.name
    assert parallel == len(tasks), (parallel, len(tasks))


def test_a_nest_without_data_parallel_loops_and_a_single_core_stay_serial():
    data = te.placeholder((64, 64), name="data")
    k, j = te.reduce_axis((0, 64), "k"), te.reduce_axis((0, 64), "j")
    total = te.compute((1,), lambda i: te.sum(data[k, j], axis=[k, j]), name="total")
    whole = tvm.IRModule({"main": te.create_prim_func([data, total])})
    assert reference_module(whole, _two_cores()) is whole  # its one spatial loop has a single iteration
    rows = te.compute((64,), lambda i: te.sum(data[i, j], axis=j), name="rows")
    per_row = tvm.IRModule({"main": te.create_prim_func([data, rows])})
    assert "T.parallel" in reference_module(per_row, _two_cores()).script()
    one = tvm.target.Target({**dict(host_target().export()), "num-cores": 1})
    assert reference_module(per_row, one) is per_row


@pytest.mark.parametrize("count, builders, size", [(1, 2, 1), (8, 2, 1), (10, 2, 2), (34, 2, 5), (189, 2, GROUP_MAX),
                                                   (5, 1, 2)])
def test_references_are_grouped_by_libraries_that_keep_every_builder_busy(count, builders, size):
    groups = reference_groups(count, builders)
    assert [i for g in groups for i in g] == list(range(count))  # each workload once, in order
    assert max(map(len, groups)) == size
