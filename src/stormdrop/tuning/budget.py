"""How much a tuning run may spend, in one place: the trial and time ``Budget`` the driver stops
on, the time a run still needs once its search stops (``finishing_s``, ``next_step_s``), how
first rounds shrink so that every task is reached before the deadline (``first_round_limit``),
and how a model's trial cap is shared among its tasks (``first_batch_size``, ``storm_share``,
``lead_batch``) and its compiles counted (``model_compiles``); and the ``Ledger`` a run keeps of
what it spent, which the driver tells after each step and asks before the next. Rules and
accounts: nothing here measures, stores or sleeps."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stormdrop.tuning.task import TaskSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """When the driver stops: ``trials`` measured in all (a hard cap; None: none), the wall-clock
    ``deadline`` (on ``clock``; inf: none). ``extend``: with time left after every task is done,
    the costliest task gets another storm round and raindrop (``TaskTuner.extend``). ``clock``:
    what the driver reads the time from (``time.monotonic``; a test passes a simulated one)."""

    trials: int | None = None
    deadline: float = math.inf
    extend: bool = False
    per_task_cap: int | None = None  # said in the stop reason only
    builds_after: int = 0  # builds after verification that the deadline covers (a model's compile: one a task)
    clock: Callable[[], float] = time.monotonic

    def spent(self, used: int, reserve_s: float = 0.0) -> str:
        """Which budget is spent ("" while neither); ``reserve_s``: the time still needed after the
        search (see ``finishing_s``), so that the whole run ends by the deadline."""
        if self.trials is not None and used >= self.trials:
            return "the trial budget"
        return "the time budget" if self.clock() + reserve_s >= self.deadline else ""


def finishing_s(sessions: Sequence[TaskSession], step_s: float, builds_after: int = 0) -> float:
    """Wall seconds a run still needs once its search stops: ``step_s``, a step that may be under
    way when the deadline comes (``next_step_s``), every task's best built and measured once more
    in one batch (``verify_bests``), and ``builds_after`` kernels compiled into the model, as
    measured by the task's measurer so far (without it a long model's tune ends past its budget)."""
    measurer = getattr(sessions[0], "measurer", None) if sessions else None
    if measurer is None:
        return step_s
    return step_s + measurer.batch_s(len(sessions)) + measurer.compile_s(builds_after)


def next_step_s(steps: Sequence[float], extension_steps: Sequence[float], extending: bool) -> float:
    """How long the next step may take: the longest of the last 8; an extension's first step (a
    storm round: evolution on the cost model, then its batch) the longest extension step so far,
    or before any the longest step but the warm-up (an extension's first step can take several
    times a raindrop step: taken as one, a run ended past its budget)."""
    if not extending:
        return max(steps[-8:], default=0.0)
    return max(extension_steps or steps[1:], default=0.0)


def first_round_limit(waiting: int, first_rounds: Sequence[tuple[float, int]], time_left: float,
                      floor_s: float = 0.0) -> int | None:
    """Candidates each of the ``waiting`` tasks not yet reached may measure in its first round so
    that all of them fit in ``time_left`` (the deadline less the finishing), scaled from the first
    rounds so far ((seconds, candidates) each): as many candidates as the largest of them (a cheap
    task's two transfers say nothing of the next task's storm batch), each taking what one took but
    in the very first round, which pays the gateway's warm-up (an order of magnitude slower than the
    next ones), and at least ``floor_s``, the measurer's own estimate of a candidate; None while
    full rounds fit. At least one: a task never reached runs as a naive loop nest. (Without the
    limit, a many-task model given a short budget for transfers and raindrop ran past its deadline
    on first rounds; scaled from the mean round, a 62-task model's first cheap round let the next
    task take a full storm batch, a tenth of a 60-s budget.)"""
    per = max(first_round_candidate_s(first_rounds), floor_s)
    if not waiting or not first_rounds or per <= 0:
        return None
    if waiting * max(n for _, n in first_rounds) * per <= time_left:
        return None
    return max(1, int(max(time_left, 0.0) / (waiting * per)))


def first_round_candidate_s(first_rounds: Sequence[tuple[float, int]]) -> float:
    """Seconds a first-round candidate takes, from the first rounds ((seconds, candidates) each) but
    the very first, which pays the gateway's warm-up; 0 before any other."""
    rounds = first_rounds[1:]
    return sum(s for s, _ in rounds) / max(sum(n for _, n in rounds), 1)


