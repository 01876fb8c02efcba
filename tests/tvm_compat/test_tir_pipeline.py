"""stormdrop's TIR pipeline: vector loops that cross a row are split into vectors within a row,
and every kernel stormdrop builds (candidates, compiled models) goes through it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te

from stormdrop.tvm_compat import tir_pipeline
from stormdrop.tvm_compat.tir_pipeline import pipeline, split_row_vectors


def _relu(shape: tuple[int, ...], lanes: int = 64) -> tvm.IRModule:
    """A ReLU scheduled as MetaSchedule's post-processor does: all loops fused, ``lanes`` split off
    and vectorized, the rest parallel."""
    a = te.placeholder(shape, name="a")
    b = te.compute(shape, lambda *i: te.max(a(*i), 0.0), name="b")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b]))
    outer, inner = sch.split(sch.fuse(*sch.get_loops(sch.get_sblock("b"))), [None, lanes])
    sch.parallel(outer)
    sch.vectorize(inner)
    return sch.mod


def _vector_loops(func: tvm.tirx.PrimFunc) -> list[str]:
    return [line.strip() for line in func.script().splitlines() if "T.vectorized(" in line]


def test_a_vector_loop_across_rows_becomes_vectors_within_a_row_and_computes_the_same():
    mod = _relu((1, 56, 56, 144))  # 64 lanes over rows of 144: 16 | 144
    split = split_row_vectors(mod["main"])
    assert [line.split(" in ")[1] for line in _vector_loops(split)] == ["T.vectorized(16):"]
    x = np.random.default_rng(0).standard_normal((1, 56, 56, 144)).astype("float32")
    for name in ("default", pipeline()):
        lib = tvm.compile(mod, target="llvm", tir_pipeline=name)
        ll = lib.mod.inspect_source("ll")
        # TVM's own lowering loads and stores the 64 lanes one by one; split, whole 16-lane vectors
        assert (ll.count("load float,"), ll.count("load <16 x float>") > 0) == ((64, False) if name == "default"
                                                                               else (0, True))
        out = tvm.runtime.tensor(np.zeros_like(x))
        lib.mod["main"](tvm.runtime.tensor(x), out)
        np.testing.assert_array_equal(out.numpy(), np.maximum(x, 0))


@pytest.mark.parametrize("shape, lanes", [((1, 56, 56, 128), 64), ((1, 112, 112, 32), 64), ((1, 197, 197), 197),
                                          ((1, 7, 7, 786), 64)])
def test_vector_loops_within_rows_or_too_narrow_to_split_are_left_as_they_are(shape, lanes):
    # rows of 128 and 32 hold whole 64-lane vectors or are held whole by them; a row of 197 is
    # one vector; 64 lanes over rows of 786 would split into 2 lanes, below MIN_LANES
    func = _relu(shape, lanes)["main"]
    assert split_row_vectors(func).same_as(func)


def test_the_builders_and_the_compiled_model_lower_through_it(monkeypatch, tmp_path):
    from stormdrop.measure import _worker
    from stormdrop.model.run import compile_model

    seen = []
    real = tir_pipeline.split_row_vectors
    monkeypatch.setattr(tir_pipeline, "split_row_vectors", lambda f: seen.append(f) or real(f))
    mod = _relu((1, 56, 56, 144))
    built = _worker._build(tvm.target.Target("llvm"), tvm.ir.save_json(mod), str(tmp_path / "k.so"))
    assert built["timed"] == str(tmp_path / "k.so") and len(seen) == 1

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 8, 144), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(x)))
        bb.emit_func_output(out)
    legal = relax.transform.LegalizeOps()(bb.get())
    compile_model(legal, tvm.s_tir.meta_schedule.database.MemoryDatabase(), tvm.target.Target("llvm"))
    assert len(seen) > 1
