"""Neighbour generation over real MetaSchedule traces: always valid schedules."""

from __future__ import annotations

import random

import pytest
import tvm
from tvm import te, topi

from stormdrop.search.sketches import make_context
from stormdrop.search.space import (
    DecisionSpace,
    _prod,
    _tile_steps,
    divisors_with_omega,
    prime_factors,
)
from stormdrop.target import host_target
from stormdrop.tvm_compat.trace_json import to_py
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
                back = space.position_of(to_py(cand.sch.trace.as_json(remove_postproc=True)))
                for coord, want, got in zip(space.coordinates, pos, back):
                    if coord.kind != "location":  # TVM rounds compute locations; tiles must stay exact
                        assert want == got


def test_applying_the_start_gives_back_the_incumbent():
    space = next(iter(_spaces("matmul:M=64,N=48,K=32")))
    cand = space.apply(space.start)
    assert cand is not None and cand.position == space.start
    assert space.position_of(to_py(cand.sch.trace.as_json(remove_postproc=True))) == space.start


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


@pytest.mark.parametrize("spec,lanes,registers", [
    ("conv2d:N=1,C=32,H=14,W=14,K=64,R=3,S=3,pad=1,layout=NHWC", 16, 32),
    ("dense:M=24,N=96,K=64", 8, 16),
])
def test_register_tiles_are_micro_kernels_of_the_same_loops(spec, lanes, registers):
    space = next(s for s in _spaces(spec) if sum(c.kind == "tile" and c.size == 4 for c in s.coordinates) >= 2)
    jumps = space.register_tiles(space.start, lanes, registers)
    assert jumps and space.start not in jumps
    spatial = [k for k, c in enumerate(space.coordinates) if c.kind == "tile" and c.size == 4]
    for pos in jumps:
        for k, (old, new) in enumerate(zip(space.start, pos)):
            if k not in spatial:
                assert old == new, "only the spatial tiles move"
            else:
                assert new[2] == 1 and _prod(new) == _prod(old), "a split of the same extent, middle level 1"
        width = pos[spatial[-1]][3]
        assert width % lanes == 0 and width <= 4 * lanes, "the vector loop is 1-4 vectors"
        accumulators = width // lanes * _prod(tuple(pos[k][3] for k in spatial[:-1]))
        assert registers // 4 <= accumulators <= registers - 4
        assert _prod(tuple(pos[k][0] for k in spatial)) >= 4, "two parallel chunks per core at least"
    assert sum(space.apply(p) is not None for p in jumps[:6]) >= 1


def test_no_register_tiles_when_the_vector_loop_is_not_a_multiple_of_the_lanes():
    space = next(iter(_spaces("dense:M=16,N=20,K=32")))
    assert space.register_tiles(space.start, 16) == []


def test_a_one_row_product_gets_column_blocks_of_2_to_8_vectors_with_1000_columns():
    """A classifier's product (one row, 1000 columns: no multiple of 16 lanes divides them) has no
    other accumulators than its columns: the jumps block 2-8 vectors of columns in the middle and
    vector levels, one pass over the row (second level 1), the rest across the cores."""
    space = next(s for s in _spaces("dense:M=1,N=1000,K=128") if sum(c.kind == "tile" and c.size == 4
                                                                          for c in s.coordinates) >= 2)
    jumps = space.register_tiles(space.start, 16, 32)
    spatial = [k for k, c in enumerate(space.coordinates) if c.kind == "tile" and c.size == 4]
    columns = spatial[-1]
    assert {pos[columns][2:] for pos in jumps} >= {(5, 8), (5, 10), (10, 10), (2, 20), (1, 40)}
    for pos in jumps:
        parallel, second, middle, width = pos[columns]
        assert second == 1 and parallel * middle * width == 1000 and parallel >= 4
        assert 8 <= width <= 64 and 32 <= middle * width <= 128
        assert all(pos[k] == space.start[k] for k in range(len(pos)) if k != columns)
    assert sum(space.apply(p) is not None for p in jumps) == len(jumps)
