"""Which donors a task's reuse draws from, and in what order (``search.reuse`` transfers their schedules).

A donor is another workload with a related class (``related``): the same blocks, the same less
some elementwise epilogues, the same main blocks with other epilogues, or with more of them.
``donors`` lists the run's database and the donor sources (``--reuse-from``, the schedule
hub) by that relation, then by the nearest parameter shapes (``shape_distance``) and FLOPs, and
reads a donor's best records only when it is reached. ``heirs`` counts, for each task of a model,
the others that could take its schedule. It measures, stores and transfers nothing.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence

import tvm
import tvm_ffi

from stormdrop.storage.database import Database, WorkloadEntry
from stormdrop.storage.hub import HubDatabase, HubLine
from stormdrop.workloads import parameter_shapes

# TOPI's elementwise blocks (add, multiply, ReLU as compute, a fast sigmoid as T_fast_exp + sigmoid, ...)
_EPILOGUE = re.compile(r"^(T_[a-z_]+|compute|sigmoid|tanh|erf)$")


def block_kind(name: str) -> str:
    """A block's name without its counters and variable numbers: ``T_add1`` -> ``T_add``."""
    return re.sub(r"\d+", "", name)


def is_epilogue(name: str) -> bool:
    """Whether a block (by name, counters and all) is one of TOPI's elementwise ops."""
    return bool(_EPILOGUE.match(block_kind(name)))


def class_blocks(op_class: str) -> tuple[Counter, str]:
    """An ``op_class`` (``model.tune.op_class``) as (block kinds counted, dtype)."""
    blocks, _, dtype = op_class.rpartition(":")
    return Counter(block_kind(b) for b in blocks.split("+")), dtype


@functools.lru_cache(maxsize=1 << 16)  # asked for every pair of a model's tasks and a hub's workloads
def related(donor_class: str, op_class: str) -> int | None:
    """How near a donor's class is to this one (None: unrelated). 0: the same blocks; 1: the donor's
    blocks are this class's less some elementwise epilogues (inlined before its trace is replayed);
    2: the same main blocks, the donor's epilogues other elementwise ops, no more of them than here
    (conv + bias + SiLU for conv + bias + ReLU6: paired from the output back); 3: the same main
    blocks, more epilogues in the donor (its extra inner ones left out of its trace)."""
    (a, da), (b, db) = class_blocks(donor_class), class_blocks(op_class)
    if da != db:
        return None
    if a == b:
        return 0
    if not (a - b) and all(_EPILOGUE.match(k) for k in b - a):
        return 1
    main_a, main_b = (Counter({k: n for k, n in c.items() if not _EPILOGUE.match(k)}) for c in (a, b))
    if main_a and main_a == main_b:
        return 2 if a.total() - main_a.total() <= b.total() - main_b.total() else 3
    return None


def heirs(op_classes: Sequence[str]) -> list[int]:
    """For each of a model's tasks (their ``op_classes``), how many of the others could take its
    schedule as reuse's donor (``related`` from its class to theirs)."""
    return [sum(related(c, other) is not None for j, other in enumerate(op_classes) if j != i)
            for i, c in enumerate(op_classes)]


def donors(db: Database, entry: WorkloadEntry, target_key: str, others: Sequence[Database] = (),
           per_donor: int = 1, order: str = "class", exact_sources: bool = True, fastest_of: int = 1,
           exact_too: bool = False) -> Iterator[tuple[WorkloadEntry, list[str]]]:
    """(workload, its ``per_donor`` best traces) of the other workloads of a related class, one at a
    time: a workload's best records are looked up when it is reached (a reuse that stops after a few
    donors reads no more). ``order="class"``: the same class first, then the same less elementwise
    epilogues, then the same main operator with other epilogues, then with more of them (``related``);
    within each, nearest shapes first (``shape_distance``, then FLOPs). ``order="shape"``: nearest shapes
    first whatever the epilogues (a 1x1 expansion convolution + ReLU6 takes an expansion + SiLU's
    schedule before a projection + bias's), the relation breaking ties.

    ``others``: more databases to draw donors from (``--reuse-from``, read only); there the same
    workload counts too (tuned for another model, say), and comes first. A source whose
    ``exact_only`` is true (the schedule hub) gives the same workload only where ``exact_sources``
    (else its related workloads too, like any other source: ranked by the shapes its lines give, and
    decoded only when reached, ``HubDatabase.listed``).

    ``fastest_of`` = k > 1: of the nearest k donors that are not this very workload, the fastest
    (FLOPs over its best record's mean) whose shapes are within ``FASTEST_WITHIN`` of the nearest's
    (``shape_distance``) comes first, the others in order. The nearest donor is often a briefly
    tuned one whose transfer carries its flaw; a much larger donor's throughput says little of
    how its schedule runs at this size. ``exact_too``: this very workload tuned elsewhere (the hub's
    exact hit) is one of those k too, at distance 0, instead of always first: a hub entry tuned
    briefly can run slower here than a near donor's schedule transferred.
    """
    if order not in ("class", "shape"):
        raise ValueError(f"donor order {order!r}: 'class' or 'shape'")
    mine = parameter_shapes(entry.mod)  # once, not once a donor
    found = []
    for source in (db, *others):
        exact_only = source.exact_only and exact_sources  # looked up, not listed: a hub decodes what is asked
        hit = source.find_workload(entry.mod) if exact_only else None
        keep = functools.partial(_related_to, entry.op_class)
        candidates = ([hit] if hit is not None else []) if exact_only else \
            source.listed(keep) if isinstance(source, HubDatabase) else source.workloads(keep)
        for other in candidates:
            rank = related(other.op_class, entry.op_class)
            if rank is None:
                continue
            if isinstance(other, HubLine) and other.shash == entry.shash:  # maybe this very workload: decoded
                other = source.reached(other)
                if other is None:
                    continue
            same = other.shash == entry.shash and tvm_ffi.structural_equal(other.mod, entry.mod)
            if (same and source is db) or (not same and exact_only):
                continue
            found.append((source, other, (not same, rank), _nearness(other, entry, mine)))

    def key(d):
        (elsewhere, rank), near = d[2], d[3]  # not this very workload (tuned elsewhere), the relation
        return (elsewhere, rank, *near) if order == "class" else (elsewhere, near[0], rank, near[1])

    found.sort(key=key)
    head: list[tuple[float, float, WorkloadEntry, list]] = []  # the nearest fastest_of: (distance, FLOPs/s, ...)
    for source, other, (elsewhere, _), near in found:
        if isinstance(other, HubLine):  # a hub's workload ranked by its line: decoded when reached
            other = source.reached(other)
            if other is None:
                continue
        best = source.best(other.workload_id, target_key, k=per_donor)
        if not best:
            continue
        if fastest_of > 1 and (elsewhere or exact_too) and len(head) < fastest_of:
            head.append((near[0], other.flops / max(best[0].mean, 1e-12), other, best))
            if len(head) == fastest_of:
                yield from _fastest_first(head)
            continue
        yield other, [r.trace_json for r in best]
    if 0 < len(head) < fastest_of:  # fewer donors than that
        yield from _fastest_first(head)


