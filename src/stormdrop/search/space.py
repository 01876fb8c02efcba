"""A schedule's tunable decisions as coordinates, and their neighbours.

A *position* is one value per coordinate of an incumbent trace:

- ``tile``: a ``SamplePerfectTile`` factorization; a step of radius r moves a
  divisor made of r prime factors from one tile level to another, so the
  product always equals the loop extent (always a valid split);
- ``categorical``: a ``SampleCategorical`` index (e.g. the unroll depth), ±r;
- ``location``: a ``SampleComputeLocation`` loop index, ±r (TVM rounds an
  invalid index to the nearest valid one below; we read the result back);
- ``annotation``: the ``meta_schedule.parallel`` / ``meta_schedule.vectorize``
  extents the postprocessors use, ±r along an ordered list of values.

A *register tile* (``DecisionSpace.register_tiles``) is a jump, not a step: the
innermost tiles of a multi-level-tiled block set at once to a micro-kernel
shape, the innermost (vectorized) loop a few vectors wide and the other
innermost factors making enough accumulators to hide the FMA latency without
spilling the vector registers.

Applying a position replays the trace with the new decisions on the workload,
then runs the target's postprocessors; a rejected schedule is no candidate.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from typing import Any

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.s_tir import Schedule, Trace

from stormdrop.records import Phase
from stormdrop.storage.database import candidate_key
from stormdrop.tvm_compat.trace_json import to_py, trace_to_json

ANNOTATIONS = ("meta_schedule.parallel", "meta_schedule.vectorize")


@dataclass
class Candidate:
    """A schedule proposed for measurement (a live object; records are its frozen form)."""

    sch: Schedule
    phase: Phase
    args_info: list
    trace_json: str
    key: str
    remeasure: bool = False  # the raindrop's incumbent, timed again for drift; never stored
    position: tuple | None = None  # where it lies in the raindrop's decision space

    @classmethod
    def from_schedule(cls, sch: Schedule, phase: Phase, args_info: list | None = None) -> Candidate:
        if args_info is None:
            args_info = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
        text = trace_to_json(sch.trace)
        return cls(sch=sch, phase=phase, args_info=list(args_info), trace_json=text, key=candidate_key(text))

    @property
    def mod(self) -> tvm.IRModule:
        return self.sch.mod

    @property
    def measure_candidate(self) -> ms.MeasureCandidate:
        return ms.MeasureCandidate(self.sch, self.args_info)


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def divisors_with_omega(n: int, r: int) -> list[int]:
    """Divisors of n made of exactly r prime factors (with multiplicity)."""
    result = {1}
    for _ in range(r):
        result = {d * p for d in result for p in set(prime_factors(n // d)) if (n // d) % p == 0}
    return sorted(d for d in result if len(prime_factors(d)) == r)


@dataclass(frozen=True)
class Coordinate:
    kind: str  # "tile" | "categorical" | "location" | "annotation"
    inst: int  # index of the instruction in the trace JSON (without postprocs)
    size: int  # tile: number of levels; categorical: number of choices; annotation: len(values)
    max_innermost: int = 0
    values: tuple[int, ...] = ()  # annotation: ordered candidate values

    @property
    def length(self) -> int:
        """The largest radius worth trying along this coordinate."""
        if self.kind == "categorical":
            return self.size - 1
        if self.kind == "annotation":
            return len(self.values) - 1
        return 3 if self.kind == "location" else 0


def _tile_steps(factors: tuple[int, ...], r: int, max_innermost: int) -> list[tuple[int, ...]]:
    out = []
    n = len(factors)
    for i in range(n):
        for d in divisors_with_omega(factors[i], r):
            for j in range(n):
                if j == i:
                    continue
                new = list(factors)
                new[i] //= d
                new[j] *= d
                if max_innermost > 0 and new[-1] > max_innermost:
                    continue
                out.append(tuple(new))
    return out


class DecisionSpace:
    """The coordinates of one incumbent trace, its neighbours and how to apply them."""

    def __init__(self, mod: tvm.IRModule, postprocs: list, trace: Trace, num_cores: int = 1) -> None:
        self.mod = mod
        self.postprocs = postprocs
        self.num_cores = num_cores
        self.start = self._load(trace)

    def rebase(self, candidate: Candidate) -> tuple:
        """Make ``candidate`` (a neighbour that won) the base; returns its position."""
        return self._load(candidate.sch.trace)

    def _load(self, trace: Trace) -> tuple:
        num_cores = self.num_cores
        self.base = to_py(trace.as_json(remove_postproc=True))
        insts, decisions = self.base
        self.decision_index = {int(i): k for k, (i, _) in enumerate(decisions)}
        coords: list[Coordinate] = []
        for idx, inst in enumerate(insts):
            kind, inputs, attrs = inst[0], inst[1], inst[2]
            if idx in self.decision_index:
                if kind == "SamplePerfectTile":
                    coords.append(Coordinate("tile", idx, int(attrs[0]), int(attrs[1])))
                elif kind == "SampleCategorical":
                    coords.append(Coordinate("categorical", idx, len(attrs[0])))
                elif kind == "SampleComputeLocation":
                    coords.append(Coordinate("location", idx, 0))
            elif kind == "Annotate" and attrs and attrs[0] in ANNOTATIONS and isinstance(inputs[1], int):
                cur = int(inputs[1])
                if attrs[0] == ANNOTATIONS[0]:
                    vals = {num_cores * k for k in (1, 2, 4, 8, 16, 32, 64)}
                else:
                    vals = {4, 8, 16, 32, 64, 128}
                values = tuple(sorted(vals | {cur}))
                coords.append(Coordinate("annotation", idx, len(values), values=values))
        self.coordinates = coords
        return self.position_of(self.base)

    def position_of(self, trace_obj: Any) -> tuple:
        insts, decisions = trace_obj
        by_inst = {int(i): v for i, v in decisions}
        pos = []
        for c in self.coordinates:
            if c.kind == "annotation":
                pos.append(int(insts[c.inst][1][1]))
            else:
                v = by_inst[c.inst]
                pos.append(tuple(int(x) for x in v) if isinstance(v, list) else int(v))
        return tuple(pos)

    @property
    def max_radius(self) -> int:
        lengths = [c.length for c in self.coordinates]
        for c, v in zip(self.coordinates, self.start):
            if c.kind == "tile":
                lengths.append(len(prime_factors(max(1, _prod(v)))))
        return max(lengths or [0])

    def neighbours(self, position: tuple, radius: int) -> list[tuple]:
        """Positions ``radius`` steps away from ``position`` along one coordinate."""
        out = []
        for k, c in enumerate(self.coordinates):
            v = position[k]
            if c.kind == "tile":
                options = _tile_steps(v, radius, c.max_innermost)
            elif c.kind == "categorical":
                options = [v + s for s in (-radius, radius) if 0 <= v + s < c.size]
            elif c.kind == "location":
                options = [v + s for s in (-radius, radius) if v + s >= -2]
            else:
                i = c.values.index(v) if v in c.values else 0
                options = [c.values[i + s] for s in (-radius, radius) if 0 <= i + s < len(c.values)]
            for o in options:
                out.append(position[:k] + (o,) + position[k + 1:])
        return out

    def unroll_depths(self, position: tuple) -> list[tuple[int, tuple]]:
        """``position`` at each other value of its categorical decisions (the unroll depth), one
        decision changed at a time, as (the value's change, the position): for each decision the
        shallower values first, nearest first, then the deeper ones. A jump, where the neighbours step
        one value: a refitted or transferred tile's accumulators stay in registers at one depth and
        go through memory at the next (docs/guide.md, "Register tiles")."""
        out = []
        for k, c in enumerate(self.coordinates):
            if c.kind == "categorical":
                values = [*range(position[k] - 1, -1, -1), *range(position[k] + 1, c.size)]
                out += [(v - position[k], position[:k] + (v,) + position[k + 1:]) for v in values]
        return out

    def register_tiles(self, position: tuple, lanes: int, registers: int | None = None,
                       nearest_parallel: bool = False) -> list[tuple]:
        """Positions whose innermost spatial tiles form a register-blocked micro-kernel.

        The first multi-level-tiled block's spatial loops (4-level tiles, in loop order,
        the last one vectorized) get innermost factors such that the vector loop is 1-4
        vectors of ``lanes`` and the accumulators (vectors x the other innermost factors)
        number between a quarter of ``registers`` and ``registers`` - 4; the middle level
        becomes 1 and the rest goes to the second level. The parallel (outermost) level
        either keeps the position's factors or runs the vector loop's outer part across
        the cores. Positions with fewer parallel chunks than two per core are left out.
        A kept parallel factor that no longer divides its loop is 1, or with
        ``nearest_parallel`` the largest divisor below it.
        """
        if registers is None:  # the ISA's vector registers: 32 with AVX-512's 16 lanes, 16 with AVX2's 8
            registers = 32 if lanes >= 16 else 16
        coords = self.coordinates
        first = next((k for k, c in enumerate(coords) if c.kind == "tile" and c.size == 4), len(coords))
        run = list(itertools.takewhile(lambda k: coords[k].kind == "tile" and coords[k].size == 4,
                                       range(first, len(coords))))
        if len(run) < 2:
            return []
        extent = {k: _prod(position[k]) for k in run}
        vec, others = run[-1], [k for k in run[:-1] if extent[k] > 1]
        if not others:
            return self._one_row_tiles(position, vec, extent[vec], lanes, registers)
        widths = [lanes * m for m in (1, 2, 3, 4) if extent[vec] % (lanes * m) == 0
                  and (coords[vec].max_innermost <= 0 or lanes * m <= coords[vec].max_innermost)]
        lo, hi = max(1, registers // 4), registers - 4
        choices = [[d for d in range(1, hi + 1) if extent[k] % d == 0] for k in others]
        out: list[tuple] = []
        for width in widths:
            for inner in itertools.product(*choices):
                accumulators = width // lanes * _prod(inner)
                if not lo <= accumulators <= hi or sum(f > 1 for f in inner) > 2:
                    continue
                factors = {**dict(zip(others, inner)), vec: width}
                for across_vector in (False, True):
                    new = list(position)
                    for k, f in factors.items():
                        outer = extent[k] // f
                        if across_vector:
                            p0 = outer if k == vec else 1
                        elif outer % position[k][0] == 0:
                            p0 = position[k][0]
                        else:
                            p0 = max((d for d in range(1, position[k][0]) if outer % d == 0), default=1) \
                                if nearest_parallel else 1
                        new[k] = (p0, outer // p0, 1, f)
                    if _prod(tuple(new[k][0] for k in factors)) >= 2 * self.num_cores:
                        out.append(tuple(new))
        return [p for p in dict.fromkeys(out) if p != position]

    def _one_row_tiles(self, position: tuple, vec: int, columns: int, lanes: int, registers: int) -> list[tuple]:
        """``register_tiles`` of a product for one row (a classifier's): its only accumulators are
        output columns, the innermost two levels of the column loop, (middle, vector) = (m, w) with
        w a divisor of the columns from half a vector to 4 vectors (so 1000 columns, which no
        multiple of 16 lanes divides, get some) and m x w columns 2 to a quarter of ``registers``
        vectors; the rest runs across the cores (second level 1: one pass over the input row)."""
        limit = self.coordinates[vec].max_innermost
        out = []
        for w in range(max(1, lanes // 2), 4 * lanes + 1):
            if columns % w or 0 < limit < w:
                continue
            for m in range(1, columns // w + 1):
                block = m * w
                if columns % block == 0 and 2 * lanes <= block <= registers // 4 * lanes \
                        and columns // block >= 2 * self.num_cores:
                    new = list(position)
                    new[vec] = (columns // block, 1, m, w)
                    out.append(tuple(new))
        return [p for p in dict.fromkeys(out) if p != position]

    def apply(self, position: tuple, phase: Phase = Phase.RAINDROP) -> Candidate | None:
        """The candidate at ``position``; None if TVM or a postprocessor rejects it."""
        insts, decisions = copy.deepcopy(self.base)
        by_inst = {int(i): k for k, (i, _) in enumerate(decisions)}
        for c, v in zip(self.coordinates, position):
            if c.kind == "annotation":
                insts[c.inst][1][1] = int(v)
            else:
                decisions[by_inst[c.inst]][1] = list(v) if isinstance(v, tuple) else int(v)
        try:
            sch = Schedule(self.mod)
            Trace.apply_json_to_schedule(json.loads(json.dumps([insts, decisions])), sch)
            sch.enter_postproc()
            if not all(p.apply(sch) for p in self.postprocs):
                return None
        except Exception:  # noqa: BLE001 - TVM rejects some decision combinations
            return None
        cand = Candidate.from_schedule(sch, phase)
        cand.position = position
        return cand


def _prod(xs: tuple[int, ...]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out
