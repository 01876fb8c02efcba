"""Neighbour generation over real MetaSchedule traces: always valid schedules."""

from __future__ import annotations

import random

import pytest
import tvm
from tvm import te, topi

from stormdrop import _tvm
from stormdrop.space import DecisionSpace, _tile_steps, divisors_with_omega, prime_factors
from stormdrop.storm import make_context
from stormdrop.target import host_target
from stormdrop.workloads import parse_kernel


def test_prime_factor_helpers():
    assert prime_factors(360) == [2, 2, 2, 3, 3, 5]
    assert divisors_with_omega(12, 1) == [2, 3]
    assert divisors_with_omega(12, 2) == [4, 6]
    assert divisors_with_omega(7, 2) == []


def test_tile_steps_keep_the_product_and_the_innermost_limit():
    rng = random.Random(0)
    for _ in range(200):
        factors = tuple(rng.choice([1, 2, 3, 4, 6, 8, 16]) for _ in range(rng.choice([2, 4])))
        limit = rng.choice([0, 4, 16, 64])
        if limit and factors[-1] > limit:
            continue
        product = 1
        for f in factors:
            product *= f
        for r in (1, 2):
            for new in _tile_steps(factors, r, limit):
                assert len(new) == len(factors)
                assert new != factors
                p = 1
                for f in new:
                    p *= f
                assert p == product
                assert not limit or new[-1] <= limit


def _spaces(spec):
    kernel = parse_kernel(spec)
    ctx = make_context(kernel.mod, host_target(), seed=1, strategy="replay-trace")
    postprocs = ctx.space_generator.postprocs
    for sch in ctx.generate_design_space():
        sch.enter_postproc()
        assert all(p.apply(sch) for p in postprocs)
        yield DecisionSpace(kernel.mod, postprocs, sch.trace, num_cores=2)


@pytest.mark.parametrize("spec", ["matmul:M=64,N=48,K=32",
                                  "conv2d_bias_relu:N=1,C=8,H=14,W=14,K=16,R=3,S=3,stride=1,pad=1"])
def test_every_neighbour_is_a_valid_schedule(spec):
    for space in _spaces(spec):
        kinds = {c.kind for c in space.coordinates}
        assert "tile" in kinds and "categorical" in kinds
        for radius in (1, 2):
            neighbours = space.neighbours(space.start, radius)
            assert neighbours, "a real trace always has neighbours at radius 1 and 2"
            for pos in neighbours:
                assert pos != space.start
                cand = space.apply(pos)
                assert cand is not None, f"neighbour {pos} was rejected"
                back = space.position_of(_tvm.to_py(cand.sch.trace.as_json(remove_postproc=True)))
                for coord, want, got in zip(space.coordinates, pos, back):
                    if coord.kind != "location":  # TVM rounds compute locations; tiles must stay exact
                        assert want == got


def test_applying_the_start_gives_back_the_incumbent():
    space = next(iter(_spaces("matmul:M=64,N=48,K=32")))
    cand = space.apply(space.start)
    assert cand is not None and cand.position == space.start
    assert space.position_of(_tvm.to_py(cand.sch.trace.as_json(remove_postproc=True))) == space.start


def test_pooling_blocks_get_the_default_rules_without_a_warning(capfd):
    """Legalized pooling carries schedule_rule=meta_schedule.pool_max, a rule TVM never registers."""
    data = te.placeholder((1, 8, 16, 16), name="data")
    pool = topi.nn.pool2d(data, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "max")
    mod = tvm.IRModule({"main": te.create_prim_func([data, pool])})
    assert "meta_schedule.pool_max" in mod.script()  # the annotation the warning was about
    capfd.readouterr()
    spaces = make_context(mod, host_target(), seed=0, threads=1).generate_design_space()
    assert spaces and "Unknown schedule rule" not in capfd.readouterr().err
    assert all("meta_schedule.pool_max" not in sch.mod.script() for sch in spaces)
