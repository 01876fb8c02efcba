"""A candidate with packed weights, split the way a compiled model splits it.

MetaSchedule's ``RewriteLayout`` postprocessor lets a schedule choose the layout of the
weights (buffers marked layout-free) through a preprocessing block. A compiled model runs
that block once, at compile time: Relax's ``SplitLayoutRewritePreproc`` cuts each kernel
into ``<name>_weight_prepack`` and ``<name>_prepacked`` and the prepack is folded into the
constants (``model.run.apply_records``). ``split`` makes the same cut on one candidate,
so that the function timed is literally the one a model deploys, and the function checked
too: the reference weights are packed by the prepack function, then the timed function
runs on them and its output is compared with the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax


@dataclass(frozen=True)
class Split:
    """``compute``: the kernel on packed weights (what is timed and checked); ``pack``: the
    weights' layout rewrite. ``pack_inputs``: the kernel's parameters the pack reads, in order;
    ``compute_args``: where each of ``compute``'s parameters comes from, ``("arg", i)`` the
    kernel's parameter ``i`` (its output among them), ``("packed", j)`` output ``j`` of the pack."""

    compute: tvm.tirx.PrimFunc
    pack: tvm.tirx.PrimFunc
    pack_inputs: tuple[int, ...]
    compute_args: tuple[tuple[str, int], ...]


def split(mod: tvm.IRModule) -> Split | None:
    """The candidate's ``main`` cut into pack and compute, or None when it packs no weight.
    The kernel's last parameter is its output (as for every task and kernel spec)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    func = mod["main"]
    infos = ArgInfo.from_prim_func(func)
    params = [relax.Var(f"p{i}", relax.TensorType([int(x) for x in a.shape], str(a.dtype)))
              for i, a in enumerate(infos[:-1])]
    out = infos[-1]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        gv = bb.add_func(func.with_attr("global_symbol", "kernel"), "kernel")
        res = bb.emit(relax.call_tir(gv, params, relax.TensorType([int(x) for x in out.shape], str(out.dtype))))
        bb.emit_func_output(res)
    cut = relax.transform.SplitLayoutRewritePreproc()(bb.get())
    names = {g.name_hint: g for g in cut.get_global_vars()}
    if "kernel_weight_prepack" not in names or "kernel_prepacked" not in names:
        return None
    index = {p: i for i, p in enumerate(cut["main"].params)}
    packed: dict[relax.Var, int] = {}
    pack_inputs: tuple[int, ...] = ()
    compute_args: tuple[tuple[str, int], ...] = ()
    for block in cut["main"].body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.TupleGetItem):
                packed[b.var] = int(value.index)
            elif isinstance(value, relax.Call) and isinstance(value.args[0], tvm.ir.GlobalVar):
                args = list(value.args[1].fields)
                if value.args[0].name_hint == "kernel_weight_prepack":
                    pack_inputs = tuple(index[a] for a in args)
                    packed[b.var] = 0  # a single packed output is the call's value itself
                else:
                    compute_args = tuple(("arg", index[a]) if a in index else ("packed", packed[a]) for a in args)
    if not pack_inputs or not compute_args:
        return None
    return Split(cut["kernel_prepacked"].with_attr("global_symbol", "main"),
                 cut["kernel_weight_prepack"].with_attr("global_symbol", "pack"), pack_inputs,
                 compute_args + (("arg", len(infos) - 1),))
