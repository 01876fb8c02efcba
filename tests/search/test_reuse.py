"""Reuse (transfer-tuning): refitting tile factors, replaying donors' traces, the reuse phase end to end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm

from stormdrop.records import Phase
from stormdrop.search.options import SearchOptions
from stormdrop.search.reuse import nearest_factorization, transfer
from stormdrop.search.sketches import make_context
from stormdrop.search.storm import StormConfig
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions
from stormdrop.tvm_compat.trace_json import to_py, trace_to_json
from stormdrop.workloads import kernel_args, parse_kernel


@pytest.mark.parametrize("old,extent,inner", [([1, 2, 4, 8], 64, 64), ([2, 2, 7, 1], 14, 64), ([8, 8], 96, 64),
                                              ([1, 1, 64, 1], 48, 64), ([3, 1], 5, 64), ([1, 4, 16], 60, 8),
                                              ([7, 1, 1, 1], 1, 64)])
def test_nearest_factorization_is_a_valid_split(old, extent, inner):
    new = nearest_factorization(old, extent, inner)
    assert len(new) == len(old) and math.prod(new) == extent
    assert new[-1] <= inner


def test_nearest_factorization_keeps_what_fits_and_stays_close():
    assert nearest_factorization([1, 2, 4, 8], 64, 64) == [1, 2, 4, 8]  # already valid: unchanged
    assert nearest_factorization([4, 2, 4, 8], 48, 64) == [1, 2, 3, 8]  # inner factors kept, outer absorbs
    assert nearest_factorization([1, 1, 1, 32], 96, 16)[-1] == 16  # max innermost factor respected


def _run(mod, args_np):
    ex = tvm.compile(mod, target=host_target())
    arrs = [tvm.runtime.tensor(a) for a in args_np]
    ex["main"](*arrs)
    return arrs[-1].numpy()


def test_transferred_conv_schedule_replays_and_computes_the_right_answer():
    donor = parse_kernel("conv2d:N=1,C=16,H=14,W=14,K=32,R=3,S=3,stride=1,pad=1")
    target = parse_kernel("conv2d:N=1,C=24,H=10,W=10,K=20,R=3,S=3,stride=1,pad=1")
    ctx = make_context(donor.mod, host_target(), seed=0)
    spaces = ctx.generate_design_space()
    postprocs = ctx.space_generator.postprocs
    moved = 0
    for space in spaces:
        text = trace_to_json(space.trace)
        sch = transfer(donor.mod, text, target.mod, postprocs)
        if sch is None:
            continue
        moved += 1
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in kernel_args(target.mod)]
        want = _run(target.mod, [a.copy() for a in args])
        np.testing.assert_allclose(_run(sch.mod, [a.copy() for a in args]), want, rtol=1e-4, atol=1e-4)
    assert moved >= 1


def _stored_best(db, kernel, op_class, seed=0):
    """``kernel`` in ``db`` under ``op_class`` with one (fake-timed) record: a design-space sample."""
    from stormdrop.records import MeasureResult, Record
    from stormdrop.search.space import Candidate
    from stormdrop.target import canonical

    entry = db.commit_workload(kernel.mod, name=kernel.name, op_class=op_class, flops=kernel.flops)
    sch = make_context(kernel.mod, host_target(), seed=seed).generate_design_space()[0]
    cand = Candidate.from_schedule(sch, Phase.STORM)
    db.commit_record(Record(entry.workload_id, canonical(host_target()), cand.key, cand.trace_json, "[]",
                            MeasureResult(run_secs=(1e-4,) * 3), Phase.STORM, 0.0))
    return entry


def test_a_donor_that_does_not_transfer_gives_its_place_to_the_next(tmp_path):
    """With one donor allowed, the nearest (a dense labelled as a matmul: its trace names
    blocks a matmul lacks) fails to transfer; the next-nearest matmul takes its place (it
    used to leave the reuse phase empty)."""
    from stormdrop.search.reuse import transfers
    from stormdrop.target import canonical

    with Database(tmp_path / "d.db") as db:
        _stored_best(db, parse_kernel("matmul:M=64,N=64,K=64"), "matmul")
        _stored_best(db, parse_kernel("dense:M=48,N=80,K=64"), "matmul")  # the same FLOPs as the target
        kernel = parse_kernel("matmul:M=48,N=80,K=64")
        entry = db.commit_workload(kernel.mod, name=kernel.name, op_class="matmul", flops=kernel.flops)
        postprocs = make_context(kernel.mod, host_target(), seed=0).space_generator.postprocs
        cands = [g[0] for g in transfers(db, entry, canonical(host_target()), postprocs, limit=1)]
    assert len(cands) == 1 and cands[0].phase is Phase.REUSE
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in kernel_args(kernel.mod)]
    np.testing.assert_allclose(_run(cands[0].sch.mod, [a.copy() for a in args]),
                               _run(kernel.mod, [a.copy() for a in args]), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_reuse_phase_measures_transfers_from_a_same_class_kernel(tmp_path):
    db = tmp_path / "r.db"
    tune_kernel("matmul:M=64,N=64,K=64", KernelOptions(trials=8, exploit_trials=0, seed=0), db=db)
    task = tune_kernel("matmul:M=48,N=80,K=64", KernelOptions(trials=8, exploit_trials=0, seed=0), db=db).tasks[0]
    assert task.verified
    # one donor: its best schedule transferred, and its decisions in each of the matmul's 3 sketches
    assert task.trials["reuse"] == 4
    assert task.trials["storm"] == 4  # reuse is part of the trial budget
    with Database(db) as d:
        entry = d.find_workload(parse_kernel("matmul:M=48,N=80,K=64").mod)
        phases = [r.phase for r in d.records(entry.workload_id)]
    assert phases.count(Phase.REUSE) == 4
    # without the sketches: each donor's best schedule alone (both matmuls of that database)
    alone = tune_kernel("matmul:M=48,N=80,K=64",
                        KernelOptions(trials=8, exploit_trials=0, seed=0,
                                      search=SearchOptions(storm=StormConfig(transfer_sketches=False), reuse_from=[db])),
                        db=tmp_path / "alone.db").tasks[0]
    # (the same workload's stored best and the other matmul's transferred best can be one schedule: measured once)
    assert alone.trials["reuse"] in (1, 2) and alone.trials["reuse"] + alone.trials["storm"] == 8
    # A kernel of another class gets nothing to reuse.
    other = tune_kernel("dense:M=16,N=16,K=16", KernelOptions(trials=4, exploit_trials=0, seed=0), db=db).tasks[0]
    assert other.trials["reuse"] == 0


def _digest(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def donor_db(tmp_path_factory):
    """A database holding tuned matmuls (the donors), closed."""
    db = tmp_path_factory.mktemp("donor") / "donor.db"
    tune_kernel("matmul:M=64,N=64,K=64", KernelOptions(trials=8, exploit_trials=0, seed=0), db=db)
    tune_kernel("matmul:M=32,N=64,K=96", KernelOptions(trials=8, exploit_trials=0, seed=0), db=db)
    return db


def test_a_kernels_class_follows_its_blocks_layout_and_dtype_not_its_shapes():
    """Model tasks exchange schedules only within a class: the fused blocks (layout and epilogue
    included) and the dtype; shapes do not count, and donors come nearest shapes first."""
    from stormdrop.model.tune import op_class
    from stormdrop.search.donors import shape_distance

    def conv(c, h, layout="NCHW"):
        return parse_kernel(f"conv2d:N=1,C={c},H={h},W={h},K={c},R=3,S=3,stride=1,pad=1,layout={layout}").mod

    assert op_class(conv(16, 14)) == op_class(conv(32, 28))  # shapes do not count
    assert op_class(conv(16, 14)) != op_class(conv(16, 14, "NHWC"))  # layouts do
    assert op_class(conv(16, 14)) != op_class(parse_kernel("conv2d_bias_relu:N=1,C=16,H=14,W=14,K=16,R=3,S=3,"
                                                           "stride=1,pad=1").mod)  # so do epilogues
    assert op_class(conv(16, 14)).endswith(":float32")
    near, far = shape_distance(conv(16, 14), conv(16, 16)), shape_distance(conv(16, 14), conv(64, 56))
    assert 0 < near < far and shape_distance(conv(16, 14), conv(16, 14)) == 0
    assert shape_distance(conv(16, 14), parse_kernel("matmul:M=16,N=16,K=16").mod) == math.inf


def _decisions(trace):
    """(instruction kind, decision) of every sampling instruction of a trace, in order."""
    return [(inst.kind.name, to_py(trace.decisions[inst])) for inst in trace.insts if inst in trace.decisions]


def test_a_transfer_keeps_every_decision_of_the_donor_nhwc_conv_with_packed_weights():
    # NHWC convolutions with layout-free weights, as the model pipeline makes them (RewriteLayout packs them)
    donor = parse_kernel("conv2d:N=1,C=32,H=28,W=28,K=64,R=3,S=3,pad=1,layout=NHWC")
    target = parse_kernel("conv2d:N=1,C=48,H=14,W=14,K=96,R=3,S=3,pad=1,layout=NHWC")
    ctx = make_context(donor.mod, host_target(), seed=0)
    postprocs = ctx.space_generator.postprocs
    spaces = ctx.generate_design_space()
    for space in spaces:
        sch = transfer(donor.mod, trace_to_json(space.trace), target.mod, postprocs)
        assert sch is not None, "a design-space schedule of a like kernel must transfer"
        old, new = _decisions(space.trace), _decisions(sch.trace)
        old = [d for d in old if not d[0].startswith("Enter")]
        assert [k for k, _ in new][:len(old)] == [k for k, _ in old]  # none dropped, same order
        for (kind, a), (_, b) in zip(old, new):
            if kind == "SamplePerfectTile":
                assert len(a) == len(b)  # refitted to the new extents, same number of levels
            elif kind == "SampleCategorical":
                assert a == b  # unroll and the like: kept as they were
    assert len(spaces) >= 1


def _conv_epilogue(c, h, residual, act="relu"):
    """A model-style fused NHWC conv task: conv2d + bias add [+ residual add] + ReLU, SiLU, a fast
    SiLU (as fast-math legalizes it) or ReLU6 (TOPI's blocks)."""
    from tvm import te, topi

    from stormdrop.lowering.fastmath import _fast_sigmoid

    x = te.placeholder((1, h, h, c), name="x")
    w = te.placeholder((3, 3, c, c), name="w")
    b = te.placeholder((1, 1, 1, c), name="b")
    y = topi.add(topi.nn.conv2d_nhwc(x, w, 1, 1, 1), b)
    args = [x, w, b]
    if residual:
        r = te.placeholder((1, h, h, c), name="r")
        y = topi.add(y, r)
        args.append(r)
    out = {"relu": lambda: topi.nn.relu(y), "silu": lambda: topi.multiply(y, topi.sigmoid(y)),
           "fast_silu": lambda: topi.multiply(y, _fast_sigmoid(y)),
           "relu6": lambda: topi.minimum(topi.maximum(y, 0.0), 6.0)}[act]()
    return tvm.IRModule({"main": te.create_prim_func([*args, out])})


@pytest.mark.slow
@pytest.mark.parametrize("donor_act, target_act, residual, rank", [("relu", "relu", True, 1),
                                                                    ("silu", "relu6", False, 2),
                                                                    ("fast_silu", "relu6", False, 3),
                                                                    ("fast_silu", "relu", True, 3)])
def test_a_donor_with_fewer_other_or_more_epilogues_transfers_and_computes_right(donor_act, target_act, residual,
                                                                                 rank):
    """The paper's class is the main operator's: a conv + bias + ReLU schedule transfers to a conv with
    a residual add fused in too (the extra add inlined first), a conv + SiLU one to a conv + ReLU6 (the
    epilogues paired from the output back), a conv + fast SiLU one (five epilogue blocks) to a conv +
    ReLU6 (three; the donor's extra inner ones left out of its trace); each transferred kernel computes
    the right answer."""
    from stormdrop.model.tune import op_class
    from stormdrop.search.donors import related

    donor = _conv_epilogue(16, 14, residual=False, act=donor_act)
    target = _conv_epilogue(24, 10, residual=residual, act=target_act)
    assert related(op_class(donor), op_class(target)) == rank
    postprocs = make_context(target, host_target(), seed=0).space_generator.postprocs
    spaces = make_context(donor, host_target(), seed=0).generate_design_space()
    for k, space in enumerate(spaces):
        sch = transfer(donor, trace_to_json(space.trace), target, postprocs)
        assert sch is not None
        rng = np.random.default_rng(k)
        args = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in kernel_args(target)]
        np.testing.assert_allclose(_run(sch.mod, [a.copy() for a in args]), _run(target, [a.copy() for a in args]),
                                   rtol=1e-4, atol=1e-4)
    assert spaces


