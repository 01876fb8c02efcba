"""One kernel: a model with one task (``tune_kernel``), driven by the one driver.

Reuse, storm and raindrop run as for every task of a model (``tuning.task.TaskTuner``);
the best record is re-built from its stored trace and checked against the
reference before it is reported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tvm.target import Target

from stormdrop.errors import TuningError
from stormdrop.measure.gateway import Gateway, MeasureConfig
from stormdrop.records import Phase
from stormdrop.search.phases import PHASES, check_samples
from stormdrop.search.raindrop import RaindropConfig
from stormdrop.search.reuse import open_donors
from stormdrop.search.storm import StormConfig
from stormdrop.storage.database import Database, default_db_path
from stormdrop.target import canonical, parse_target
from stormdrop.tuning.driver import Budget, drive, measured
from stormdrop.tuning.task import TaskResult, TaskSession, TaskTuner
from stormdrop.workloads import Kernel, parse_kernel


@dataclass
class TuneResult:
    target: str
    tuning_s: float
    tasks: list[TaskResult]

    def to_json(self) -> dict:
        return {"target": self.target, "tuning_s": round(self.tuning_s, 3),
                "tasks": [t.to_json() for t in self.tasks]}


def tune_kernel(kernel: str | Kernel, *, target: str | dict | Target | None = None, trials: int = 64,
                exploit_trials: int | None = None, time_budget: float | None = None,
                db: str | os.PathLike | Database | None = None, seed: int = 0,
                measure: MeasureConfig | None = None, storm: StormConfig | None = None,
                raindrop: RaindropConfig | None = None, reuse: int = 8, progress: bool = False,
                phases: Sequence[Phase] = PHASES, reuse_from: Sequence[str | os.PathLike] = ()) -> TuneResult:
    """Tune one kernel: reuse + storm for ``trials`` candidates, then raindrop for ``exploit_trials``.

    Reuse measures the best schedules of up to ``reuse`` other workloads of the same
    class stored in ``db`` (transferred to this one) before the storm, out of its budget.
    ``phases``: which of reuse, storm and raindrop run (``(Phase.REUSE,)``: transfer only; with no
    storm, reuse measures up to ``reuse`` transfers of its own). ``reuse_from``: more databases to
    draw donors from, opened read only.

    ``kernel`` is a spec (``matmul:M=512,N=512,K=512``, ``file.py:function``) or a
    ``Kernel``. Every measurement is committed to ``db`` as it is made; re-running
    the same call resumes. Returns the best verified latency per task.
    """
    start = time.monotonic()
    k = kernel if isinstance(kernel, Kernel) else parse_kernel(kernel)
    tgt = parse_target(target)
    exploit = trials if exploit_trials is None else exploit_trials
    deadline = start + time_budget if time_budget else float("inf")
    rcfg = raindrop or RaindropConfig()
    check_samples(measure, phases, exploit)
    own_db = not isinstance(db, Database)
    donor_dbs = open_donors(reuse_from)
    database = Database(db or default_db_path()) if own_db else db
    trials = trials if Phase.STORM in phases else 0
    exploit = exploit if Phase.RAINDROP in phases else 0
    bar = _progress_bar(k.name, trials + exploit) if progress else None
    try:
        with Gateway(tgt, (measure or MeasureConfig()).for_kernels()) as gateway:
            task = TaskSession(database, gateway, k, tgt, seed, progress=bar)
            if bar is not None:
                bar.update(min(task.spent(Phase.STORM), trials) + min(task.spent(Phase.RAINDROP), exploit))
            tuner = TaskTuner(task, trials=trials, exploit_trials=exploit, storm=storm, raindrop=rcfg, reuse=reuse,
                              phases=phases, donor_dbs=donor_dbs)
            drive([tuner], [task], [1], Budget(deadline=deadline), seed=seed, storm=storm)  # one task, one driver
            task.result.tuning_s = time.monotonic() - start
    finally:
        if bar is not None:
            bar.close()
        if own_db:
            database.close()
        for d in donor_dbs:
            d.close()
    if not task.result.trace_json:  # no valid schedule re-measured (checked unless checking is off)
        raise TuningError(f"{k.name}: no valid, verified schedule was found ({task.result.trials['failed']} of "
                          f"{measured(task)} candidates measured by this run failed)")
    return TuneResult(canonical(tgt), time.monotonic() - start, [task.result])


def _progress_bar(name: str, total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc=name[:32], unit="trial", dynamic_ncols=True, leave=True)
