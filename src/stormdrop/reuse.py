"""Reuse: transfer-tuning, the best schedules of other workloads of the same class.

Before the storm, the best stored schedule of each *other* workload of the same
class (its fused-operator signature without shapes, e.g. ``conv2d_add_relu``)
on the same target is replayed on this workload (Gibson & Cano, transfer-tuning).
Tile factorizations that do not fit the new loop extents are mapped to the
nearest valid factorization (inner levels first: they hold the register tile
and the vector width), never dropped; the other decisions are kept. A transfer
that TVM or a postprocessor rejects is no candidate; a transfer that fails to
build or run is measured data like any other. The phase proposes; the loop
measures and the storm starts from what was measured.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence

import tvm
import tvm_ffi
from tvm.s_tir import Schedule

from . import _tvm
from .database import Database, WorkloadEntry
from .errors import DatabaseError, SpecError, one_line
from .records import Phase
from .space import Candidate

log = logging.getLogger("stormdrop")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest_factorization(old: list[int], extent: int, max_innermost: int = 0) -> list[int]:
    """``len(old)`` factors whose product is ``extent``, each as close to ``old`` (log scale) as can be.

    Filled from the innermost level outwards; the outermost level takes what remains.
    """
    if math.prod(old) == extent:
        return list(old)
    out = [1] * len(old)
    rest = extent
    for i in range(len(old) - 1, 0, -1):
        limit = max_innermost if (i == len(old) - 1 and max_innermost > 0) else rest
        options = [d for d in divisors(rest) if d <= limit] or [1]
        out[i] = min(options, key=lambda d: (abs(math.log(d) - math.log(max(1, old[i]))), -d))
        rest //= out[i]
    out[0] = rest
    return out


def transfer(donor_mod: tvm.IRModule, donor_trace_json: str, mod: tvm.IRModule, postprocs: list) -> Schedule | None:
    """The donor's schedule replayed on ``mod`` (tiles refitted); None when it does not apply."""
    try:
        trace = _tvm.schedule_from_trace_json(donor_mod, donor_trace_json).trace
        sch = Schedule(mod)

        def refit(inst, inputs, attrs, decision):
            if inst.kind.name == "SamplePerfectTile":
                extent = int(sch.get(inputs[0]).extent)
                return nearest_factorization([int(d) for d in decision], extent, int(attrs[1]))
            return decision

        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=refit)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
        return sch
    except Exception as err:  # noqa: BLE001 - a trace that does not fit this workload is no candidate
        log.debug("transfer failed: %s", one_line(err))
        return None


def donors(db: Database, entry: WorkloadEntry, target_key: str, limit: int | None = None,
           others: Sequence[Database] = ()) -> list[tuple[WorkloadEntry, str]]:
    """(workload, best trace) of the other workloads of the same class (at most ``limit``), nearest
    shapes first (``shape_distance``, then FLOPs).

    ``others``: more databases to draw donors from (``--reuse-from``, read only); there the same
    workload counts too (tuned for another model, say), and comes first.
    """
    out = []
    for source in (db, *others):
        for other in source.workloads():
            if other.op_class != entry.op_class:
                continue
            same = other.shash == entry.shash and tvm_ffi.structural_equal(other.mod, entry.mod)
            if same and source is db:
                continue
            best = source.best(other.workload_id, target_key, k=1)
            if best:
                out.append((other, best[0].trace_json, same))
    out.sort(key=lambda d: (not d[2], shape_distance(d[0].mod, entry.mod),
                            abs(math.log(max(d[0].flops, 1)) - math.log(max(entry.flops, 1)))))
    return [(w, t) for w, t, _ in out[:limit]]


def shape_distance(a: tvm.IRModule, b: tvm.IRModule) -> float:
    """How far apart two kernels' shapes are: the summed |log| ratios of their parameters' dims
    (inf when their parameters differ in number or rank)."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    try:
        sa, sb = ([[int(d) for d in info.shape] for info in ArgInfo.from_prim_func(m["main"])] for m in (a, b))
    except Exception:  # noqa: BLE001 - symbolic shapes
        return math.inf
    if len(sa) != len(sb) or any(len(x) != len(y) for x, y in zip(sa, sb)):
        return math.inf
    return sum(abs(math.log(max(x, 1)) - math.log(max(y, 1))) for xs, ys in zip(sa, sb) for x, y in zip(xs, ys))


def reuse_candidates(db: Database, entry: WorkloadEntry, target_key: str, postprocs: list,
                     limit: int = 8, others: Sequence[Database] = ()) -> list[Candidate]:
    """Transferred schedules for ``entry``, one per donor, distinct, at most ``limit``: a donor
    whose schedule does not transfer gives its place to the next-nearest one."""
    cands, seen = [], set()
    for donor, trace_json in donors(db, entry, target_key, others=others):
        if len(cands) >= limit:
            break
        sch = transfer(donor.mod, trace_json, entry.mod, postprocs)
        if sch is None:
            continue
        cand = Candidate.from_schedule(sch, Phase.REUSE)
        if cand.key not in seen:
            seen.add(cand.key)
            cands.append(cand)
    log.debug("reuse: %d candidates from %d donors", len(cands), limit)
    return cands


def open_donors(paths: Sequence[str | os.PathLike]) -> list[Database]:
    """The ``--reuse-from`` databases, read only (SpecError naming the first that cannot be opened)."""
    out: list[Database] = []
    try:
        for p in paths:
            out.append(Database(p, read_only=True))
    except DatabaseError as err:
        for d in out:
            d.close()
        raise SpecError(f"--reuse-from: {err}") from None
    return out
