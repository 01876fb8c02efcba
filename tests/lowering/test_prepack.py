"""A packed-weight candidate is timed and checked as the function a compiled model deploys."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from stormdrop.lowering.prepack import split
from stormdrop.measure import _worker
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import host_target
from stormdrop.workloads import parse_kernel

pytestmark = pytest.mark.slow  # builds, runs or spawns processes

SPEC = "conv2d:N=1,C=16,H=8,W=8,K=32,R=3,S=3,pad=1,layout=NHWC"


@pytest.fixture(scope="module")
def packed_candidate():
    """A storm candidate of an NHWC convolution whose schedule re-lays its weights out."""
    kernel = parse_kernel(SPEC)
    storm = Storm(kernel.mod, host_target(), trials=16, seed=0,
                  config=StormConfig(batch_size=16, population_size=16, genetic_num_iters=1, init_min_unmeasured=16))
    for cand in storm.propose() or []:
        if split(cand.mod) is not None:
            return kernel, cand
    pytest.fail("no candidate of an NHWC convolution packs its weights")


def test_the_timed_function_is_the_kernel_on_packed_weights_and_is_what_is_checked(tmp_path, packed_candidate):
    kernel, cand = packed_candidate
    target = host_target()
    built = _worker._build(target, tvm.ir.save_json(cand.mod), str(tmp_path / "c.so"))
    plan = built["pack"]
    assert plan is not None
    original = [[int(x) for x in a.shape] for a in ArgInfo.from_prim_func(kernel.mod["main"])]
    timed = [shape for shape, _ in built["args"]]
    assert timed != original and len(plan["outputs"]) >= 1  # main takes the packed weights, not the originals
    lib = tvm.runtime.load_module(built["timed"])
    assert lib.implements_function("main") and lib.implements_function("pack")

    runner = _worker._RunnerState(target, None)
    runner.reference("k", tvm.ir.save_json(kernel.mod), 0)
    ok = runner.run("k", built, 1, 3, 0, False, True, 0)
    assert "run_secs" in ok and len(ok["run_secs"]) == 3, ok
    # the check runs `main` itself on weights that `pack` packed from the inputs: zero weights
    # under the real weights' reference make it fail, though the same library ran above
    runner.inputs["k0"] = [np.zeros_like(a) if i in plan["inputs"] else a for i, a in enumerate(runner.inputs["k"])]
    runner.expected["k0"], runner.outputs["k0"] = runner.expected["k"], runner.outputs["k"]
    bad = runner.run("k0", built, 1, 3, 0, False, True, 0)
    assert "wrong" in bad, bad
