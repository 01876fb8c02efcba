"""A candidate whose build takes far longer than the run's others is given up (``MeasureConfig.build_limit_s``)."""

from __future__ import annotations

import platform
import time

import pytest
import tvm
from tvm import te

from stormdrop.measure.gateway import SLOW_BUILD_AFTER, Gateway, MeasureConfig
from stormdrop.records import ErrorKind
from stormdrop.target import host_target


def _product(unroll: int | None) -> tvm.IRModule:
    """C[49, 116] = A^T B over 116 rows: as scheduled (``unroll`` not None), each output row's 116
    columns as two vectors of 58 lanes (an odd width) over the whole reduction, the nest unrolled up
    to ``unroll`` steps. Unrolled (512), LLVM's backend takes seconds to emit it on x86, where the
    same nest not unrolled, or over 64 lanes, takes a fraction of a second."""
    a, b = te.placeholder((116, 49), name="A"), te.placeholder((116, 116), name="B")
    k = te.reduce_axis((0, 116), name="k")
    c = te.compute((49, 116), lambda i, j: te.sum(a[k, i] * b[k, j], axis=k), name="C")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    if unroll is None:
        return mod
    sch = tvm.s_tir.Schedule(mod)
    block = sch.get_sblock("C")
    i, j, r = sch.get_loops(block)
    outer, lanes = sch.split(j, [None, 58])
    sch.reorder(i, outer, r, lanes)
    sch.parallel(i)
    sch.vectorize(lanes)
    sch.annotate(i, "pragma_auto_unroll_max_step", unroll)
    sch.annotate(i, "pragma_unroll_explicit", 1)
    sch.decompose_reduction(block, r)
    return sch.mod


def test_the_build_limit_is_a_multiple_of_the_mean_build_within_its_floor_and_the_timeout():
    cfg = MeasureConfig(build_timeout_s=60.0, slow_build_factor=10.0, slow_build_floor_s=5.0)
    assert cfg.build_limit_s(None) == 60.0  # too few builds known
    assert cfg.build_limit_s(0.1) == 5.0
    assert cfg.build_limit_s(2.0) == 20.0
    assert cfg.build_limit_s(30.0) == 60.0


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the slow emission is x86's")
def test_a_build_far_slower_than_the_runs_others_is_given_up_and_the_builder_goes_on():
    """A batch waits for its slowest build: past ``slow_build_factor`` times the mean build (at least
    ``slow_build_floor_s``) a warm builder is killed, the candidate is a ``BUILD_TIMEOUT``, and the
    builder, started again, builds the next candidate, its first build under the full timeout."""
    cfg = MeasureConfig(repeat=2, min_repeat_ms=1, builders=1, slow_build_floor_s=1.0)
    with Gateway(host_target(), cfg) as gw:
        gw.prepare("p", _product(None))
        quick = _product(0)
        assert all(r.ok for r in gw.measure("p", [quick] * (SLOW_BUILD_AFTER + 1)))  # the first pays the warm-up
        mean = gw.costs.mean_build_s(SLOW_BUILD_AFTER)
        assert mean is not None and cfg.build_limit_s(mean) == pytest.approx(max(1.0, 10 * mean))
        t0 = time.monotonic()
        slow, after = gw.measure("p", [_product(512), quick])
        assert slow.error is ErrorKind.BUILD_TIMEOUT and "build exceeded" in slow.error_msg
        assert after.ok
        # given up at its limit (polled every 0.5 s), not the seconds LLVM takes: the builder's restart
        # and the quick candidate's build and run are the rest
        assert time.monotonic() - t0 < cfg.build_limit_s(mean) + 5.0
        assert gw._builders[0].jobs == 1  # a new process, whose first build was the quick one
