"""One kernel: a model with one task (``tune_kernel``), driven by the one driver.

Reuse, storm and raindrop run as for every task of a model (``tuning.task.TaskTuner``);
the best record is re-built from its stored trace and checked against the
reference before it is reported.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from tvm.target import Target

from stormdrop.errors import TuningError
from stormdrop.measure.gateway import Gateway, MeasureConfig
from stormdrop.records import Phase
from stormdrop.search.phases import check_samples
from stormdrop.storage.database import Database
from stormdrop.target import canonical, parse_target
from stormdrop.tuning.budget import Budget
from stormdrop.tuning.driver import drive, measured, run_databases
from stormdrop.tuning.options import KernelOptions
from stormdrop.tuning.task import TaskResult, TaskSession, TaskTuner
from stormdrop.tuning.verify import fastest_in_turns
from stormdrop.workloads import Kernel, parse_kernel


@dataclass
class TuneResult:
    target: str
    tuning_s: float
    tasks: list[TaskResult]

    def to_json(self) -> dict:
        return {"target": self.target, "tuning_s": round(self.tuning_s, 3),
                "tasks": [t.to_json() for t in self.tasks]}


def tune_kernel(kernel: str | Kernel, options: KernelOptions | None = None, *,
                target: str | dict | Target | None = None, db: str | os.PathLike | Database | None = None) -> TuneResult:
    """Tune one kernel as ``options`` say (``KernelOptions``; default: 64 storm and up to 64
    raindrop trials, reuse from ``db``), on ``target`` (default: the host CPU), storing in ``db``
    (a path or an open ``Database``; default: the per-user database).

    ``kernel`` is a spec (``matmul:M=512,N=512,K=512``, ``file.py:function``) or a
    ``Kernel``. Every measurement is committed to ``db`` as it is made; re-running
    the same call resumes. Returns the best verified latency per task.
    """
    start = time.monotonic()
    opts = options or KernelOptions()
    search = opts.search
    k = kernel if isinstance(kernel, Kernel) else parse_kernel(kernel)
    tgt = parse_target(target)
    exploit = opts.trials if opts.exploit_trials is None else opts.exploit_trials
    deadline = start + opts.time_budget if opts.time_budget else float("inf")
    check_samples(opts.measure, search.phases, exploit)
    trials = opts.trials if Phase.STORM in search.phases else 0
    exploit = exploit if Phase.RAINDROP in search.phases else 0
    bar = _progress_bar(k.name, trials + exploit) if opts.progress else None
    try:
        with run_databases(db, search.reuse_from, tgt, search.hub_source) as (database, donor_dbs), \
                Gateway(tgt, (opts.measure or MeasureConfig()).for_kernels()) as gateway:
            task = TaskSession(database, gateway, k, tgt, opts.seed, progress=bar)
            if bar is not None:
                bar.update(min(task.spent(Phase.STORM), trials) + min(task.spent(Phase.RAINDROP), exploit))
            tuner = TaskTuner(task, trials=trials, exploit_trials=exploit, search=search, donor_dbs=donor_dbs)
            drive([tuner], [task], [1], Budget(deadline=deadline), seed=opts.seed, storm=search.storm)  # one driver
            if time.monotonic() < deadline:  # the final pick is not worth a time budget's overrun
                fastest_in_turns(task, opts.final_candidates)
            task.result.tuning_s = time.monotonic() - start
    finally:
        if bar is not None:
            bar.close()
    if not task.result.trace_json:  # no valid schedule re-measured (checked unless checking is off)
        raise TuningError(f"{k.name}: no valid, verified schedule was found ({task.result.trials['failed']} of "
                          f"{measured(task)} candidates measured by this run failed)")
    return TuneResult(canonical(tgt), time.monotonic() - start, [task.result])


def _progress_bar(name: str, total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc=name[:32], unit="trial", dynamic_ncols=True, leave=True)
