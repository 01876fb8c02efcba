"""Parity planes: stride-2 padded inputs stored as even and odd columns, one more set of sketches."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.s_tir import Schedule

from stormdrop import KernelOptions, tune_kernel
from stormdrop.search import parity
from stormdrop.search.sketches import Sketches
from stormdrop.target import host_target
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json, trace_to_json
from stormdrop.workloads import parse_kernel

DW_S2 = "depthwise_conv2d:N=1,C=16,H=32,W=32,R=3,S=3,stride=2,pad=1"


@pytest.mark.parametrize("spec, block", [
    (DW_S2, "PaddedInput"),
    ("conv2d:N=1,C=8,H=16,W=16,K=16,R=3,S=3,stride=2,pad=1", "pad_temp"),
    ("depthwise_conv2d:N=1,C=16,H=32,W=32,R=3,S=3,stride=1,pad=1", None),  # stride 1: contiguous already
    ("depthwise_conv2d:N=1,C=16,H=31,W=31,R=3,S=3,stride=2,pad=1", None),  # 33 padded columns: no two planes
    ("conv2d:N=1,C=8,H=16,W=16,K=16,R=3,S=3,stride=2,pad=1,layout=NHWC", None),  # rows are channels
    ("dense:M=16,N=16,K=16", None),
])
def test_only_a_padded_input_read_at_stride_2_along_the_output_rows_is_split(spec, block) -> None:
    assert parity.candidates(parse_kernel(spec).mod) == ([block] if block else [])


def _run(mod, inputs) -> np.ndarray:
    lib = tvm.compile(mod, target=host_target())
    args = [tvm.runtime.tensor(a) for a in inputs]
    lib["main"](*args)
    return args[-1].numpy()


def test_the_planes_are_sketches_beside_metaschedules_that_compute_the_same() -> None:
    kernel = parse_kernel(DW_S2)
    sketches = Sketches(kernel.mod, host_target(), seed=0)
    spaces = sketches.spaces()
    planar = [s for s in spaces if any(i.kind.name == "TransformLayout" for i in s.trace.insts)]
    assert 0 < len(planar) < len(spaces)  # MetaSchedule's own sketches are kept
    rng = np.random.default_rng(0)
    infos = ms.arg_info.ArgInfo.from_prim_func(kernel.mod["main"])
    inputs = [rng.standard_normal([int(x) for x in a.shape]).astype("float32") for a in infos]
    reference = _run(kernel.mod, inputs)
    kept = 0
    for space in planar:
        # as the database keeps it: the trace as JSON, replayed on the workload itself
        sch = schedule_from_trace_json(kernel.mod, trace_to_json(space.trace, remove_postproc=True))
        sch.enter_postproc()
        assert all(p.apply(sch) for p in sketches.postprocs)
        # the padded input as two planes of 17 columns, unless the sketch drew to inline it
        kept += "(1, 16, 34, 2, 17)" in sch.mod.script()
        np.testing.assert_allclose(_run(sch.mod, inputs), reference, rtol=1e-5, atol=1e-5)
    assert kept


def test_the_planes_read_what_the_stride_2_read_read_contiguously() -> None:
    sch = parity.planes(parse_kernel(DW_S2).mod)
    conv = sch.get(sch.get_sblock("DepthwiseConv2d"))
    (read,) = [r for r in conv.reads if r.source.name == "PaddedInput"]
    # [b, c, 2i + di, dj % 2, dj // 2 + j]: j, the output's column, steps one element
    assert "v_dj // 2 + v_j" in str(read.region[-1].min) or "v_j + v_dj // 2" in str(read.region[-1].min)
    assert len(read.source.shape) == 5


@pytest.mark.slow
def test_a_stride_2_kernel_tunes_and_its_best_replays_from_the_database(tmp_path) -> None:
    result = tune_kernel(DW_S2, KernelOptions(trials=16, exploit_trials=4, seed=0), db=tmp_path / "p.db")
    task = result.tasks[0]
    assert task.verified
    kernel = parse_kernel(DW_S2)
    sch = schedule_from_trace_json(kernel.mod, task.trace_json)
    assert isinstance(sch, Schedule)
    assert json.loads(task.trace_json)  # stored as plain JSON, index maps included