def _related_to(op_class: str, other: str) -> bool:
    return related(other, op_class) is not None


def _nearness(other: WorkloadEntry | HubLine, entry: WorkloadEntry, mine: list[tuple[int, ...]] | None) -> tuple[float, float]:
    """How near a donor is to ``entry`` (whose parameter shapes are ``mine``): their shape distance,
    then the |log| ratio of their FLOPs."""
    return (_distance(_entry_shapes(other), mine),
            abs(math.log(max(other.flops, 1)) - math.log(max(entry.flops, 1))))


FASTEST_WITHIN = 2.0  # shape distance (summed |log| ratios of the dims) from the nearest donor's


def fastest_near(distances: Sequence[float], speeds: Sequence[float]) -> int:
    """Of donors nearest first (their shape ``distances`` and FLOPs a second), the index of the
    fastest within ``FASTEST_WITHIN`` of the nearest's distance: the one ``fastest_of`` tries first."""
    near = [i for i, d in enumerate(distances) if d <= distances[0] + FASTEST_WITHIN]
    return max(near, key=lambda i: speeds[i])


def _fastest_first(head: list[tuple[float, float, WorkloadEntry, list]]) -> Iterator[tuple[WorkloadEntry, list[str]]]:
    """The nearest donors (distance, FLOPs a second, workload, best records; nearest first), the one
    ``fastest_near`` picks moved to the front."""
    first = fastest_near([h[0] for h in head], [h[1] for h in head])
    for h in [head[first], *head[:first], *head[first + 1:]]:
        yield h[2], [r.trace_json for r in h[3]]


_SHAPES: dict[str, list[tuple[int, ...]] | None] = {}  # structural hash -> parameter shapes


def _entry_shapes(entry: WorkloadEntry) -> list[tuple[int, ...]] | None:
    """``parameter_shapes`` of a stored workload, read once a run: every task of its class asks for it;
    a hub's line not decoded yet (``HubLine``) gives them itself."""
    if isinstance(entry, HubLine):
        return entry.shapes
    if entry.shash not in _SHAPES:
        if len(_SHAPES) >= 1 << 14:
            _SHAPES.clear()
        _SHAPES[entry.shash] = parameter_shapes(entry.mod)
    return _SHAPES[entry.shash]


def shape_distance(a: tvm.IRModule, b: tvm.IRModule) -> float:
    """How far apart two kernels' shapes are: the summed |log| ratios of their parameters' dims,
    inputs in order and the outputs (a fused residual operand more in one of them left out; inf
    when the compared parameters differ in rank)."""
    return _distance(parameter_shapes(a), parameter_shapes(b))


def _distance(sa: list[tuple[int, ...]] | None, sb: list[tuple[int, ...]] | None) -> float:
    """``shape_distance`` of two kernels' parameter shapes (``parameter_shapes``)."""
    if not sa or not sb:
        return math.inf
    n = min(len(sa), len(sb))
    pairs = list(zip(sa[:n - 1], sb[:n - 1])) + [(sa[-1], sb[-1])]
    if any(len(x) != len(y) for x, y in pairs):
        return math.inf
    return sum(abs(math.log(max(x, 1)) - math.log(max(y, 1))) for xs, ys in pairs for x, y in zip(xs, ys))
