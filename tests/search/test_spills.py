"""Spills as LLVM compiles a candidate (``search.spills``), and reuse passing over transfers that spill
(``StormConfig.spill_veto``): the next transfer that does not, else the least spilling one unrolled less."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import tvm
from tvm import te
from tvm.s_tir import Schedule
from tvm.target import Target

from stormdrop.search import reuse_phase, spills
from stormdrop.search.reuse_phase import Reuse
from stormdrop.search.storm import StormConfig

ZEN4 = Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})  # AVX-512: 32 vector registers


def _matmul(rows: int, vectors: int) -> tvm.IRModule:
    """A 64x256x64 matmul whose register tile is ``rows`` x ``vectors`` 16-wide vectors, unrolled
    with its inner reduction: rows x vectors accumulators and 8 x vectors weight vectors live."""
    a = te.placeholder((64, 64), name="A")
    b = te.placeholder((64, 256), name="B")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((64, 256), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    sch = Schedule(tvm.IRModule({"main": te.create_prim_func([a, b, c])}))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    i0, i1 = sch.split(i, [None, rows])
    j0, j1, j2 = sch.split(j, [None, vectors, 16])
    k0, k1 = sch.split(kk, [None, 8])
    sch.reorder(i0, j0, k0, i1, k1, j1, j2)
    for loop in (i1, k1, j1):
        sch.unroll(loop)
    sch.vectorize(j2)
    return sch.mod


@pytest.mark.slow
def test_a_register_tile_larger_than_the_register_file_spills_and_a_small_one_does_not():
    big = spills.vector_spills(_matmul(16, 8), ZEN4)  # 128 accumulators + 64 weight vectors
    small = spills.vector_spills(_matmul(2, 2), ZEN4)  # 4 + 16
    assert big is not None and small is not None
    assert big > 200 > 20 > small
    assert spills.vector_spills(_matmul(2, 2), Target({"kind": "cuda", "arch": "sm_80"})) is None  # not a CPU


class _Fake(SimpleNamespace):
    pass


def _reuse(monkeypatch, counts: dict[str, int], veto: int = 200) -> Reuse:
    monkeypatch.setattr(spills, "vector_spills", lambda mod, target: counts[mod])
    reuse = Reuse(None, SimpleNamespace(name="task"), "llvm", SimpleNamespace(target=ZEN4), None, budget=1,
                  config=replace(StormConfig(), spill_veto=veto))
    monkeypatch.setattr(reuse, "_unrolled_less", lambda c, n: _Fake(key=c.key + " unrolled less", mod=c.mod))
    return reuse


def _pool(*keys: str) -> list:
    return [_Fake(key=k, mod=k) for k in keys]


def test_a_spilling_transfer_gives_way_to_the_next_that_does_not(monkeypatch):
    reuse = _reuse(monkeypatch, {"t0": 900, "t1": 6, "t2": 8})
    assert [c.key for c in reuse._unspilled(_pool("t0", "t1", "t2"), 1, set())] == ["t1"]
    assert [c.key for c in reuse._unspilled(_pool("t0", "t1", "t2"), 2, set())] == ["t1", "t2"]
    # at the threshold a transfer stays; this very workload's schedule (the hub's) is never checked
    assert [c.key for c in _reuse(monkeypatch, {"t0": 200}).
            _unspilled(_pool("t0", "t1"), 1, set())] == ["t0"]
    assert [c.key for c in reuse._unspilled(_pool("t0", "t1"), 1, {"t0"})] == ["t0"]


def test_where_every_transfer_spills_the_least_spilling_is_unrolled_less(monkeypatch):
    reuse = _reuse(monkeypatch, {"t0": 900, "t1": 300, "t2": 2000})
    assert [c.key for c in reuse._unspilled(_pool("t0", "t1", "t2"), 1, set())] == ["t1 unrolled less"]
    assert [c.key for c in reuse._unspilled(_pool("t0", "t1", "t2"), 2, set())] == ["t1 unrolled less",
                                                                                      "t0 unrolled less"]


@pytest.mark.slow
def test_a_spilling_candidate_unrolled_less_spills_less():
    """``_unrolled_less`` on a candidate of the space: a 16 x 64 innermost tile unrolled whole (64
    accumulators) spills; stepping its unroll depth down (then register tiles) until LLVM spills no
    more than the veto gives a candidate of the same workload that spills less."""
    from stormdrop.records import Phase
    from stormdrop.search.sketches import Sketches
    from stormdrop.search.space import Candidate, DecisionSpace
    from stormdrop.workloads import parse_kernel

    mod = parse_kernel("matmul:M=64,N=256,K=64").mod
    sketches = Sketches(mod, ZEN4, seed=0)
    sch = sketches.spaces()[0]
    space = DecisionSpace(mod, sketches.postprocs, sch.trace, 2)
    tiles = [k for k, c in enumerate(space.coordinates) if c.kind == "tile" and c.size == 4]
    unroll = [k for k, c in enumerate(space.coordinates) if c.kind == "categorical"]
    assert len(tiles) >= 2 and unroll
    position = list(space.start)
    position[tiles[0]], position[tiles[1]] = (2, 2, 1, 16), (2, 2, 1, 64)
    position[unroll[0]] = space.coordinates[unroll[0]].size - 1  # the deepest unroll
    spilling = space.apply(tuple(position), phase=Phase.REUSE)
    assert isinstance(spilling, Candidate)
    before = spills.vector_spills(spilling.mod, ZEN4)
    assert before > 200
    reuse = Reuse(None, SimpleNamespace(name="matmul"), "llvm", sketches, None, budget=1,
                  config=replace(StormConfig(), spill_veto=200))
    repaired = reuse._unrolled_less(spilling, before)
    assert repaired is not spilling and repaired.phase == Phase.REUSE
    assert spills.vector_spills(repaired.mod, ZEN4) < before
    assert reuse_phase.REGISTER_TILES > 0


def _unroll_step(mod: tvm.IRModule) -> int:
    """The auto-unroll depth a postprocessed schedule's kernel carries (0: none)."""
    import re

    found = re.search(r'"pragma_auto_unroll_max_step": (\d+)', mod.script())
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("counts,want", [({0: 300, 16: 300, 64: 300, 512: 5}, 512),  # deeper spills least
                                         ({0: 40, 16: 40, 64: 400, 512: 400}, 16),  # the deepest of the least
                                         ({0: 300, 16: 300, 64: 300, 512: 250}, None)])  # within the margin
