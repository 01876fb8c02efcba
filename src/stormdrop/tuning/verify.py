"""Verification after the search: each task's best stored schedule rebuilt from its trace and
measured again, the tasks' candidates in one batch a round, so that the builders build several
tasks' at once (one task at a time took a sixth of a short model budget)."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence

import tvm

from stormdrop.records import MeasureResult, Record
from stormdrop.storage.database import candidate_key
from stormdrop.tuning.evaluation import tool_versions
from stormdrop.tuning.task import TaskSession

log = logging.getLogger("stormdrop")
UNTRUSTED = 2.0  # an imported best re-measured this many times slower than stored is not its stored time


def verify_bests(tasks: Sequence[TaskSession], k: int = 8) -> None:
    """Rebuild each task's best stored schedules from their traces and measure them again; the first
    that checks out wins, with its re-measured latency (a stored best is the luckiest of many noisy
    samples). ``verified`` only when outputs were checked (``MeasureConfig.check_correctness``);
    ``fallbacks``: how many better records failed (said in the table and the JSON). A record that
    fails for good (a wrong result, a build or run error: not a timeout) is stored as failed, so it is
    never a best again: the next run, and ``bench``, start from the next one. At most ``k`` tried a
    task; round r measures the r-th try of every task not yet verified, tasks sharing a measurer in
    one batch.

    An imported time is not trusted over its re-measurement: a record imported from another tuner
    that checks out but runs more than ``UNTRUSTED`` times slower than stored (a fake-fast row,
    another machine) gets the re-measured time stored, and the next record is tried; the faster of
    the two re-measured wins. stormdrop's own records keep their times (a small kernel's re-timing
    can vary that much; a run's records stay as they were committed)."""
    records = [t.db.best(t.entry.workload_id, t.target_key, k=k) for t in tasks]
    rank = [0] * len(tasks)
    spare: dict[int, tuple[Record, MeasureResult, int]] = {}  # task -> a checked record slower than stored
    waiting = list(range(len(tasks)))
    while waiting:
        batches: dict[int, list[tuple[int, Record, tvm.IRModule]]] = {}  # id(measurer) -> (task, record, module)
        for i in waiting:
            tried = _next_replayable(tasks[i], records[i], rank[i])
            rank[i] = tried[0]
            if tried[1] is not None:
                batches.setdefault(id(tasks[i].measurer), []).append((i, tried[1], tried[2]))
            elif i in spare:
                _settle(tasks[i], *spare.pop(i))
        waiting = []
        for batch in batches.values():
            measurer = tasks[batch[0][0]].measurer
            checks = measurer.measure([tasks[i].entry.shash for i, _, _ in batch], [mod for _, _, mod in batch])
            for (i, rec, _), check in zip(batch, checks):
                if check.ok and rec.imported and check.mean > UNTRUSTED * rec.result.mean:
                    tasks[i].db.commit_remeasure(rec, check, time.time(), tool_versions())
                    log.warning("%s: best record %s ran %.1fx slower than stored; its re-measured time stored",
                                tasks[i].kernel.name, rec.record_id, check.mean / rec.result.mean)
                    if i not in spare or check.mean < spare[i][1].mean:
                        spare[i] = (rec, check, rank[i])
                elif check.ok and i in spare and spare[i][1].mean < check.mean:
                    _settle(tasks[i], *spare.pop(i))
                    continue
                elif _settle(tasks[i], rec, check, rank[i]):
                    spare.pop(i, None)
                    continue
                rank[i] += 1
                waiting.append(i)


def _next_replayable(task: TaskSession, records: list[Record], rank: int) -> tuple[int, Record | None, tvm.IRModule | None]:
    """The first of ``records`` from ``rank`` on whose trace replays: (its rank, it, its module);
    (len, None, None) when none does."""
    for r in range(rank, len(records)):
        try:
            return r, records[r], task.candidate_of(records[r], records[r].phase).mod
        except Exception as err:  # noqa: BLE001
            log.warning("best record %s does not replay: %s", records[r].record_id, err)
    return len(records), None, None


def _settle(task: TaskSession, rec: Record, check: MeasureResult, rank: int) -> bool:
    """The task's result from a verified record (True), or the record's failure noted (False)."""
    if check.ok:
        config = getattr(task.measurer, "config", None)
        # the median of the samples: one sample stalled (a fresh gateway's workers starting up)
        # can make a small kernel's mean many times its time
        task.result.latency_s = check.median
        task.result.verified = config is None or config.check_correctness
        task.result.trace_json = rec.trace_json
        task.result.fallbacks = rank
        if rank:
            log.warning("%s: the %d best record(s) failed verification; using record %s", task.kernel.name,
                        rank, rec.record_id)
        return True
    log.warning("best record %s failed verification: %s", rec.record_id, check.error_msg)
    if not check.error.retryable:
        task.db.commit_remeasure(rec, check, time.time(), tool_versions())
    return False


def records_after_verified(task: TaskSession, n: int) -> list[Record]:
    """The task's next ``n`` records by stored time after its verified best (``verify_bests``);
    records ranked above that one failed verification and are never among them."""
    wid, tkey = task.entry.workload_id, task.target_key
    verified = task.db.lookup(wid, tkey, candidate_key(task.result.trace_json))
    records = task.db.best(wid, tkey, k=task.result.fallbacks + n + 1)
    return [r for r in records
            if verified is None or (r.mean, r.record_id) > (verified.mean, verified.record_id)][:n]


def fastest_in_turns(task: TaskSession, k: int) -> None:
    """Of the task's verified best record and the ``k - 1`` next by stored time, keep the one that
    runs fastest when they are timed side by side, in turns (one batch, in order and then in reverse:
    the median of each one's samples). A kernel's stored times come from different moments of the
    run, and on a machine whose speed drifts the stored best is often a record timed in a fast
    spell rather than the fastest schedule (benchmarks/RESULTS.md, "Final pick"). A record that
    fails here is passed over (verification already checked the first)."""
    if k < 2 or not task.result.trace_json:
        return
    first = task.db.lookup(task.entry.workload_id, task.target_key, candidate_key(task.result.trace_json))
    if first is None:
        return
    chosen = [first, *records_after_verified(task, k - 1)]
    mods = []
    for rec in chosen:
        try:
            mods.append(task.candidate_of(rec, rec.phase).mod)
        except Exception as err:  # noqa: BLE001 - a trace that no longer replays is passed over
            log.warning("record %s does not replay: %s", rec.record_id, err)
            mods.append(None)
    turns = [i for i, m in enumerate(mods) if m is not None]
    if len(turns) < 2:
        return
    order = turns + turns[::-1]
    results = task.measurer.measure(task.entry.shash, [mods[i] for i in order])
    samples: dict[int, list[float]] = {}
    for i, res in zip(order, results):
        if res.ok:
            samples.setdefault(i, []).extend(res.run_secs)
    if not samples:
        return
    best = min(samples, key=lambda i: statistics.median(samples[i]))
    task.result.latency_s = statistics.median(samples[best])
    task.result.trace_json = chosen[best].trace_json
    if best:
        log.info("%s: record %s ran fastest in turns with the %d best (%.1f us)", task.kernel.name,
                 chosen[best].record_id, len(turns), task.result.latency_s * 1e6)
