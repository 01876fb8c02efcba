"""How each task is searched, as one value built once (by the CLI or a caller) and only read
below: which phases run, the storm's and the raindrop's parameters, reuse and its donors. The same
for a kernel and for every task of a model."""

from __future__ import annotations

from dataclasses import dataclass, field

from stormdrop.records import Phase
from stormdrop.search.phases import PHASES
from stormdrop.search.raindrop import RaindropConfig
from stormdrop.search.storm import StormConfig


@dataclass(frozen=True)
class SearchOptions:
    """How each task is searched. ``phases``: which of reuse, storm and raindrop run, in that
    order (``(Phase.REUSE,)``: transfer only; with no storm, reuse measures up to ``reuse``
    transfers of its own). ``reuse``: at most this many same-class donor workloads whose best
    schedules are transferred before the storm, out of its budget. ``reuse_from``: more databases
    to draw donors from, opened read only. ``hub``: the shipped schedule hub of the target's ISA
    class is a donor too (True), or not (False), or the hub file at this path
    (``storage.hub``; read only, never written)."""

    phases: tuple[Phase, ...] = PHASES
    storm: StormConfig = field(default_factory=StormConfig)
    raindrop: RaindropConfig = field(default_factory=RaindropConfig)
    reuse: int = 8
    reuse_from: tuple[str, ...] = ()
    hub: bool | str = True

    @property
    def hub_source(self) -> bool | str:
        """The hub a run opens: none when no reuse runs (nothing would read it)."""
        return self.hub if Phase.REUSE in self.phases and self.reuse > 0 else False

    def __post_init__(self) -> None:  # lists from callers become tuples: the value stays frozen
        object.__setattr__(self, "phases", tuple(self.phases))
        object.__setattr__(self, "reuse_from", tuple(str(p) for p in self.reuse_from))
