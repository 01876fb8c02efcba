"""A workload's design space on a target, made once per task and shared by its phases.

The sketches are MetaSchedule's design space for the workload (``post-order-apply``, or the
tensor-core one for float16 on a GPU that has tensor cores) and, on a CPU, MetaSchedule's sketches
of the workload with its stride-2 padded inputs stored as parity planes (``search.parity``) and a
copy-like kernel vectorized along its rows (``search.rows``), each with random decisions drawn
once from the task's seed; the storm samples and evolves from them,
reuse moves donors' decisions into them, and the raindrop replays its moves through their
postprocessors. The ``TuneContext`` they come from also makes the cost model's features
(``cost_model.CostModel``). It measures, stores and proposes nothing.
"""

from __future__ import annotations

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from stormdrop.search import parity, rows
from stormdrop.target import num_cores, physical_cores, vector_lanes
from stormdrop.tvm_compat.intrinsics import (
    load_tensor_intrinsics,
    register_default_pool_rules,
    without_needless_rfactor,
)


class Sketches:
    """The design space of ``mod`` on ``target``, its random decisions drawn from ``seed``; ``row_vectors``:
    with the row-vector sketch of a copy-like kernel (``search.rows``) on a CPU."""

    def __init__(self, mod: tvm.IRModule, target: Target, seed: int, row_vectors: bool = True) -> None:
        self.mod, self.target, self.seed, self.row_vectors = mod, target, seed, row_vectors
        self.context = make_context(mod, target, seed=seed)
        self._spaces: list | None = None

    @property
    def postprocs(self) -> list:
        """The target's postprocessors, which make a schedule of the space a candidate (or reject it)."""
        return self.context.space_generator.postprocs

    def spaces(self) -> list:
        """The sketches (design spaces, random decisions), made at first use; on a CPU, besides
        them the sketches of the workload with its stride-2 padded inputs as parity planes
        (``search.parity``) and a copy-like kernel vectorized along its rows (``search.rows``),
        and none that rfactors a short reduction of many outputs (a pooling window)."""
        if self._spaces is None:
            spaces = list(self.context.generate_design_space())
            if self.target.kind.name == "llvm":
                spaces += self._parity_spaces()
                row = rows.space(self.mod, vector_lanes(self.target) or 8) if self.row_vectors else None
                spaces += [row] if row is not None else []
                spaces = without_needless_rfactor(spaces, self.mod, num_cores(self.target) or physical_cores())
            self._spaces = spaces
        return self._spaces

    def _parity_spaces(self) -> list:
        """MetaSchedule's sketches of the workload rewritten by ``parity.planes``, each replayed on
        the workload itself after the rewrite's instructions (none when nothing is read at stride 2)."""
        planar = parity.planes(self.mod)
        if planar is None:
            return []
        out = []
        for space in make_context(planar.mod, self.target, seed=self.seed).generate_design_space():
            sch = planar.copy()  # the workload itself, the rewrite's instructions in its trace
            space.trace.apply_to_schedule(sch, remove_postproc=True)
            out.append(sch)
        return out


def make_context(mod: tvm.IRModule, target: Target, *, seed: int, strategy: object = "evolutionary",
                 name: str = "main", threads: int | None = None) -> ms.TuneContext:
    """A TuneContext for ``mod`` on ``target`` (design space + postprocessors initialised).

    MetaSchedule's searches draw with one random state per thread and hand out work to
    threads dynamically, so only ``threads=1`` makes a seed reproduce the same samples.
    """
    load_tensor_intrinsics(target)
    register_default_pool_rules()
    return ms.TuneContext(mod, target=target, space_generator=design_space(mod, target),
                          search_strategy=strategy, task_name=name, rand_state=seed,
                          num_threads=threads or physical_cores())


def design_space(mod: tvm.IRModule, target: Target) -> object:
    """MetaSchedule's design space for ``mod`` on ``target``: its tensor-core one (MultiLevelTiling
    with the wmma intrinsics, their postprocessors and mutators, and the CUDA rules for the other
    blocks) for a float16 workload on a GPU that has tensor cores (sm_70 and later), else the
    target's default (``post-order-apply``)."""
    if target.kind.name == "cuda" and tensor_cores(target) and any(
            str(p.dtype) == "float16" for p in mod["main"].params):
        return ms.space_generator.PostOrderApply(sch_rules="cuda-tensorcore", postprocs="cuda-tensorcore",
                                                 mutator_probs="cuda-tensorcore")
    return "post-order-apply"


def tensor_cores(target: Target) -> bool:
    """Whether the CUDA target's arch (``sm_XY``) has tensor cores (Volta, sm_70, and later)."""
    arch = str(target.attrs.get("arch", ""))
    return arch.startswith("sm_") and arch[3:5].isdigit() and int(arch[3:5]) >= 70
