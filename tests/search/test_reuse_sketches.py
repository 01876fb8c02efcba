"""Reuse into the sketches: a donor's decisions in each of a workload's design spaces (reuse.in_sketches),
and the transfers that stop at the donor that fills the budget."""

from __future__ import annotations

import math

import numpy as np
from test_reuse import _conv_epilogue, _run, _stored_best

from stormdrop.search.sketches import make_context
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.tvm_compat.trace_json import trace_to_json
from stormdrop.workloads import kernel_args, parse_kernel


def test_a_donors_decisions_move_into_every_sketch_and_the_kernels_compute_right():
    """A conv + ReLU donor computed apart from its tiles (its own sketch) gives a conv + ReLU6 of
    another shape its tile sizes in each of that workload's sketches: the one that computes the
    epilogue inside the tiles (ReverseComputeAt) too. Every kernel computes the right answer, and
    every tile is the donor's refitted to the new extents."""
    from stormdrop.search.reuse import in_sketches

    donor = _conv_epilogue(16, 14, residual=False, act="relu")
    target = _conv_epilogue(24, 10, residual=False, act="relu6")
    ctx = make_context(target, host_target(), seed=0)
    spaces = ctx.generate_design_space()
    donor_spaces = make_context(donor, host_target(), seed=1).generate_design_space()
    apart = next(s for s in donor_spaces if not any(i.kind.name == "ReverseComputeAt" for i in s.trace.insts))
    donor_json = trace_to_json(apart.trace)
    moved = in_sketches(donor, donor_json, target, spaces, ctx.space_generator.postprocs)
    assert len(moved) == len(spaces) >= 2
    assert any(any(i.kind.name == "ReverseComputeAt" for i in s.trace.insts) for s in moved)
    donor_tiles = [[int(x) for x in apart.trace.decisions[i]] for i in apart.trace.insts
                   if i.kind.name == "SamplePerfectTile"]
    for k, sch in enumerate(moved):
        tiles = [[int(x) for x in sch.trace.decisions[i]] for i in sch.trace.insts
                 if i.kind.name == "SamplePerfectTile"]
        assert len(tiles) == len(donor_tiles)
        for old, new in zip(donor_tiles, tiles):
            assert new == old or math.prod(old) != math.prod(new)  # kept where it fits, refitted elsewhere
        rng = np.random.default_rng(k)
        args = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in kernel_args(target)]
        np.testing.assert_allclose(_run(sch.mod, [a.copy() for a in args]), _run(target, [a.copy() for a in args]),
                                   rtol=1e-4, atol=1e-4)


def test_transfers_stop_at_the_donor_that_fills_the_budget(tmp_path):
    """With sketches each donor gives several transfers: once the groups hold ``enough``, no further
    donor is replayed (each costs a replay and the postprocessors)."""
    from stormdrop.search.reuse import transfers
    from stormdrop.target import canonical

    with Database(tmp_path / "d.db") as db:
        _stored_best(db, parse_kernel("matmul:M=64,N=64,K=64"), "matmul")
        _stored_best(db, parse_kernel("matmul:M=32,N=64,K=96"), "matmul")
        kernel = parse_kernel("matmul:M=48,N=80,K=64")
        entry = db.commit_workload(kernel.mod, name=kernel.name, op_class="matmul", flops=kernel.flops)
        ctx = make_context(kernel.mod, host_target(), seed=0)
        spaces, post = ctx.generate_design_space(), ctx.space_generator.postprocs
        every = transfers(db, entry, canonical(host_target()), post, spaces=spaces)
        first = transfers(db, entry, canonical(host_target()), post, spaces=spaces, enough=2)
        # sketch_donors=1: the nearest donor in every sketch, the next one as it transfers
        mixed = transfers(db, entry, canonical(host_target()), post, spaces=spaces, sketch_donors=1)
    assert len(every) == 2 and all(len(g) >= 2 for g in every)
    assert len(first) == 1 and [c.key for c in first[0]] == [c.key for c in every[0]]
    assert [len(g) for g in mixed] == [len(every[0]), 1] and mixed[1][0].key == every[1][0].key
