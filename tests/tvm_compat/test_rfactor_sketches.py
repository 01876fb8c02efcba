"""CPU sketches: no rfactor of a short reduction with many outputs (a pooling window), rfactor kept
where a reduction is long or its outputs too few to parallelize."""

from __future__ import annotations

import tvm
from tvm import relax, te

from stormdrop.search.sketches import make_context
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import host_target
from stormdrop.tvm_compat.intrinsics import without_needless_rfactor

CFG = StormConfig(batch_size=4, population_size=16, genetic_num_iters=1, init_min_unmeasured=8, prior=False)


def _rfactors(spaces) -> list[bool]:
    return [any(inst.kind.name == "RFactor" for inst in sp.trace.insts) for sp in spaces]


def _max_pool(hw: int = 12, channels: int = 64) -> tvm.IRModule:
    """A 3x3 stride-1 max pool in NHWC as Relax legalizes it (padding block, pool block)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, hw, hw, channels), "float32"))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1, layout="NHWC"))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    name = next(gv for gv in mod.functions if isinstance(mod[gv], tvm.tirx.PrimFunc))
    return tvm.IRModule({"main": mod[name].with_attr("global_symbol", "main")})


def _column_sum(rows: int, cols: int) -> tvm.IRModule:
    a = te.placeholder((rows, cols), name="a")
    k = te.reduce_axis((0, cols), "k")
    s = te.compute((rows,), lambda i: te.sum(a[i, k], axis=k), name="s")
    return tvm.IRModule({"main": te.create_prim_func([a, s])})


def _spaces(mod: tvm.IRModule) -> list:
    return list(make_context(mod, host_target(2), seed=0, threads=1).generate_design_space())


def test_a_pooling_window_over_many_outputs_gets_no_rfactor_sketch():
    mod = _max_pool()
    spaces = _spaces(mod)
    assert any(_rfactors(spaces)) and not all(_rfactors(spaces))  # TVM's own rules try rfactor on it
    kept = without_needless_rfactor(spaces, mod, cores=2)
    assert kept and not any(_rfactors(kept))
    storm = Storm(mod, host_target(2), trials=4, seed=0, config=CFG)  # the storm (and reuse) draw from these
    try:
        assert storm.design_spaces() and not any(_rfactors(storm.design_spaces()))
    finally:
        storm.close()


def test_rfactor_stays_where_a_reduction_is_long_or_its_outputs_too_few():
    pool = _max_pool(hw=2, channels=4)  # 16 outputs: fewer than 16 a core on two cores
    assert any(_rfactors(without_needless_rfactor(_spaces(pool), pool, cores=2)))
    wide = _max_pool()
    assert any(_rfactors(without_needless_rfactor(_spaces(wide), wide, cores=1000)))
    long = _column_sum(256, 512)  # 512 elements an output
    spaces = _spaces(long)
    assert any(_rfactors(spaces)) and without_needless_rfactor(spaces, long, cores=2) == spaces


def test_a_symbolic_extent_leaves_the_sketches_as_they_are():
    n = te.var("n")
    a = te.placeholder((n, 4), name="a")
    k = te.reduce_axis((0, 4), "k")
    s = te.compute((n,), lambda i: te.sum(a[i, k], axis=k), name="s")
    spaces = ["a sketch"]
    assert without_needless_rfactor(spaces, tvm.IRModule({"main": te.create_prim_func([a, s])}), cores=2) is spaces