def test_which_classes_are_related():
    """Only kernels of one main operator and dtype exchange schedules; a donor with more epilogues
    than the task ranks last; numbers in block names do not count."""
    from stormdrop.model.tune import op_class
    from stormdrop.search.donors import related

    donor, target = _conv_epilogue(16, 14, residual=False), _conv_epilogue(24, 10, residual=True)
    assert related(op_class(target), op_class(donor)) == 3  # more epilogue blocks in the donor: last
    assert related(op_class(donor), op_class(parse_kernel("matmul:M=8,N=8,K=8").mod)) is None
    assert related("T_divide+lv224_red:float32", "T_divide+lv85_red:float32") == 0  # numbers do not count
    silu, relu6 = ("T_add+T_multiply+compute+conv2d_nhwc+pad_temp:float32",
                   "T_add+T_maximum+T_minimum+conv2d_nhwc+pad_temp:float32")
    assert related(silu, relu6) == 2 and related(silu, relu6.replace("float32", "float16")) is None
    fast_silu = "T_add+T_fast_exp+T_multiply+compute+conv2d_nhwc+pad_temp+sigmoid:float32"  # efficientnet's
    assert related(fast_silu, relu6) == 3  # 5 epilogue blocks, the task has 3
    assert related(fast_silu, relu6.replace("T_minimum", "T_minimum+T_add+T_multiply")) == 2
    assert related(silu, "T_add+conv2d_nhwc+pad_temp:float32") == 3  # more epilogues than the task has
    assert related("T_add+conv2d_nchw+pad_temp:float32", "T_add+conv2d_nhwc+pad_temp:float32") is None


