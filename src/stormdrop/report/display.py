"""The live display of a model tune: global progress with ETA, one row per task, the model's estimate.

On a terminal the block is redrawn in place (at most a few times a second) and log
lines are printed above it, never through it. Elsewhere (CI logs, pipes) it prints one
plain line per batch, without control characters.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class TaskLine:
    """What the display shows of one task."""

    name: str
    weight: int
    phase: str
    best_s: float  # inf: no valid schedule yet
    trials: int
    failed: int


def eta_s(used: int, elapsed: float, cap: float, remaining_s: float) -> float | None:
    """Seconds left: the time budget's remainder, or the trial budget at the rate so far, whichever ends first."""
    by_trials = elapsed / used * (cap - used) if used and math.isfinite(cap) else math.inf
    left = min(by_trials, remaining_s)
    return None if not math.isfinite(left) else max(0.0, left)


def estimate_s(tasks: Sequence[TaskLine]) -> tuple[float, int]:
    """(sum of weight x best over the tasks that have one, how many have one)."""
    done = [t for t in tasks if math.isfinite(t.best_s)]
    return sum(t.weight * t.best_s for t in done), len(done)


def _clock(secs: float | None) -> str:
    if secs is None:
        return "--:--"
    secs = int(secs)
    return f"{secs // 3600}:{secs % 3600 // 60:02d}:{secs % 60:02d}" if secs >= 3600 else f"{secs // 60}:{secs % 60:02d}"


def headline(used: int, cap: float, elapsed: float, eta: float | None, tasks: Sequence[TaskLine]) -> str:
    est, n = estimate_s(tasks)
    failed = sum(t.failed for t in tasks)
    budget = f"{used}/{int(cap)} trials" if math.isfinite(cap) else f"{used} trials"
    model = f"est. {est * 1e3:.3f} ms" + ("" if n == len(tasks) else f" ({n}/{len(tasks)} tasks)") if n else "est. n/a"
    return f"[{budget}] elapsed {_clock(elapsed)} ETA {_clock(eta)} | {model} | {failed} failed"


def task_row(t: TaskLine) -> str:
    best = f"{t.best_s * 1e6:10.1f} us" if math.isfinite(t.best_s) else f"{'-':>13}"
    return f"  {t.name[:40]:40s} {t.phase:8s} {best} {t.trials:5d} trials {t.failed:3d} failed"


class ModelDisplay:
    """Shows a model tune's state after each batch: ``show(...)``; ``close()`` at the end."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, max_rows: int = 12,
                 min_interval_s: float = 0.25) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.max_rows, self.min_interval_s = max_rows, min_interval_s
        self._drawn = 0  # lines of the block on screen
        self._last = -math.inf
        self._block: list[str] = []
        self._handler: logging.Handler | None = None
        if self.live:  # log lines go above the block
            self._handler = _AboveTheBlock(self)
            logger = logging.getLogger("stormdrop")
            self._saved = logger.handlers[:]
            self._handler.setFormatter(logging.Formatter("%(message)s"))
            logger.handlers[:] = [self._handler]

    def show(self, used: int, cap: float, elapsed: float, eta: float | None, tasks: Sequence[TaskLine],
             current: int | None = None) -> None:
        if not self.live:
            t = tasks[current] if current is not None else None
            tail = "" if t is None else f" | {task_row(t).strip()}"
            self.stream.write(headline(used, cap, elapsed, eta, tasks) + tail + "\n")
            self.stream.flush()
            return
        now = time.monotonic()
        if now - self._last < self.min_interval_s:
            return
        self._last = now
        order = sorted(range(len(tasks)), key=lambda i: -(tasks[i].weight * tasks[i].best_s
                                                            if math.isfinite(tasks[i].best_s) else math.inf))
        rows = [task_row(tasks[i]) for i in order[: self.max_rows]]
        if len(tasks) > self.max_rows:
            rows.append(f"  ... and {len(tasks) - self.max_rows} more tasks")
        self._block = [headline(used, cap, elapsed, eta, tasks), *rows]
        self._redraw()

    def write(self, text: str) -> None:
        """A log line, printed above the block."""
        self._clear()
        self.stream.write(text.rstrip("\n") + "\n")
        self._draw()

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self._drawn = 0

    def _draw(self) -> None:
        if self._block:
            self.stream.write("\n".join(self._block) + "\n")
            self._drawn = len(self._block)
        self.stream.flush()

    def _redraw(self) -> None:
        self._clear()
        self._draw()

    def close(self) -> None:
        if self._handler is not None:
            logging.getLogger("stormdrop").handlers[:] = self._saved
            self._handler = None


class _AboveTheBlock(logging.Handler):
    def __init__(self, display: ModelDisplay) -> None:
        super().__init__()
        self.display = display

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.display.write(self.format(record))
        except Exception:  # noqa: BLE001 - logging never breaks the tune
            self.handleError(record)
