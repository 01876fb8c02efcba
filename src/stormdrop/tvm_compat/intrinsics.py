"""Work-arounds of TVM 0.27 in tensor intrinsics and schedule rules (the index of all: ``tvm_compat``).

- ``import tvm.s_tir.tensor_intrin`` (done by every ``TuneContext`` and by
  MetaSchedule's builder) imports the intrinsics of every backend; the CUDA ones
  take half of that import's time. For CPU targets we
  register only the intrinsics of the target's CPU family, by
  putting a package object in ``sys.modules`` whose ``__init__`` has not run
  (``load_tensor_intrinsics``); for CUDA targets only the CUDA ones (half of the whole
  import), for other GPU kinds the real package. Measurement
  workers need none: they build and run modules that are already scheduled.
- Relax's legalized pooling blocks carry ``schedule_rule = "meta_schedule.pool_max"``
  (and ``pool_avg``, ``adaptive_pool_*``) but TVM registers no rule of that name for
  CPUs: ``ApplyCustomRule`` logs an "Unknown schedule rule" warning through the user's
  progress display, removes the annotation and goes on with the default rules.
  ``register_default_pool_rules`` registers rules that do exactly that, silently (the
  trace is the same: one ``Unannotate``).
- ``AddRFactor`` skips a multi-level-tiled block with enough outputs to parallelize, but tries
  rfactor on every other reduction (``NeedsRFactorOrCrossThreadReduction``: "always try"), a
  pooling window of 9 included: those sketches split a 3x3 window into a partial-max buffer per
  output, and the prior's first picks came from them. ``without_needless_rfactor`` drops them on
  CPUs where every reduction is short and has many outputs (the condition TVM applies to tiled
  blocks).
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import sys
import types
from typing import Any

from tvm.s_tir import Schedule

_INTRIN_PKG = "tvm.s_tir.tensor_intrin"


_POOL_RULES = ("pool_max", "pool_avg", "adaptive_pool_max", "adaptive_pool_avg")


def _unannotate_rule(sch: Schedule, block: Any) -> list[Schedule]:
    sch.unannotate(block, "schedule_rule")
    return [sch]


@functools.cache
def register_default_pool_rules() -> None:
    """Register TVM's own fallback for the pooling rules it names but does not define (once)."""
    import tvm_ffi

    for name in _POOL_RULES:
        full = f"s_tir.meta_schedule.cpu.meta_schedule.{name}"
        if tvm_ffi.get_global_func(full, allow_missing=True) is None:
            tvm_ffi.register_global_func(full, _unannotate_rule)


SHORT_REDUCTION = 64  # elements reduced per output below which rfactor cannot pay (lowering/reductions.py's MIN_EXTENT)
JOBS_PER_CORE = 16  # AddRFactor's max_jobs_per_core: outputs a core needs for the spatial loops to parallelize


def _reductions(mod: Any) -> list[tuple[int, int]]:
    """(outputs, elements reduced per output) of each reduction block of ``mod``'s ``main``."""
    sch = Schedule(mod)
    out = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        spatial, reduced = 1, 1
        for iv in sch.get(rv).iter_vars:
            extent = int(iv.dom.extent)
            if int(iv.iter_type) == 0:  # data parallel
                spatial *= extent
            else:
                reduced *= extent
        if reduced > 1:
            out.append((spatial, reduced))
    return out


def without_needless_rfactor(spaces: list, mod: Any, cores: int) -> list:
    """``spaces`` without the sketches that rfactor a reduction, where every reduction of ``mod``
    is short (under ``SHORT_REDUCTION`` elements an output) and has at least ``JOBS_PER_CORE``
    outputs a core; ``spaces`` itself otherwise, or when every sketch rfactors."""
    try:
        found = _reductions(mod)
    except Exception:  # a symbolic extent, a function without a root block: the sketches as they are
        return spaces
    if not found or any(r >= SHORT_REDUCTION or s < JOBS_PER_CORE * cores for s, r in found):
        return spaces
    kept = [sp for sp in spaces if not any(inst.kind.name == "RFactor" for inst in sp.trace.insts)]
    return kept or spaces


def load_tensor_intrinsics(target: str | Any) -> None:
    """Register the tensor intrinsics ``target`` can use, cheaply for CPUs.

    ``target``: a Target (its CPU family's only) or a kind
    name (``"llvm"``: every CPU family, for traces of unknown origin).
    """
    kind = target if isinstance(target, str) else target.kind.name
    if kind not in ("llvm", "cuda"):
        import tvm.s_tir.tensor_intrin  # noqa: F401  (all backends)

        # after a CPU target's cheap import, the package in sys.modules is the stub whose
        # __init__ never ran: a GPU target's intrinsics must still be registered
        importlib.import_module(f"{_INTRIN_PKG}.cuda")
        return
    if kind == "cuda":
        families: tuple[str, ...] = ("cuda",)
    else:
        families = ("x86", "arm_cpu") if isinstance(target, str) else (_cpu_family(target),)
    if _INTRIN_PKG not in sys.modules:
        spec = importlib.util.find_spec(_INTRIN_PKG)
        if spec is None or spec.submodule_search_locations is None:  # pragma: no cover
            return
        pkg = types.ModuleType(_INTRIN_PKG)
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        pkg.__package__ = _INTRIN_PKG
        sys.modules[_INTRIN_PKG] = pkg
    try:
        for family in families:
            importlib.import_module(f"{_INTRIN_PKG}.{family}")
    except Exception:  # pragma: no cover - fall back to the full import
        for name in [n for n in sys.modules if n == _INTRIN_PKG or n.startswith(_INTRIN_PKG + ".")]:
            del sys.modules[name]
        import tvm.s_tir.tensor_intrin  # noqa: F401


def _cpu_family(target: Any) -> str:
    """``arm_cpu`` for ARM LLVM targets (by triple, device or host), else ``x86``."""
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple:
        return "arm_cpu" if triple.startswith(("aarch64", "arm")) else "x86"
    if str(target.attrs.get("device", "") or "") == "arm_cpu":
        return "arm_cpu"
    return "arm_cpu" if platform.machine().lower() in ("aarch64", "arm64") else "x86"
