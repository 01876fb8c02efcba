"""Droplet Search logic on a synthetic noisy objective (no TVM measurement involved)."""

from __future__ import annotations

import random

import pytest

from stormdrop.records import MeasureResult, Phase
from stormdrop.search.raindrop import Raindrop, RaindropConfig, significantly_faster
from stormdrop.search.space import Candidate


class GridSpace:
    """A d-dimensional integer grid in [0, size): the raindrop's space contract without TVM."""

    def __init__(self, start: tuple[int, ...], size: int) -> None:
        self.start, self.size = start, size
        self.max_radius = size - 1

    def neighbours(self, position, radius):
        out = []
        for k, v in enumerate(position):
            for s in (-radius, radius):
                if 0 <= v + s < self.size:
                    out.append(position[:k] + (v + s,) + position[k + 1:])
        return out

    def apply(self, position, phase=Phase.RAINDROP):
        return make(position)

    def rebase(self, cand):
        return cand.position


def make(position):
    return Candidate(sch=None, phase=Phase.RAINDROP, args_info=[], trace_json=str(position), key=str(position),
                     position=position)


def objective(position, optimum):
    return 1e-3 * (1 + sum((p - o) ** 2 for p, o in zip(position, optimum)))


def run(space, start, *, optimum, noise, budget, pvalue=0.05, seed=0, repeat=5, max_batches=10_000):
    rng = random.Random(seed)

    def measure(pos):
        base = 1e-3 if optimum is None else objective(pos, optimum)
        return MeasureResult(run_secs=tuple(base * (1 + rng.gauss(0, noise)) for _ in range(repeat)))

    start_c = make(start)
    drop = Raindrop(space, start_c, measure(start).run_secs, budget=budget, seed=seed,
                    config=RaindropConfig(pvalue=pvalue, batch_size=4))
    trajectory, measured = [start], 0
    for _ in range(max_batches):
        batch = drop.propose()
        if batch is None:
            break
        measured += sum(not c.remeasure for c in batch)
        drop.tell(batch, [measure(c.position) for c in batch])
        trajectory.append(drop.position)
    return drop, trajectory, measured


def test_significance_rules():
    fast, slow = (1.0, 1.01, 0.99, 1.0, 1.02), (2.0, 2.01, 1.99, 2.0, 2.02)
    assert significantly_faster(fast, slow, 0.05)
    assert not significantly_faster(slow, fast, 0.05)
    noisy_a, noisy_b = (1.0, 1.5, 0.5, 1.2, 0.8), (1.05, 1.45, 0.6, 1.25, 0.85)
    assert not significantly_faster(noisy_a, noisy_b, 0.05)  # lower mean, but not significant
    assert significantly_faster(noisy_a, noisy_b, 1.0)
    assert significantly_faster((1.0,), (1.1,), 0.05)  # one sample each: the mean decides
    assert not significantly_faster((), (1.0,), 0.05)


def test_finds_the_optimum_of_a_noisy_convex_landscape():
    space = GridSpace((0, 0, 0), 8)
    drop, traj, _ = run(space, (0, 0, 0), optimum=(5, 2, 7), noise=0.02, budget=500)
    assert drop.position == (5, 2, 7)
    assert drop.done


def test_moves_only_on_significant_improvement():
    # A flat landscape with 20 % noise: every "improvement" is noise, so a move is a false positive.
    moves = {0.05: [], 1.0: []}
    for pvalue in moves:
        for seed in range(5):
            drop, _, _ = run(GridSpace((4, 4), 9), (4, 4), optimum=None, noise=0.2, budget=64,
                                    pvalue=pvalue, seed=seed)
            moves[pvalue].append(drop.moves)
    # at p <= 0.05 about 5 % of the comparisons may pass by chance; without the test, about half do
    assert max(moves[0.05]) <= 4
    assert sum(moves[1.0]) > 5 * max(1, sum(moves[0.05]))


def test_respects_budget_and_terminates():
    space = GridSpace((0, 0), 50)
    drop, _, measured = run(space, (0, 0), optimum=(49, 49), noise=0.01, budget=30)
    assert measured <= 30
    assert drop.propose() is None
    # Unlimited budget on a small grid: stops by itself once no radius improves.
    space = GridSpace((2, 2), 5)
    drop, _, measured = run(space, (2, 2), optimum=(2, 2), noise=0.01, budget=10_000)
    assert drop.done and measured < 100


