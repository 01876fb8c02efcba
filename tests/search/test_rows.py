"""The row-vector sketch of a copy-like kernel (search/rows.py): a channel shuffle's rows as vectors."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from stormdrop.search import rows
from stormdrop.search.sketches import Sketches
from stormdrop.target import host_target


def _shuffle(side: int) -> tvm.IRModule:
    """ShuffleNetV2's block end as a CPU model lowers it: one half NCHW, the other NHWC, concatenated,
    then the channels of the two groups interleaved (reshape, transpose, reshape)."""
    half = 58
    a = te.placeholder((1, half, side, side), name="a")
    b = te.placeholder((1, side, side, half), name="b")
    both = topi.concatenate([a, topi.transpose(b, (0, 3, 1, 2))], axis=1)
    grouped = topi.reshape(both, (1, 2, half, side, side))
    out = topi.reshape(topi.transpose(grouped, (0, 2, 1, 3, 4)), (1, 2 * half, side, side))
    return tvm.IRModule({"main": te.create_prim_func([a, b, out])})


def _run(mod: tvm.IRModule) -> np.ndarray:
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.uniform(-1, 1, [int(x) for x in a.shape]).astype("float32"))
            for a in ArgInfo.from_prim_func(mod["main"])]
    tvm.build(mod, target=host_target())["main"](*args)
    return args[-1].numpy()


def test_a_shuffle_is_vectorized_along_its_rows_and_computes_the_same_values():
    mod = _shuffle(14)
    sch = rows.space(mod, 16)
    assert sch is not None
    text = sch.mod.script()
    assert "T.vectorized(T.int64(14))" in text or "T.vectorized(14)" in text
    assert "T.parallel" in text
    np.testing.assert_array_equal(_run(sch.mod), _run(mod))


@pytest.mark.parametrize("side", [16, 2, 80])  # whole vectors across rows already; too short; too long
def test_rows_whose_vectors_need_no_sketch_of_their_own_get_none(side):
    assert rows.space(_shuffle(side), 16) is None


def test_a_kernel_with_a_reduction_gets_none():
    x = te.placeholder((14, 14), name="x")
    k = te.reduce_axis((0, 14), "k")
    total = te.compute((14,), lambda i: te.sum(x[i, k], axis=k), name="total")
    assert rows.space(tvm.IRModule({"main": te.create_prim_func([x, total])}), 16) is None


def test_the_sketches_hold_it_on_a_cpu_unless_turned_off():
    mod = _shuffle(7)
    with_rows = Sketches(mod, host_target(), seed=0).spaces()
    without = Sketches(mod, host_target(), seed=0, row_vectors=False).spaces()
    assert len(with_rows) == len(without) + 1
    assert any("T.vectorized(T.int64(7))" in s.mod.script() or "T.vectorized(7)" in s.mod.script()
               for s in with_rows)
