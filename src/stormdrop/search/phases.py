"""The tuning phases a run chooses (``--phases``): always in the order reuse, storm, raindrop."""

from __future__ import annotations

from collections.abc import Sequence

from stormdrop.errors import SpecError
from stormdrop.records import Phase

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