@pytest.mark.parametrize("seed", [0, 7])
def test_reproducible_with_a_seed(seed):
    a = run(GridSpace((0, 0, 0), 6), (0, 0, 0), optimum=(3, 4, 1), noise=0.05, budget=60, seed=seed)
    b = run(GridSpace((0, 0, 0), 6), (0, 0, 0), optimum=(3, 4, 1), noise=0.05, budget=60, seed=seed)
    assert a[1] == b[1] and a[2] == b[2]


def test_incumbent_is_remeasured_but_not_counted():
    space = GridSpace((1, 1), 4)
    drop = Raindrop(space, make((1, 1)), (1.0, 1.0), budget=3, config=RaindropConfig(batch_size=8))
    batch = drop.propose()
    assert batch[0].remeasure and batch[0].key == str((1, 1))
    assert sum(not c.remeasure for c in batch) == 3  # capped by the budget
    drop.tell(batch, [MeasureResult(run_secs=(1.0, 1.0))] * len(batch))
    assert drop.budget == 0 and drop.propose() is None


def test_failures_never_win():
    space = GridSpace((1,), 3)
    drop = Raindrop(space, make((1,)), (1.0, 1.0, 1.0), budget=10)
    batch = drop.propose()
    from stormdrop.records import ErrorKind

    drop.tell(batch, [MeasureResult(run_secs=(1.0, 1.0, 1.0)) if c.remeasure
                      else MeasureResult.failure(ErrorKind.WRONG_RESULT, "bad") for c in batch])
    assert drop.position == (1,) and drop.moves == 0


def test_register_tiles_are_measured_first_then_the_neighbours():
    space = GridSpace((5, 5), 10)
    jumps = [(0, 0), (9, 9), (2, 2)]
    drop = Raindrop(space, make((5, 5)), (1e-3,) * 5, budget=50, config=RaindropConfig(batch_size=8),
                    register_tiles=jumps)
    first = [c.position for c in drop.propose() if not c.remeasure]
    assert set(first[:3]) == set(jumps)  # the jumps first
    assert drop.radius == 0
    # the batch is filled up with the neighbours at radius 1 (a grid point has 4 of them)
    assert sorted(first[3:]) == [(4, 5), (5, 4), (5, 6), (6, 5)]
    batch = [make(p) for p in first]
    drop.tell(batch, [MeasureResult(run_secs=(2e-3,) * 5)] * len(batch))  # none is faster
    assert drop.budget == 50 - 7 and drop.radius == 1
    # radius 1 is spent, so the next batch is radius 2: no radius skipped, nothing measured twice
    second = [c.position for c in drop.propose() if not c.remeasure]
    assert drop.radius == 2
    assert sorted(second[:4]) == [(3, 5), (5, 3), (5, 7), (7, 5)]  # (then topped up from radius 3)


def test_a_short_batch_is_topped_up_from_the_next_radius():
    drop = Raindrop(GridSpace((5, 5), 10), make((5, 5)), (1e-3,) * 5, budget=50, config=RaindropConfig(batch_size=8))
    batch = [c.position for c in drop.propose() if not c.remeasure]
    assert len(batch) == 8  # 4 at radius 1, then 4 at radius 2 (it used to send the 4 alone)
    assert sorted(batch[:4]) == [(4, 5), (5, 4), (5, 6), (6, 5)]
    assert sorted(batch[4:]) == [(3, 5), (5, 3), (5, 7), (7, 5)]


def test_neighbours_left_unmeasured_by_a_move_come_back():
    """On a line, start 5, one neighbour a batch: the first neighbour measured (4 or 6) wins; the
    other one was generated but never measured. It is 2 away from the new position, so the
    search must still measure it (it used to stay marked as seen and was never proposed)."""
    drop = Raindrop(GridSpace((5,), 10), make((5,)), (1e-3,) * 5, budget=100, config=RaindropConfig(batch_size=1))
    first = [c for c in drop.propose() if not c.remeasure]
    winner = first[0].position
    other = (10 - winner[0],)
    drop.tell(first, [MeasureResult(run_secs=(5e-4, 5.1e-4, 4.9e-4, 5e-4, 5.05e-4))])
    assert drop.position == winner and drop.moves == 1
    measured = []
    while (batch := drop.propose()) is not None:
        measured += [c.position for c in batch if not c.remeasure]
        drop.tell(batch, [MeasureResult(run_secs=(5e-4,) * 5) if c.remeasure else MeasureResult(run_secs=(2e-3,) * 5)
                          for c in batch])
    assert other in measured
    assert len(measured) == len(set(measured))