def test_exact_class_donors_come_before_related_ones(tmp_path):
    from stormdrop.model.tune import op_class
    from stormdrop.search.donors import donors
    from stormdrop.target import canonical
    from stormdrop.workloads import Kernel

    def kernel(c, h, residual):
        mod = _conv_epilogue(c, h, residual)
        return Kernel(f"conv{c}x{h}{'r' if residual else ''}", "", op_class(mod), mod, 1000 * c * h)

    with Database(tmp_path / "d.db") as db:
        near = _stored_best(db, kernel(24, 10, False), kernel(24, 10, False).op_class)  # nearest, related
        far = _stored_best(db, kernel(8, 28, True), kernel(8, 28, True).op_class)  # far, same class
        t = kernel(24, 12, True)
        entry = db.commit_workload(t.mod, name=t.name, op_class=t.op_class, flops=t.flops)
        got = [w.workload_id for w, _ in donors(db, entry, canonical(host_target()))]
        by_shape = [w.workload_id for w, _ in donors(db, entry, canonical(host_target()), order="shape")]
    assert got == [far.workload_id, near.workload_id]
    assert by_shape == [near.workload_id, far.workload_id]  # order="shape": the nearest shapes first


def test_donors_best_records_are_read_only_as_far_as_a_reuse_goes(tmp_path, monkeypatch):
    from stormdrop.model.tune import op_class
    from stormdrop.search.donors import donors
    from stormdrop.target import canonical
    from stormdrop.workloads import Kernel

    def kernel(c, h):
        mod = _conv_epilogue(c, h, False)
        return Kernel(f"conv{c}x{h}", "", op_class(mod), mod, 1000 * c * h)

    key = canonical(host_target())
    with Database(tmp_path / "d.db") as db:
        stored = [_stored_best(db, kernel(c, h), kernel(c, h).op_class) for c, h in ((8, 10), (16, 10), (24, 10))]
        t = kernel(24, 12)
        entry = db.commit_workload(t.mod, name=t.name, op_class=t.op_class, flops=t.flops)
        every = list(donors(db, entry, key))
        asked = []
        best = db.best
        monkeypatch.setattr(db, "best", lambda wid, *a, **k: asked.append(wid) or best(wid, *a, **k))
        first = next(donors(db, entry, key))
    assert [w.workload_id for w, _ in every] == [s.workload_id for s in reversed(stored)]  # nearest first
    assert first[0].workload_id == every[0][0].workload_id and first[1] == every[0][1]
    assert asked == [every[0][0].workload_id]  # the nearest donor's records, no other's


