"""A workload's reference build: the untuned loop nest every candidate's outputs are checked
against (``_worker``: builders compile it, the runner runs it once per workload).

On a CPU it is compiled at LLVM -O1 (``reference_target``) and its outermost data-parallel loops
run across the cores (``reference_module``): a model's set-up runs every task's reference before
its first candidate, and an untuned nest runs on one core at a few GFLOPS at best (the 3x3
convolutions of a VGG at 224 take seconds each). Each output element is computed by the same
statements in the same order as the serial nest (only which thread computes it changes), so the
reference's values are the serial nest's, and a loop TVM cannot prove data-parallel stays serial.

Builders compile a model's references in groups, several workloads' nests as the functions of
one library (``build_references``): linking a library costs about as much as compiling a small
nest, so one library a reference was most of a many-task model's set-up.
"""

from __future__ import annotations

from typing import Any

CHUNKS_PER_CORE = 8  # leading loops are fused until they give this many parallel chunks a core
GROUP_MAX = 16  # the most references compiled into one library
GROUPS_PER_BUILDER = 4  # smaller groups while fewer would leave a builder fewer than this many


def reference_inputs(mod: Any, seed: int) -> list[Any]:
    """Random arguments of ``mod``'s ``main``, as every candidate of it is checked on: integers in
    [0, 8), floats uniform in [-1, 1), drawn from ``seed`` in parameter order."""
    import numpy as np
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(seed)
    arrays = []
    for info in ArgInfo.from_prim_func(mod["main"]):
        shape = [int(x) for x in info.shape]
        dtype = str(info.dtype)
        if dtype.startswith(("int", "uint")):
            arrays.append(rng.integers(0, 8, size=shape).astype(dtype))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, size=shape).astype(dtype))
    return arrays


def changed_arguments(inputs: list[Any], results: list[Any]) -> list[int]:
    """The indices of a kernel's outputs: the arguments its reference run changed (``results``
    against ``inputs``), or the last argument where none changed (an output that happens to equal
    its random start)."""
    import numpy as np

    return [i for i, (a, r) in enumerate(zip(inputs, results)) if not np.array_equal(a, r)] or [len(inputs) - 1]


def packed_calls(plan: dict, count: int) -> tuple[list[int], list[int], list[int]]:
    """A candidate with packed weights (a builder's ``pack`` plan) run on buffers numbered as its
    kernel's ``count`` parameters, then the packed weights: the buffers of its ``pack`` call, of its
    ``main`` call, and the kernel parameter each ``main`` argument is (-1: a packed weight)."""
    packed = range(count, count + len(plan["outputs"]))
    main = [i if kind == "arg" else count + i for kind, i in plan["args"]]
    params = [i if kind == "arg" else -1 for kind, i in plan["args"]]
    return [*plan["inputs"], *packed], main, params


def reference_target(target: Any) -> Any:
    """The target a workload's untuned reference is compiled for: on a CPU, LLVM at -O1 instead of
    -O3. A reference runs once, so LLVM's own compile (done at its first call) is most of its cost
    (a model's references are made before its first candidate runs), and without fast-math the
    optimisation level does not change its outputs (``tests/measure/test_measure.py``)."""
    import tvm

    if target.kind.name != "llvm":
        return target
    return tvm.target.Target({**dict(target.export()), "opt-level": 1})


def build_reference(mod: Any, target: Any) -> Any:
    """``mod``'s reference build for ``target``, the one way builders and runners make it:
    ``reference_module`` compiled for ``reference_target`` (on a GPU, TVM's default GPU schedule)."""
    import tvm

    if target.kind.name == "cuda":
        from stormdrop.tvm_compat.relax_passes import gpu_default_schedule

        mod = gpu_default_schedule(mod, target)
    return tvm.build(reference_module(mod, target), target=reference_target(target))


def reference_function(i: int) -> str:
    """The name of the ``i``-th workload's reference in a library of ``build_references``."""
    return f"reference{i}"


def build_references(mods: list, target: Any) -> Any:
    """One CPU library of ``mods``' references (as ``build_reference`` makes each), the ``i``-th
    as function ``reference_function(i)``."""
    import tvm

    funcs = {}
    for i, mod in enumerate(mods):
        name = reference_function(i)
        funcs[name] = reference_module(mod, target)["main"].with_attr("global_symbol", name)
    return tvm.build(tvm.IRModule(funcs), target=reference_target(target))


def reference_groups(count: int, builders: int) -> list[range]:
    """Workloads ``0 .. count - 1`` cut into the groups builders compile as one library each:
    as large as leaves each builder ``GROUPS_PER_BUILDER`` groups, at most ``GROUP_MAX``."""
    size = max(1, min(GROUP_MAX, -(-count // (GROUPS_PER_BUILDER * max(1, builders)))))
    return [range(s, min(s + size, count)) for s in range(0, count, size)]


def reference_module(mod: Any, target: Any) -> Any:
    """``mod`` as its reference is built for ``target``: on a CPU with several cores, each
    top-level block's leading data-parallel loops fused (until ``CHUNKS_PER_CORE`` chunks a core)
    and run in parallel; ``mod`` itself elsewhere, or where nothing could be parallelized."""
    cores = int(target.attrs.get("num-cores", 1)) if target.kind.name == "llvm" else 1
    if cores < 2:
        return mod
    import tvm

    try:
        sch = tvm.s_tir.Schedule(mod)
        blocks = list(sch.get_child_blocks(sch.get_sblock("root")))
    except Exception:  # noqa: BLE001 - no root block (an extern, say): built as it is
        return mod
    changed = False
    for block in blocks:
        loops = _leading_parallel_loops(sch, block, cores * CHUNKS_PER_CORE)
        if not loops:
            continue
        try:
            sch.parallel(sch.fuse(*loops) if len(loops) > 1 else loops[0])
            changed = True
        except Exception:  # noqa: BLE001 - TVM finds the loop not data-parallel: it stays serial
            continue
    return sch.mod if changed else mod


def _leading_parallel_loops(sch: Any, block: Any, chunks: int) -> list:
    """The outermost loops of ``block`` that each bind one data-parallel block variable, as few as
    give ``chunks`` iterations (all of them when fewer do)."""
    import tvm
    from tvm import tirx

    loops = sch.get_loops(block)
    if not loops:
        return []
    realize = sch.get(loops[-1]).body
    if not isinstance(realize, tvm.s_tir.SBlockRealize):
        return []
    spatial = [v for iv, v in zip(realize.block.iter_vars, realize.iter_values)
               if iv.iter_type == tirx.IterVar.DataPar and isinstance(v, tirx.Var)]
    out, product = [], 1
    for rv in loops:
        loop = sch.get(rv)
        if not any(v.same_as(loop.loop_var) for v in spatial) or loop.kind != tirx.ForKind.SERIAL \
                or not isinstance(loop.extent, tirx.IntImm):
            break
        out.append(rv)
        product *= int(loop.extent.value)
        if product >= chunks:
            break
    return out if product > 1 else []