def test_a_faster_register_tile_becomes_the_incumbent():
    space = GridSpace((5, 5), 10)
    drop = Raindrop(space, make((5, 5)), (1e-3,) * 5, budget=50, register_tiles=[(1, 1)])
    batch = drop.propose()
    drop.tell(batch, [MeasureResult(run_secs=(1e-3,) * 5) if c.remeasure else MeasureResult(
        run_secs=(5e-4, 5.1e-4, 4.9e-4, 5e-4, 5.05e-4)) for c in batch])
    assert drop.position == (1, 1) and drop.radius == 1 and drop.moves == 1


def test_register_tiles_can_be_turned_off():
    drop = Raindrop(GridSpace((5, 5), 10), make((5, 5)), (1e-3,) * 5, budget=50,
                    config=RaindropConfig(register_tiles=0), register_tiles=[(1, 1)])
    assert all((1, 1) != c.position for c in drop.propose() if not c.remeasure)


def test_unroll_depths_come_first_then_the_register_tiles():
    space = GridSpace((5, 5), 10)
    depths, jumps = [(5, 0), (5, 9)], [(0, 0), (9, 9), (2, 2)]
    on = RaindropConfig(batch_size=8, unroll_jumps=True)
    drop = Raindrop(space, make((5, 5)), (1e-3,) * 5, budget=50, config=on, register_tiles=jumps, unroll_depths=depths)
    first = [c.position for c in drop.propose() if not c.remeasure]
    assert set(first[:2]) == set(depths) and set(first[2:5]) == set(jumps) and drop.radius == 0
    off = Raindrop(space, make((5, 5)), (1e-3,) * 5, budget=50, register_tiles=jumps, unroll_depths=depths)
    assert not set(depths) & {c.position for c in off.propose() if not c.remeasure}  # the default: off
    alone = Raindrop(space, make((5, 5)), (1e-3,) * 5, budget=50, config=on, unroll_depths=depths)  # no tiles
    assert {c.position for c in alone.propose() if not c.remeasure} >= set(depths) and alone.radius == 0


def test_the_unroll_depths_of_a_real_schedule_are_each_other_value_of_its_categorical_decisions():
    from stormdrop.search.sketches import Sketches
    from stormdrop.search.space import DecisionSpace
    from stormdrop.target import host_target
    from stormdrop.workloads import parse_kernel

    mod = parse_kernel("matmul:M=64,N=64,K=64").mod
    sketches = Sketches(mod, host_target(), seed=0)
    space = DecisionSpace(mod, sketches.postprocs, sketches.spaces()[0].trace, 2)
    cats = [k for k, c in enumerate(space.coordinates) if c.kind == "categorical"]
    assert cats  # MetaSchedule's unroll depth
    depths = space.unroll_depths(space.start)
    assert len(depths) == sum(space.coordinates[k].size - 1 for k in cats)
    for change, p in depths:
        changed = [k for k in range(len(p)) if p[k] != space.start[k]]
        assert len(changed) == 1 and changed[0] in cats
        assert change == p[changed[0]] - space.start[changed[0]]
        assert space.apply(p) is not None  # each one a schedule


def test_stored_results_cost_the_budget_nothing():
    """A neighbour whose result was stored already (a killed run's, the storm's) is told as not fresh:
    the budget pays only for what was measured for the batch, so a resumed run measures as many."""
    space = GridSpace((4, 4), 9)
    drop = Raindrop(space, make((4, 4)), (1.0,) * 5, budget=4, config=RaindropConfig(batch_size=4))
    batch = drop.propose()
    neighbours = [c for c in batch if not c.remeasure]
    results = [MeasureResult(run_secs=(1.0,) * 5) for _ in batch]
    fresh = [not c.remeasure and c is not neighbours[0] and c is not neighbours[1] for c in batch]
    drop.tell(batch, results, fresh)
    assert drop.budget == 4 - sum(fresh) == 2 and not drop.done
    batch = drop.propose()
    drop.tell(batch, [MeasureResult(run_secs=(1.0,) * 5)] * len(batch))  # default: all fresh
    assert drop.done