@pytest.mark.slow
def test_a_resumed_run_is_not_charged_twice_for_its_transfers(tmp_path, donor_db):
    """The ledger: a run's transfers come back from the database when it is re-run with a larger
    budget, and cost nothing again (they were subtracted twice: 7 records for --trials 8)."""
    db = tmp_path / "resume.db"
    first = tune_kernel("matmul:M=48,N=80,K=64",
                        KernelOptions(trials=1, exploit_trials=0, seed=0,
                                      search=SearchOptions(reuse_from=[donor_db])),
                        db=db).tasks[0]
    assert first.trials["reuse"] == 1 and first.trials["storm"] == 0
    tune_kernel("matmul:M=48,N=80,K=64",
                KernelOptions(trials=8, exploit_trials=0, seed=0, search=SearchOptions(reuse_from=[donor_db])),
                db=db)
    with Database(db) as d:
        entry = d.find_workload(parse_kernel("matmul:M=48,N=80,K=64").mod)
        assert len(d.records(entry.workload_id)) == 8


def test_a_refitted_innermost_factor_above_the_lanes_is_whole_vectors():
    # 72 channels from a 16-wide donor tile on AVX-512: 12 (one register), not the nearer 18 (a vector
    # and two lanes, which LLVM legalizes into shuffles and spills)
    assert nearest_factorization([1, 4, 1, 16], 72, 64, lanes=16) == [2, 3, 1, 12]
    assert nearest_factorization([1, 4, 1, 16], 72, 64) == [1, 4, 1, 18]  # no lanes: nearest in log scale
    assert nearest_factorization([1, 1, 1, 64], 480, 64, lanes=16)[-1] == 48  # not 60: three whole vectors
    assert nearest_factorization([1, 1, 1, 16], 24, 64, lanes=8)[-1] == 24  # AVX2: 24 is three vectors
    assert nearest_factorization([1, 1, 1, 16], 17, 64, lanes=16)[-1] == 17  # else 1: no vector at all
    assert nearest_factorization([4, 1, 1, 12], 62, 64, lanes=16) == [2, 1, 1, 31]  # 2 or 31 rows: as before
    assert nearest_factorization([4, 1, 1, 28], 112, 64, lanes=16) == [4, 1, 1, 28]  # the extent fits: as stored


