"""The one driver: a kernel is a model with one task (what the budget allows: ``tuning.budget``).

``drive`` steps the tasks' tuners (the gradient task scheduler picks the next one)
until a budget is spent or every task is done, then finishes each task and
verifies their best records (``verify_bests``). ``tune_kernel`` drives one task,
``tune_model`` a model's tasks; both share this loop, the ledger of measured
trials and the verification.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tvm.target import Target

from stormdrop.search.storm import StormConfig
from stormdrop.storage.database import Database, default_db_path
from stormdrop.storage.donors import open_donors
from stormdrop.storage.hub import open_hub
from stormdrop.tuning.budget import Budget, Ledger
from stormdrop.tuning.evaluation import evaluate_together
from stormdrop.tuning.scheduler import UNITS, WARM_UPS, GradientScheduler, TaskState
from stormdrop.tuning.task import TaskSession, TaskTuner
from stormdrop.tuning.verify import verify_bests


@contextlib.contextmanager
def donor_databases(reuse_from: Sequence[str], target: Target | None = None,
                    hub: bool | str = False) -> Iterator[list[Database]]:
    """A run's donor databases (``reuse_from``, read only, then the schedule hub for ``target``:
    ``hub`` as ``storage.hub.hub_path`` reads it), closed when the run ends."""
    donors: list[Database] = []
    try:
        donors = open_donors(reuse_from)
        if hub is not False and target is not None and (found := open_hub(target, hub)) is not None:
            donors.append(found)
        yield donors
    finally:
        for d in donors:
            d.close()


@contextlib.contextmanager
def run_database(db: Any) -> Iterator[Database]:
    """A run's database: ``db``, a path, None for the per-user one, or an open ``Database``
    (left open), closed when the run ends."""
    database = Database(db or default_db_path()) if not isinstance(db, Database) else db
    try:
        yield database
    finally:
        if database is not db:
            database.close()


@contextlib.contextmanager
def run_databases(db: Any, reuse_from: Sequence[str], target: Target | None = None,
                  hub: bool | str = False) -> Iterator[tuple[Database, list[Database]]]:
    """A run's database (``run_database``) and its donor databases (``donor_databases``), the
    donors opened first."""
    with donor_databases(reuse_from, target, hub) as donors, run_database(db) as database:
        yield database, donors


def measured(session: TaskSession) -> int:
    """Candidates this run measured for the task (reuse, storm, raindrop; failures included)."""
    t = session.result.trials
    return t["reuse"] + t["storm"] + t["raindrop"]


def most_costly(states: list[TaskState], exhausted: set[int], extensions: dict[int, int] | None = None) -> int | None:
    """The task with the largest weight x best latency, over one more than the extensions it had
    (``extensions``: so that one task does not take every extension), that can still find something new."""
    n = extensions or {}
    live = [i for i, t in enumerate(states) if i not in exhausted and math.isfinite(t.best)]
    return max(live, key=lambda i: states[i].weight * states[i].best / (1 + n.get(i, 0)), default=None)


def first_rounds_together(i: int, after: Sequence[int], tuners: Sequence[TaskTuner], sessions: Sequence[TaskSession],
                          ledger: Ledger, waiting: int) -> list[tuple[int, float, int]]:
    """Task ``i``'s first round and, while the batch would leave builders idle (a short budget's
    first rounds of a candidate or two), the first rounds of the tasks waiting ``after`` it, in
    the scheduler's order, measured in one batch: the builders build them side by side. Each is
    sized as it would be alone (``Ledger.limit``, the candidates proposed before it pending). A
    task proposed later in the batch cannot take those before it as reuse donors: a batch is no
    larger than the builders. Returns (task, its share of the seconds, candidates measured) each."""
    clock = ledger.budget.clock
    builders = sessions[i].measurer.builders
    group: list[int] = []
    batches: list[list] = []
    propose_s: list[float] = []
    pending = 0  # candidates proposed for the batch so far
    for j in (i, *after):
        if pending >= builders:
            break
        t0 = clock()
        cands = tuners[j].propose(ledger.limit(True, waiting - len(group), pending)) or []
        group.append(j)
        batches.append(cands)
        pending += len(cands)
        propose_s.append(clock() - t0)
    before = [measured(sessions[j]) for j in group]
    live = [n for n, j in enumerate(group) if not tuners[j].done]
    t0 = clock()
    results = evaluate_together([sessions[group[n]] for n in live], [batches[n] for n in live])
    for n, res in zip(live, results):
        tuners[group[n]].tell(batches[n], res)
    measure_s = clock() - t0
    total = max(sum(len(batches[n]) for n in live), 1)
    return [(j, propose_s[n] + measure_s * len(batches[n]) / total, measured(sessions[j]) - before[n])
            for n, j in enumerate(group)]


def drive(tuners: Sequence[TaskTuner], sessions: Sequence[TaskSession], weights: Sequence[int], budget: Budget, *,
          used: int = 0, seed: int = 0, storm: StormConfig | None = None, warm_up: str = WARM_UPS[0],
          unit: str = UNITS[0], on_step: Callable[[int, int], None] | None = None) -> str:
    """Tune until ``budget`` is spent or every task is done; then finish and verify every task.

    ``used``: trials already spent against ``budget.trials`` (earlier runs' measurements of these
    tasks: a resumed run measures no more than an uninterrupted one). ``warm_up``: the order of the
    tasks' first rounds (``scheduler.WARM_UPS``); ``unit``: what a task's diminishing returns count
    (``scheduler.UNITS``: its rounds, or the trials stored for it, every run's). ``on_step(i, used)`` hears
    each batch. Returns why tuning stopped.
    """
    states = [TaskState(w, max(s.kernel.flops, 1), s.kernel.op_class) for s, w in zip(sessions, weights)]
    sched = GradientScheduler(states, seed=seed, warm_up=warm_up, unit=unit)

    def trials_of(session: TaskSession) -> int | None:  # read from the database only where counted
        return session.spent() if unit == "trials" else None

    for i, session in enumerate(sessions):
        if math.isfinite(session.best):
            # an earlier run of these tasks gave this one its warm-up round: a resumed run goes on
            # as the uninterrupted one would have, with the tasks it never reached (without this,
            # a resumed run could spend the rest of --trials before a last task got any trial)
            sched.tell(i, session.best, trials=trials_of(session))
    exhausted: set[int] = set()
    extended: dict[int, int] = {}
    extensions: dict[int, int] = {}  # how many each task had
    ledger = Ledger(budget, sessions, used)
    clock = budget.clock

    def waiting() -> int:  # tasks yet to have their first round
        return sum(t.rounds == 0 and not t.finished for t in states)

    while not (stopped_by := ledger.spent(waiting())):
        i, extending = sched.next_task(), False
        if i is None and budget.extend:
            # the per-task cap is a default, not a reason to stop with time left: the
            # task with the largest weight x latency gets another storm round + raindrop
            i = most_costly(states, exhausted, extensions)
            if i is not None:
                if stopped_by := ledger.spent(waiting(), extending=True):
                    break
                extending = True
                extensions[i] = extensions.get(i, 0) + 1
                batch = (storm or StormConfig()).batch_size
                tuners[i].extend(batch, batch)
                states[i].finished = False
                extended[i] = measured(sessions[i])
        if i is None:
            if budget.extend:
                stopped_by = "every task exhausted (another storm round found nothing new)"
            elif budget.per_task_cap is not None:
                stopped_by = f"every task done (converged or at its cap of {budget.per_task_cap} trials)"
            else:
                stopped_by = "every task done"
            break
        first = states[i].rounds == 0
        if first and getattr(getattr(sessions[i], "measurer", None), "builders", 1) > 1:
            group = first_rounds_together(i, [j for j in sched.waiting() if j != i], tuners, sessions, ledger,
                                          waiting())
        else:
            before, t0 = measured(sessions[i]), clock()
            tuners[i].step(limit=ledger.limit(first, waiting()))
            group = [(i, clock() - t0, measured(sessions[i]) - before)]
        for j, seconds, candidates in group:
            ledger.tell_step(seconds, candidates, first=first, extending=extending)
            sessions[j].result.tuning_s += seconds  # each task's own share of the wait
            if tuners[j].done and extended.get(j) == measured(sessions[j]):
                exhausted.add(j)  # its extension found nothing new to measure
            sched.tell(j, sessions[j].best, finished=tuners[j].done, trials=trials_of(sessions[j]))
            if on_step is not None:
                on_step(j, ledger.used)
    for tuner, session in zip(tuners, sessions):
        t0 = clock()
        tuner.finish()
        session.result.tuning_s += clock() - t0
    t0 = clock()
    verify_bests(sessions)
    share = (clock() - t0) / max(len(sessions), 1)  # each task's equal share of the batch
    for session, weight in zip(sessions, weights):
        session.result.stored = session.tally()
        session.result.tuning_s += share
        session.result.weight = weight
    return stopped_by
