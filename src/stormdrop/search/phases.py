"""The tuning phases a run chooses (``--phases``): always in the order reuse, storm, raindrop;
and the interface every phase implements (``SearchPhase``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from stormdrop.errors import SpecError
from stormdrop.records import MeasureResult, Phase

if TYPE_CHECKING:
    from stormdrop.search.space import Candidate

PHASES = (Phase.REUSE, Phase.STORM, Phase.RAINDROP)


def parse_phases(text: str) -> tuple[Phase, ...]:
    """``--phases``: a comma list of reuse, storm, raindrop, in that order (SpecError otherwise)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    order = [p.value for p in PHASES]
    if not names or any(n not in order for n in names) or len(set(names)) != len(names) \
            or names != sorted(names, key=order.index):
        raise SpecError(f"--phases: a comma list of {', '.join(order)} in that order, got {text!r}")
    return tuple(Phase(n) for n in names)


def check_samples(measure: object, phases: Sequence[Phase], exploit_trials: int) -> None:
    """A raindrop compares samples with a t-test: refuse fewer than 2 per candidate (SpecError)."""
    repeat = getattr(measure, "repeat", 2)
    if Phase.RAINDROP in phases and exploit_trials > 0 and repeat < 2:
        raise SpecError(f"--repeat must be >= 2: the raindrop's t-test compares samples, got {repeat}")


class SearchPhase(Protocol):
    """What a task's tuner asks of each phase (reuse: ``search.reuse_phase.Reuse``, the storm:
    ``search.storm.Storm``, the raindrop: ``search.raindrop.Raindrop``): ``propose(limit)`` the
    next batch of at most ``limit`` candidates (None: no limit), or None once the phase is over;
    then ``tell`` it that batch's results in the same order, ``fresh`` saying which of them were
    measured for it (a stored result was paid for when it was measured). A phase measures and
    stores nothing."""

    def propose(self, limit: int | None = None) -> list[Candidate] | None: ...

    def tell(self, candidates: list[Candidate], results: list[MeasureResult],
             fresh: Sequence[bool] | None = None) -> None: ...
