"""Reuse: transfer-tuning, the best schedules of other workloads of the same class.

Before the storm, the best stored schedule of each *other* workload of the same
class (its fused-operator signature without shapes, e.g. ``conv2d_add_relu``)
on the same target is replayed on this workload (Gibson & Cano, transfer-tuning).
Then, as the paper's class is the main operator's, donors whose blocks are this
workload's less some elementwise epilogue (a convolution + bias + ReLU for one
with a residual add fused in as well): the extra epilogue blocks are inlined
first, so the donor's trace meets the loop nests it was written for; then donors
with the same main blocks and other elementwise epilogues (SiLU for ReLU6), no
more of them: the trace treats this workload's epilogues as it treated its own,
paired from the output back; last, donors with more epilogues than this workload
(a fast SiLU's five blocks for ReLU6's three): the donor's extra inner epilogues
are left out of its trace (the instructions that touch them, nothing else).
Blocks are matched by kind, counters and variable numbers left out
(``lv224_red`` is ``lv85_red``), in order. Which donors, and in what order:
``search.donors``.
Tile factorizations that do not fit the new loop extents are mapped to the
nearest valid factorization (inner levels first: they hold the register tile
and the vector width), never dropped; the other decisions are kept. With
``StormConfig.whole_vectors`` (on by default), on a CPU an innermost factor
above the vector's lane count must be a multiple of it where another divisor
fits: that loop is the one vectorized, and LLVM legalizes a vector of 18, 24
or 40 floats (AVX-512) into shuffles and stack spills, where 15 lanes are one
register, masked (docs/guide.md, "Reuse").
A donor's decisions are also moved into each of this workload's sketches (its design
spaces: with the epilogue computed apart or inside the tiles, a write cache or not): the
k-th tile size and categorical choice of the sketch take the donor's k-th, refitted. The
donor's own structure is often the one that loses: undertuned donors computed their
epilogue apart, and moved into the sketch that fuses it the same tiles ran 2.4-3.6x
faster on a MobileNetV2 expansion convolution (RESULTS.md). A transfer
that TVM or a postprocessor rejects is no candidate; a transfer that fails to
build or run is measured data like any other. The phase proposes; the loop
measures and the storm starts from what was measured.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import tvm
import tvm_ffi
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import Instruction, Trace

from stormdrop.errors import one_line
from stormdrop.records import Phase
from stormdrop.search.donors import block_kind, donors, is_epilogue
from stormdrop.search.space import Candidate
from stormdrop.storage.database import Database, WorkloadEntry
from stormdrop.storage.identity import block_names
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json

log = logging.getLogger("stormdrop")


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest_factorization(old: list[int], extent: int, max_innermost: int = 0, lanes: int = 0) -> list[int]:
    """``len(old)`` factors whose product is ``extent``, each as close to ``old`` (log scale) as can be.

    Filled from the innermost level outwards; the outermost level takes what remains. ``lanes`` > 1:
    the innermost factor is at most ``lanes`` or a multiple of it, where such a divisor of 4 or more
    fits (a vector loop stays a vector loop).
    """
    if math.prod(old) == extent:
        return list(old)
    out = [1] * len(old)
    rest = extent
    for i in range(len(old) - 1, 0, -1):
        limit = max_innermost if (i == len(old) - 1 and max_innermost > 0) else rest
        options = [d for d in divisors(rest) if d <= limit] or [1]
        if i == len(old) - 1 and lanes > 1:
            whole = [d for d in options if d <= lanes or d % lanes == 0]
            options = whole if max(whole, default=1) >= 4 else options  # not at the cost of the vector
        out[i] = min(options, key=lambda d: (abs(math.log(d) - math.log(max(1, old[i]))), -d))
        rest //= out[i]
    out[0] = rest
    return out


def _renamed(trace: Trace, names: dict[str, str], dropped: Sequence[str] = ()) -> Trace:
    """``trace`` with its block lookups renamed (``names``: donor block -> this workload's) and
    the blocks in ``dropped`` left out: their lookups and every instruction that uses what those
    produced (an inlining, say), nothing else."""
    insts, decisions, dead = [], {}, []
    for old in trace.insts:
        lookup = str(old.attrs[0]) if old.kind.name == "GetSBlock" else None
        if lookup in dropped or any(_uses(x, dead) for x in old.inputs):
            dead.extend(old.outputs)
            continue
        inst = old
        if lookup in names:
            inst = Instruction(old.kind, old.inputs, [names[lookup], old.attrs[1]], old.outputs)
        insts.append(inst)
        if old in trace.decisions:
            decisions[inst] = trace.decisions[old]
    return Trace(insts, decisions)


def _uses(value, dead: list) -> bool:
    """Whether an instruction input is (or lists) one of the random variables in ``dead``."""
    if value is None or isinstance(value, (int, float, str)):
        return False
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return any(_uses(v, dead) for v in value)
    return any(value.same_as(d) for d in dead)


def _match_blocks(donor: Schedule, sch: Schedule) -> tuple[dict[str, str], list[str], list[str]] | None:
    """Donor block -> this workload's block: the output blocks when both are elementwise epilogues
    (the one a schedule computes at the main block's tiles), then blocks of the same kind, in
    order, then the donor's other elementwise epilogues to this workload's, paired from the last
    back; this workload's blocks left over (each an elementwise epilogue, to inline first); and
    the donor's left over (each an inner elementwise epilogue, to leave out of its trace). None
    when a donor block has no counterpart."""
    free, theirs = list(block_names(sch)), list(block_names(donor))
    names, unmatched = {}, []
    if is_epilogue(theirs[-1]) and is_epilogue(free[-1]):
        names[theirs.pop()] = free.pop()
    for name in theirs:
        match = next((m for m in free if block_kind(m) == block_kind(name)), None)
        if match is None:
            unmatched.append(name)
            continue
        free.remove(match)
        names[name] = match
    if not all(is_epilogue(m) for m in free + unmatched):
        return None
    n = min(len(free), len(unmatched))
    names.update(zip(unmatched[len(unmatched) - n:], free[len(free) - n:]))
    return names, free[:len(free) - n], unmatched[:len(unmatched) - n]


def _inline(sch: Schedule, name: str) -> None:
    """Inline an elementwise block into its consumer, or (an output block) into its producer."""
    block = sch.get_sblock(name)
    try:
        sch.compute_inline(block)
    except Exception:  # noqa: BLE001 - it writes an output: fold it into the block before it
        sch.reverse_compute_inline(block)


def transfer(donor_mod: tvm.IRModule, donor_trace_json: str, mod: tvm.IRModule, postprocs: list,
             lanes: int = 0) -> Schedule | None:
    """The donor's schedule replayed on ``mod`` (blocks matched by kind, this workload's extra
    elementwise epilogues inlined first, the donor's extra ones left out of its trace, tiles
    refitted: ``nearest_factorization``, ``lanes`` as it takes it); None when it does not apply."""
    try:
        donor = schedule_from_trace_json(donor_mod, donor_trace_json)
        sch = Schedule(mod)
        unscheduled = Schedule(donor_mod)
        matched = _match_blocks(unscheduled, sch)
        if matched is None:
            return None
        names, extra, dropped = matched
        if block_names(unscheduled)[-1] in dropped:
            return None  # the donor's output block has no counterpart here
        for name in extra:
            _inline(sch, name)
        trace = _renamed(donor.trace, names, dropped)

        def refit(inst, inputs, attrs, decision):
            if inst.kind.name == "SamplePerfectTile":
                extent = int(sch.get(inputs[0]).extent)
                return nearest_factorization([int(d) for d in decision], extent, int(attrs[1]), lanes)
            return decision

        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=refit)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
        return sch
    except Exception as err:  # noqa: BLE001 - a trace that does not fit this workload is no candidate
        log.debug("transfer failed: %s", one_line(err))
        return None


def replayed(mod: tvm.IRModule, trace_json: str) -> Schedule | None:
    """A stored schedule of this very workload (another database's, the hub's), replayed as stored:
    the same candidate as in its source, postprocessors included; None when it does not replay."""
    try:
        return schedule_from_trace_json(mod, trace_json)
    except Exception as err:  # noqa: BLE001 - a trace that no longer replays is no candidate
        log.debug("stored schedule does not replay: %s", one_line(err))
        return None


def _decisions(trace: Trace) -> tuple[list[list[int]], list[int]]:
    """A trace's tile sizes and categorical choices, in order."""
    tiles, cats = [], []
    for inst in trace.insts:
        decision = trace.decisions.get(inst)
        if decision is None:
            continue
        if inst.kind.name == "SamplePerfectTile":
            tiles.append([int(d) for d in decision])
        elif inst.kind.name == "SampleCategorical":
            cats.append(int(decision))
    return tiles, cats


def in_sketches(donor_mod: tvm.IRModule, donor_trace_json: str, mod: tvm.IRModule, spaces: Sequence[Schedule],
                postprocs: list, lanes: int = 0) -> list[Schedule]:
    """The donor's decisions in each of ``mod``'s sketches (``spaces``, its design spaces) whose tile
    instructions line up with the donor's (as many, the same lengths): the k-th tile size (refitted)
    and categorical choice of the sketch are the donor's k-th. Sketches that do not line up, or
    that TVM or a postprocessor rejects, give nothing."""
    try:
        tiles, cats = _decisions(schedule_from_trace_json(donor_mod, donor_trace_json).trace)
    except Exception as err:  # noqa: BLE001 - a donor trace that no longer replays gives nothing
        log.debug("donor trace does not replay: %s", one_line(err))
        return []
    out = []
    for space in spaces:
        own = [i for i in space.trace.insts if i.kind.name == "SamplePerfectTile"]
        if len(own) != len(tiles) or any(len(space.trace.decisions[i]) != len(t) for i, t in zip(own, tiles)):
            continue
        sch, counts = Schedule(mod), {"SamplePerfectTile": 0, "SampleCategorical": 0}

        def provide(inst, inputs, attrs, decision, sch=sch, counts=counts):
            kind = inst.kind.name
            if kind not in counts:
                return decision
            k = counts[kind]
            counts[kind] += 1
            if kind == "SamplePerfectTile":
                return nearest_factorization(tiles[k], int(sch.get(inputs[0]).extent), int(attrs[1]), lanes)
            return cats[k] if k < len(cats) and cats[k] < len(attrs[0]) else decision

        try:
            space.trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
            sch.enter_postproc()
            if all(p.apply(sch) for p in postprocs):
                out.append(sch)
        except Exception as err:  # noqa: BLE001 - a sketch these decisions do not fit gives nothing
            log.debug("donor decisions do not fit a sketch: %s", one_line(err))
    return out


def transfers(db: Database, entry: WorkloadEntry, target_key: str, postprocs: list, limit: int = 8,
              others: Sequence[Database] = (), per_donor: int = 1, order: str = "class",
              spaces: Sequence[Schedule] = (), enough: int = 0, sketch_donors: int = 0,
              exact: set[str] | None = None, exact_sources: bool = True, fastest_of: int = 1,
              exact_too: bool = False, lanes: int = 0) -> list[list[Candidate]]:
    """Transferred schedules for ``entry`` from at most ``limit`` donors (``donors.donors`` order), one
    list per donor: its ``per_donor`` best records transferred, distinct, best first, then its best
    record's decisions in each of ``spaces`` (``in_sketches``). A donor none of whose schedules
    transfers gives its place to the next one. ``enough`` > 0: no more donors once the groups hold
    that many (each transfer costs a replay and the postprocessors). ``sketch_donors`` > 0: only the
    first that many donors' decisions go into ``spaces``. ``exact``: given, it is told the keys of
    the schedules that came from this very workload (another database's, the hub's);
    ``exact_sources``, ``fastest_of``, ``exact_too``: as ``donors.donors`` takes them; ``lanes``:
    as ``nearest_factorization`` takes it."""
    groups, seen = [], set()
    for donor, traces in donors(db, entry, target_key, others, per_donor, order, exact_sources,
                                fastest_of=fastest_of, exact_too=exact_too):
        if len(groups) >= limit or (enough and sum(map(len, groups)) >= enough):
            break
        group = []
        same = donor.shash == entry.shash and tvm_ffi.structural_equal(donor.mod, entry.mod)
        if same:
            # this very workload: its schedule as stored (or, its blocks named apart, transferred)
            schedules = [replayed(entry.mod, t) or transfer(donor.mod, t, entry.mod, postprocs, lanes)
                         for t in traces]
        else:
            schedules = [transfer(donor.mod, t, entry.mod, postprocs, lanes) for t in traces]
        if spaces and (not sketch_donors or len(groups) < sketch_donors):
            schedules += in_sketches(donor.mod, traces[0], entry.mod, spaces, postprocs, lanes)
        for sch in schedules:
            if sch is None:
                continue
            cand = Candidate.from_schedule(sch, Phase.REUSE)
            if cand.key not in seen:
                seen.add(cand.key)
                group.append(cand)
                if same and exact is not None:
                    exact.add(cand.key)
        if group:
            groups.append(group)
    log.debug("reuse: %d candidates from %d donors", sum(map(len, groups)), len(groups))
    return groups


def chosen_transfers(groups: list[list[Candidate]], budget: int,
                     rank: Callable[[list[Candidate]], list[float]] | None = None,
                     whole: bool = False) -> list[Candidate]:
    """The transfers to measure, at most ``budget``: each donor's first in donor order (as many as there
    are donors); ``whole``: each donor's whole group, nearest donor first, up to ``budget``; with
    ``rank`` (cost-model scores, higher is faster) and more than one donor, the nearest donor's
    first, then every other transfer by score (as many as there are donors)."""
    if whole and rank is None:
        return [c for g in groups for c in g][:budget]
    if rank is None or len(groups) < 2:
        return [g[0] for g in groups[:budget]]
    rest = [c for g in groups for c in g][1:]
    scores = rank(rest)
    ranked = sorted(range(len(rest)), key=lambda i: -scores[i])
    return [groups[0][0], *(rest[i] for i in ranked)][:min(budget, len(groups))]


def fastest_transfers(groups: list[list[Candidate]], budget: int, rank: Callable[[list[Candidate]], list[float]],
                      exact: set[str] = frozenset()) -> list[Candidate]:
    """At most ``budget`` of the transfers: those of this very workload (``exact``) first, then the
    ones ``rank`` (cost-model scores, higher is faster) scores fastest; all of them, in donor order,
    when the budget holds them."""
    pool = [c for g in groups for c in g]
    if len(pool) <= budget:
        return pool
    scores = rank(pool)
    order = sorted(range(len(pool)), key=lambda i: (pool[i].key not in exact, -scores[i]))
    return [pool[i] for i in order[:budget]]