def test_a_transfer_that_spills_at_its_unroll_depth_is_taken_at_the_deepest_that_spills_least(monkeypatch, counts,
                                                                                               want):
    """``Reuse._unroll_fitted`` (``StormConfig.unroll_spills``): a transfer spilling more than the margin
    above another unroll depth's kernel is replaced by the deepest depth within the margin of the least."""
    from stormdrop.records import Phase
    from stormdrop.search.sketches import Sketches
    from stormdrop.search.space import Candidate, DecisionSpace
    from stormdrop.workloads import parse_kernel

    mod = parse_kernel("matmul:M=64,N=256,K=64").mod
    sketches = Sketches(mod, ZEN4, seed=0)
    space = DecisionSpace(mod, sketches.postprocs, sketches.spaces()[0].trace, 2)
    unroll = next(k for k, c in enumerate(space.coordinates) if c.kind == "categorical")
    start = space.apply(space.start[:unroll] + (2,) + space.start[unroll + 1:], phase=Phase.REUSE)  # depth 64
    assert isinstance(start, Candidate) and _unroll_step(start.mod) == 64
    monkeypatch.setattr(spills, "vector_spills", lambda m, target: counts[_unroll_step(m)])
    reuse = Reuse(None, SimpleNamespace(name="matmul"), "llvm", sketches, None, budget=1,
                  config=replace(StormConfig(), unroll_spills=150))
    fitted = reuse._unroll_fitted(start)
    if want is None:
        assert fitted is start
    else:
        assert fitted is not start and _unroll_step(fitted.mod) == want and fitted.phase == Phase.REUSE