def measurer_candidate_s(measurer: object) -> float:
    """Wall seconds a candidate takes in a batch that keeps the ``measurer``'s builders busy (its
    own estimate, 0 before anything was measured or without a measurer)."""
    if measurer is None:
        return 0.0
    builders = max(1, int(getattr(measurer, "builders", 1)))
    return measurer.batch_s(builders) / builders


def cap_reaching_every_task(trials: int | None, used: int, unreached: int) -> int | None:
    """A model's global trial cap, raised where it cannot give each of the ``unreached`` tasks (no
    schedule stored yet) one trial after the ``used`` ones of earlier runs: a task left without a
    schedule runs as a naive loop nest, often slower than the rest of the model together, so a cap
    that small would buy a model many times slower than an untuned runtime for a few trials
    saved. ``trials`` itself otherwise (None: no cap)."""
    if trials is None or trials >= used + unreached:
        return trials
    return used + unreached


def first_batch_size(trials: int | None, num_tasks: int, batch: int) -> int | None:
    """A smaller first batch per task when the budget cannot give every task a full one: half
    of each task's share of ``trials`` (at least one), the other half left for its raindrop
    (``storm_share``) and for the tasks the gradient scheduler finds costliest: a cap of under
    four trials a task spent in equal first rounds gives the task that takes a fifth of the
    model's time no more than the smallest. A task whose one candidate failed gets a second
    round (``GradientScheduler``, ``TaskTuner``).

    A task left without any schedule runs as a naive loop nest, often slower than the
    rest of the model together (a model with more tasks than ``trials / batch`` would leave
    some unreached), so every task is reached first.
    """
    if trials is None or num_tasks <= 0 or trials >= num_tasks * batch:
        return None
    return max(1, trials // (2 * num_tasks))


def storm_share(trials: int | None, num_tasks: int, trials_per_task: int, first_batch: int | None) -> int:
    """Storm trials of each task: half of ``trials_per_task``, or where the global ``trials`` cap
    cannot give every task that many, half of its share of the cap (at least its first batch), so
    that the raindrop always has the other half (storms of a full half per-task cap would take a
    small cap whole: no raindrop at all)."""
    half = max(1, trials_per_task // 2)
    if trials is None or num_tasks <= 0 or trials >= num_tasks * trials_per_task:
        return half
    return min(half, max(first_batch or 1, trials // (2 * num_tasks)))


def raindrop_batch(trials: int | None, num_tasks: int, batch: int) -> int:
    """The raindrop's batch (candidates between two moves) under a global ``trials`` cap: a
    task's share of the cap rounded up to an even count (one per builder on two cores), at least
    2, at most ``batch`` (where ``RaindropConfig.batch_by_share`` says so). Where the cap is a few
    trials a task, full batches go to the costliest few tasks, and the rest keep the first schedule
    reuse gave them."""
    if trials is None or num_tasks <= 0:
        return batch
    return min(batch, max(2, 2 * math.ceil(trials / (2 * num_tasks))))


def lead_batch(first_batch: int | None, heirs: int, batch: int, samples: int) -> int | None:
    """The first storm batch of a lead: a task that starts with no donor (reuse found none) while
    ``heirs`` other tasks of related classes would take its schedule (``search.donors.heirs``). Where
    first batches are shrunk (``first_batch_size``: a sample or two a task), a lead's one draw would
    be every heir's start: it measures ``samples`` (``StormConfig.lead_samples``) instead, one per
    heir at most, no more than a full ``batch``. None where nothing changes (full first batches, no
    heirs, ``samples`` no larger than the first batch)."""
    if first_batch is None or heirs <= 0:
        return None
    n = min(batch, samples, first_batch * (1 + heirs))
    return n if n > first_batch else None


class Ledger:
    """What a run has spent, as the driver tells it after each step (``tell_step``): trials used
    against ``budget.trials`` (``used``: those earlier runs measured on these tasks count too), each
    step's wall seconds, the first rounds' (seconds, candidates), the extensions' first steps. It
    answers what the budget rules above make of them: whether the budget is spent, the time to keep
    for the finish, and how many candidates a task's next step may measure."""

    def __init__(self, budget: Budget, sessions: Sequence[TaskSession], used: int = 0) -> None:
        self.budget, self.sessions, self.used = budget, sessions, used
        self.steps: list[float] = []  # wall seconds of each step
        self.extension_steps: list[float] = []  # of each extension's first step
        self.first_rounds: list[tuple[float, int]] = []  # (seconds, candidates) of the tasks' first rounds
        self.told: set[str] = set()  # the budgets the user was told cannot reach every task

    def finish_s(self, extending: bool = False) -> float:
        """Wall seconds the run needs once its search stops (``finishing_s``), the next step included."""
        return finishing_s(self.sessions, next_step_s(self.steps, self.extension_steps, extending),
                           self.budget.builds_after)

    def spent(self, waiting: int, extending: bool = False) -> str:
        """Which budget is spent ("" while neither). Until every task has had its first round
        (``waiting``: tasks yet to have one), only the deadline itself stops the search: a task never
        reached runs as a naive loop nest, often slower than the rest of the model together (the
        first rounds shrink instead: ``limit``)."""
        return self.budget.spent(self.used, self.finish_s(extending) if extending or not waiting else 0.0)

    def limit(self, first: bool, waiting: int, pending: int = 0) -> int | None:
        """Candidates the next step may measure (None: no limit): what is left of the trial cap, less
        one for each other task still ``waiting`` for its first round when this is a ``first`` one (at
        least one), and for a ``first`` round what lets the waiting ones all fit in the time left
        (``first_round_limit``). A task never reached runs as a naive loop nest: the reserve lets a cap of
        at least one trial a task reach every task. ``pending``: candidates other tasks proposed for
        the same batch, not yet told (``tell_step``)."""
        caps = []
        if self.budget.trials is not None:  # a hard cap
            left = self.budget.trials - self.used - pending
            caps.append(max(1, left - (waiting - 1)) if first else left)
            if first and left < waiting:
                self._tell_untuned("trial", f"{waiting} tasks not reached yet and {left} trials left; "
                                            f"{waiting - left} stay untuned", "--trials of at least the model's task count")
        if first and math.isfinite(self.budget.deadline):
            left = self.budget.deadline - self.budget.clock() - self.finish_s()
            floor = measurer_candidate_s(getattr(self.sessions[0], "measurer", None)) if self.sessions else 0.0
            shrunk = first_round_limit(waiting, self.first_rounds, left, floor)
            caps += [shrunk] if shrunk else []
            need = waiting * max(first_round_candidate_s(self.first_rounds), floor)  # one candidate each
            if shrunk == 1 and need > left:
                self._tell_untuned("time", f"{waiting} tasks not reached yet need about {need:.0f} s (one candidate "
                                           f"each) and {max(left, 0.0):.0f} s are left; those the deadline comes "
                                           "before stay untuned", "a longer --time-budget")
        return min(caps, default=None)

    def _tell_untuned(self, budget: str, why: str, remedy: str) -> None:
        """Warn once per ``budget`` ("trial", "time") that it cannot reach every task: the tasks it does
        not reach stay untuned (naive loop nests)."""
        if budget not in self.told:
            self.told.add(budget)
            size = "too small" if budget == "trial" else "too short"
            log.warning("%s budget %s for this model: %s (naive loop nests, often slower than the rest of the "
                        "model): %s avoids it", budget, size, why, remedy)

    def tell_step(self, seconds: float, candidates: int, *, first: bool, extending: bool) -> None:
        """A step took ``seconds`` and measured ``candidates`` (a task's ``first`` round, or an
        ``extending`` extension's first step)."""
        self.steps.append(seconds)
        if extending:
            self.extension_steps.append(seconds)
        if first and candidates > 0:
            self.first_rounds.append((seconds, candidates))
        self.used += candidates


def model_compiles(in_model_candidates: int) -> int:
    """Compiles of the model after tuning: one, or with an in-model choice among k candidates,
    one per rank and one of the choice."""
    return 1 if in_model_candidates < 2 else in_model_candidates + 1
