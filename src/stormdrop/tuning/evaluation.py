"""A batch of a task's candidates through the database and the measurer: stored results looked up,
the rest claimed, measured (several tasks' in one batch: ``evaluate_together``) and each committed
as it arrives; and who a tuner is in the claims table (``owner``) and what measured a record
(``tool_versions``)."""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tvm

from stormdrop import __version__
from stormdrop.records import MeasureResult, Record
from stormdrop.report.history import Trial
from stormdrop.tvm_compat.trace_json import to_py

if TYPE_CHECKING:
    from stormdrop.search.space import Candidate
    from stormdrop.tuning.task import TaskSession

log = logging.getLogger("stormdrop")


@functools.cache
def _owner_of(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}"


def owner() -> str:
    """This process in the claims table (``host:pid:nonce``): a process forked from a tuner is an
    owner of its own."""
    return _owner_of(os.getpid())


def tool_versions() -> str:
    return f"stormdrop {__version__}; tvm {tvm.__version__}"


class Evaluation:
    """One batch of a task's candidates being evaluated (``TaskSession.begin``): the stored results
    looked up and the rest claimed on construction; ``commit`` each measured result as it arrives
    (``mods``: the modules to measure, in that order); ``end`` waits for the candidates another
    tuner was measuring and returns every result, ``fresh`` set on the session."""

    def __init__(self, task: TaskSession, cands: list[Candidate]) -> None:
        self.task, self.cands = task, cands
        self.results: list[MeasureResult | None] = [None] * len(cands)
        self.fresh = [False] * len(cands)
        todo, self.retry = [], {}
        db, wid, tgt = task.db, task.entry.workload_id, task.target_key
        for i, c in enumerate(cands):
            rec = None if c.remeasure else db.lookup(wid, tgt, c.key)
            if rec is not None and not rec.retry_due:
                self.results[i] = rec.result
            else:
                todo.append(i)
                if rec is not None:  # a retryable failure (run timeout, runner crash): measured once more
                    self.retry[i] = rec
        self.versions = tool_versions()
        # another tuner on this database measures these right now: take its results, measure the rest
        elsewhere = db.claim(wid, tgt, [cands[i].key for i in todo if not cands[i].remeasure], owner())
        self.waiting = [i for i in todo if not cands[i].remeasure and cands[i].key in elsewhere]
        self.todo = [i for i in todo if i not in self.waiting]
        self.mods = [cands[i].mod for i in self.todo]

    def commit(self, j: int, r: MeasureResult) -> None:
        """The result of ``mods[j]``, committed at once."""
        task, i = self.task, self.todo[j]
        self.results[i] = r
        c = self.cands[i]
        if c.remeasure:
            return
        self.fresh[i] = True
        wid, tgt = task.entry.workload_id, task.target_key
        if i in self.retry:
            task.db.commit_remeasure(self.retry[i], r, time.time(), self.versions)
        else:
            _, new = task.db.commit_record_new(Record(wid, tgt, c.key, c.trace_json, _args_json(c), r, c.phase,
                                                      time.time(), self.versions))
            if not new:  # claims and lookups exist to prevent this; benchmarks/faults.py counts it
                log.warning("%s: candidate %s was measured twice", task.kernel.name, c.key[:12])
        task.db.release(wid, tgt, c.key, owner())
        task.result.trials[c.phase.value] += 1
        if not r.ok:
            task.result.trials["failed"] += 1
            log.debug("%s candidate failed: %s %s", c.phase.value, r.error.value, r.error_msg[:200])
        elif r.mean < task.best:
            task.best = r.mean
        task.result.history.append(Trial(len(task.result.history) + 1, time.monotonic() - task.started,
                                         r.mean if r.ok else None, _finite(task.best), c.phase, r.error))
        if task.progress is not None:
            task.progress.update(1)
            task.progress.set_postfix_str(task.status(c.phase))

    def end(self) -> list[MeasureResult]:
        task = self.task
        for i in self.waiting:
            r, self.fresh[i] = task._measured_elsewhere(self.cands[i])
            self.results[i] = r
            if r.ok and r.mean < task.best:
                task.best = r.mean
        task.fresh = self.fresh
        return self.results  # type: ignore[return-value]


def evaluate_together(tasks: Sequence[TaskSession], batches: Sequence[list[Candidate]]) -> list[list[MeasureResult]]:
    """``TaskSession.evaluate`` of several tasks sharing one measurer, their candidates measured in
    one batch (the builders build several tasks' side by side)."""
    evals = [t.begin(c) for t, c in zip(tasks, batches)]
    slots = [(e, j) for e in evals for j in range(len(e.mods))]  # (its evaluation, its index there) a module
    if slots:
        tasks[0].measurer.measure([e.task.entry.shash for e, _ in slots], [e.mods[j] for e, j in slots],
                                  on_result=lambda n, r: slots[n][0].commit(slots[n][1], r))
    return [e.end() for e in evals]


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _args_json(c: Candidate) -> str:
    import json

    return json.dumps([to_py(a.as_json()) for a in c.args_info])
