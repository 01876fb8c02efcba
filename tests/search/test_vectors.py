"""A CPU schedule's reductions with and without vector loops (``search.vectors``), and reuse giving a
transfer that has none whole vectors on its output's last axis (``StormConfig.vector_veto``)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import tvm

from stormdrop.records import MeasureResult, Phase, Record
from stormdrop.search.reuse_phase import Reuse
from stormdrop.search.sketches import Sketches
from stormdrop.search.space import Candidate, DecisionSpace
from stormdrop.search.storm import StormConfig
from stormdrop.search.vectors import unvectorized
from stormdrop.storage.database import Database
from stormdrop.target import canonical, host_target
from stormdrop.workloads import kernel_args, parse_kernel

AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
# MnasNet's 1x1 expansion at a 124 input: 16 -> 48 channels at 62x62, NHWC, its width padded to 63
# (lowering.padded_width)
POINTWISE = "conv2d:N=1,C=16,H=62,W=63,K=48,R=1,S=1,layout=NHWC"


def _tiled(spec: str, tiles: dict[int, tuple]) -> tuple:
    """``spec``'s first sketch with its 4-level tiles (n, h, w, c: by index) set as given: the
    candidate and the decision space around it."""
    kernel = parse_kernel(spec)
    sketches = Sketches(kernel.mod, tvm.target.Target(AVX512), seed=0)
    space = DecisionSpace(kernel.mod, sketches.postprocs, sketches.spaces()[0].trace, 2)
    four = [k for k, c in enumerate(space.coordinates) if c.kind == "tile" and c.size == 4]
    position = list(space.start)
    for axis, factors in tiles.items():
        position[four[axis]] = factors
    cand = space.apply(tuple(position), phase=Phase.STORM)
    assert isinstance(cand, Candidate), f"{tiles} does not apply"
    return kernel, cand, DecisionSpace(kernel.mod, sketches.postprocs, cand.sch.trace, 2)


def _run(mod, args):
    lib = tvm.build(mod, target="llvm")
    dev = tvm.cpu(0)
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    lib["main"](*tensors)
    return tensors[-1].numpy()


def _right(kernel, mod) -> None:
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in kernel_args(kernel.mod)]
    np.testing.assert_allclose(_run(mod, [a.copy() for a in args]), _run(kernel.mod, [a.copy() for a in args]),
                               rtol=1e-4, atol=1e-4)


def test_a_product_tiled_along_its_channels_runs_as_vectors():
    _, cand, _ = _tiled(POINTWISE, {1: (2, 31, 1, 1), 2: (7, 1, 1, 9), 3: (1, 3, 1, 16)})
    assert unvectorized(cand.mod) == []


def test_a_product_whose_channel_tile_is_1_runs_without_vectors():
    """The transfer reuse gave MnasNet's expansion at 124 (a donor's tiles refitted): 31 rows innermost
    and one channel, so the postprocessor finds no contiguous loop to vectorize."""
    kernel, cand, space = _tiled(POINTWISE, {1: (2, 1, 1, 31), 2: (63, 1, 1, 1), 3: (1, 3, 16, 1)})
    names = unvectorized(cand.mod)
    assert len(names) == 1 and "conv2d_nhwc" in names[0]
    _right(kernel, cand.mod)
    # its register tiles keep what they can of its parallel loop and run as vectors
    kept = space.register_tiles(space.start, 16, nearest_parallel=True)
    assert len(kept) > len(space.register_tiles(space.start, 16))
    assert all(unvectorized(space.apply(p).mod) == [] for p in kept[:3])


@pytest.mark.parametrize("veto", [True, False])
def test_the_reuse_phase_gives_a_transfer_without_vectors_whole_vectors(tmp_path, veto):
    """A donor 1x1 convolution tiled 28 rows by one channel innermost (no vector loop), transferred
    to MnasNet's 62x63 expansion: with ``vector_veto`` (the default) the transfer takes a register
    tile with whole 16-lane vectors along the channels, and computes right."""
    donor, cand, _ = _tiled("conv2d:N=1,C=16,H=56,W=56,K=48,R=1,S=1,layout=NHWC",
                            {1: (2, 1, 1, 28), 2: (56, 1, 1, 1), 3: (1, 3, 16, 1)})
    assert unvectorized(cand.mod)
    kernel = parse_kernel(POINTWISE)
    key = canonical(host_target())
    with Database(tmp_path / "d.db") as db:
        entry = db.commit_workload(donor.mod, name=donor.name, op_class="conv2d_nhwc", flops=donor.flops)
        db.commit_record(Record(entry.workload_id, key, cand.key, cand.trace_json, "[]",
                                MeasureResult(run_secs=(1e-4,) * 3), Phase.STORM, 0.0))
        target = db.commit_workload(kernel.mod, name=kernel.name, op_class="conv2d_nhwc", flops=kernel.flops)
        config = StormConfig() if veto else replace(StormConfig(), vector_veto=False)
        reuse = Reuse(db, target, key, Sketches(kernel.mod, tvm.target.Target(AVX512), seed=0),
                      SimpleNamespace(ranks=False), budget=1, config=config)
        (moved,) = reuse.propose()
    assert moved.phase is Phase.REUSE
    assert (unvectorized(moved.mod) == []) is veto
    _right(kernel, moved.mod)