@pytest.mark.parametrize("whole_vectors,inner", [(True, 12), (False, 18), (None, 12)])
def test_the_reuse_phase_transfers_a_16_wide_vector_tile_to_72_columns_in_whole_vectors(tmp_path, whole_vectors,
                                                                                         inner):
    """A donor matmul whose vectorized (column) tile is 16 wide, transferred by the reuse phase to 72
    columns on AVX-512: with ``whole_vectors`` (the default) the column tile is 12 wide (18 without it), and
    the kernel computes right."""
    from dataclasses import replace
    from types import SimpleNamespace

    from stormdrop.records import MeasureResult, Record
    from stormdrop.search.reuse_phase import Reuse
    from stormdrop.search.sketches import Sketches
    from stormdrop.search.space import Candidate, DecisionSpace
    from stormdrop.target import canonical

    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    donor, kernel = parse_kernel("matmul:M=64,N=64,K=64"), parse_kernel("matmul:M=64,N=72,K=64")
    key = canonical(host_target())
    with Database(tmp_path / "d.db") as db:
        sketches = Sketches(donor.mod, avx512, seed=0)
        space = DecisionSpace(donor.mod, sketches.postprocs, sketches.spaces()[0].trace, 2)
        tiles = [k for k, c in enumerate(space.coordinates) if c.kind == "tile" and c.size == 4]
        position = list(space.start)
        position[tiles[0]], position[tiles[1]] = (4, 2, 1, 8), (1, 4, 1, 16)
        cand = space.apply(tuple(position), phase=Phase.STORM)
        assert isinstance(cand, Candidate)
        entry = db.commit_workload(donor.mod, name=donor.name, op_class="matmul", flops=donor.flops)
        db.commit_record(Record(entry.workload_id, key, cand.key, cand.trace_json, "[]",
                                MeasureResult(run_secs=(1e-4,) * 3), Phase.STORM, 0.0))
        target = db.commit_workload(kernel.mod, name=kernel.name, op_class="matmul", flops=kernel.flops)
        config = StormConfig() if whole_vectors is None else replace(StormConfig(), whole_vectors=whole_vectors)
        reuse = Reuse(db, target, key, Sketches(kernel.mod, avx512, seed=0), SimpleNamespace(ranks=False),
                      budget=1, config=config)
        (moved,) = reuse.propose()
    tiles = [d for kind, d in _decisions(moved.sch.trace) if kind == "SamplePerfectTile" and len(d) == 4]
    assert tiles[1][-1] == inner and math.prod(tiles[1]) == 72
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in kernel_args(kernel.mod)]
    np.testing.assert_allclose(_run(moved.sch.mod, [a.copy() for a in args]),
                               _run(kernel.mod, [a.copy() for a in args]), rtol=1e-4, atol=1e-4)
