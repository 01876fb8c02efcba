"""Whole models: extract tasks, share the trial budget among them, compile, run, verify.

Tasks are the model's fused kernels (identical workloads tuned once, weighted by
their occurrences). Ansor's gradient scheduler decides which task gets the next
batch; each task runs its own storm -> raindrop machine (``TaskTuner``). The
model is then compiled with the best verified record of every task, run on the
Relax VM, and checked against ONNX Runtime (ONNX inputs) or the untuned build.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from stormdrop.lowering.padded_width import CROP
from stormdrop.lowering.pipeline import Lowering
from stormdrop.lowering.winograd import direct_flops as winograd_direct_flops
from stormdrop.lowering.winograd import kernel_key as winograd_kernel_key
from stormdrop.measure.gateway import Gateway, MeasureConfig
from stormdrop.measure.tracker import RpcConfig
from stormdrop.model.choice import Deployable, choose
from stormdrop.model.options import ModelOptions
from stormdrop.model.run import (
    commit_best,
    compile_model,
    prepack_weights,
    random_inputs,
    side_by_side,
)
from stormdrop.records import Phase
from stormdrop.report.display import ModelDisplay, TaskLine, eta_s
from stormdrop.report.history import faster_after, run_estimate
from stormdrop.search.donors import heirs
from stormdrop.search.phases import check_samples
from stormdrop.storage.database import candidate_key
from stormdrop.storage.donors import tuned_in
from stormdrop.storage.identity import block_names
from stormdrop.target import canonical, parse_target
from stormdrop.tuning.budget import (
    Budget,
    cap_reaching_every_task,
    first_batch_size,
    lead_batch,
    model_compiles,
    raindrop_batch,
    storm_share,
)
from stormdrop.tuning.driver import donor_databases, drive, measured, run_database
from stormdrop.tuning.task import TaskResult, TaskSession, TaskTuner
from stormdrop.tuning.verify import records_after_verified
from stormdrop.tvm_compat.runtime import export_library
from stormdrop.workloads import Kernel
from stormdrop.workloads.models import Model, load_model

log = logging.getLogger("stormdrop")


@dataclass
class ModelResult:
    target: str
    model: str
    tuning_s: float  # extraction, search, verification and the tuned model's compile (what --time-budget bounds)
    tasks: list[TaskResult]
    latency_s: dict[str, float | None] = field(default_factory=dict)
    max_abs_error: float | None = None
    stopped_by: str = ""  # what ended the tuning: the trial budget, the time budget, or every task's cap
    # the in-model choice (``model_choice``): task name -> the rank of its deployed candidate (0: its
    # best record as tuned), and the models' latencies with the best records / with the choice
    deployed: dict[str, int] = field(default_factory=dict)
    choice_s: dict[str, float | None] = field(default_factory=dict)
    # time to fast: peer runtime -> the tuning time (s) at which the model became faster than it,
    # read from the run's records (``report.history.faster_after``), None where it never did
    faster_after_s: dict[str, float | None] = field(default_factory=dict)
    # where ``tuning_s`` went, in wall seconds: "tasks" (the model loaded, lowered and its tasks
    # extracted), "set_up" (the measuring processes and each task's reference), "search" (the
    # tuning and the verification of every task's best), "compile" (the measuring processes stopped and the
    # tuned model built)
    stages_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"target": self.target, "model": self.model, "tuning_s": round(self.tuning_s, 3),
                "latency_s": dict(self.latency_s), "tasks": [t.to_json() for t in self.tasks],
                "in_model_choice": {"deployed": dict(self.deployed), **self.choice_s},
                "faster_after_s": {k: None if v is None else round(v, 1) for k, v in self.faster_after_s.items()},
                "stages_s": {k: round(v, 3) for k, v in self.stages_s.items()}}


def op_class(mod: tvm.IRModule, task_name: str = "") -> str:
    """A fused kernel's class for reuse, shapes left out: its compute blocks (TOPI's names, counters
    dropped, so that layout, pooling kind and fused epilogues all count) and its output dtype,
    e.g. ``T_add+compute+conv2d_nhwc+pad_temp:float32``. Only kernels of one class exchange schedules.
    The crop of a convolution computed wider (``padded_width.CROP``) does not count: such a
    convolution takes the schedules of its class's convolutions of other widths."""
    try:
        from tvm.s_tir import Schedule

        blocks = sorted(re.sub(r"\d+$", "", name) for name in block_names(Schedule(mod)) if not name.startswith(CROP))
        dtype = str(ms.arg_info.ArgInfo.from_prim_func(mod["main"])[-1].dtype)
        return "+".join(blocks) + ":" + dtype
    except Exception:  # noqa: BLE001 - an unusual kernel: its own name, counters dropped
        return re.sub(r"\d+", "", task_name.removeprefix("fused_")) or task_name


def extract_tasks(model: Model, target: Target, lowering: Lowering | None = None
                  ) -> tuple[tvm.IRModule, list[tuple[Kernel, int]]]:
    """The fused module (``Lowering.lower``) and its tuning tasks: (kernel, weight), identical
    workloads merged."""
    fused = (lowering or Lowering()).lower(model.mod, target, prepack_weights(target))
    tasks = ms.relax_integration.extract_tasks(fused, target)
    out = []
    for t in tasks:
        mod = t.dispatched[0]
        from tvm.s_tir.analysis import estimate_tir_flops

        try:
            flops = int(estimate_tir_flops(mod))
        except Exception:  # noqa: BLE001
            flops = 0
        if "conv2d_winograd" in t.task_name:  # count a direct convolution's FLOPs: comparable GFLOPS
            flops = winograd_direct_flops(mod) or flops
        out.append((Kernel(t.task_name, f"{model.name}:{t.task_name}", op_class(mod, t.task_name), mod, flops),
                    int(t.weight)))
    return fused, out


def first_lowering(model: Model, target: Target, lowering: Lowering, budget: tuple[int | None, float | None],
                   donor_dbs: list, reuse: bool, held: Callable[[], set[tuple]] | None = None) -> Lowering:
    """The lowering to extract a model's tasks with under ``budget`` (trials, time budget): every
    convolution direct where the budget is too small for Winograd kernels (``Lowering.for_budget``)
    whatever the task count (at least one task per distinct convolution, ``Lowering.convolutions``)
    and reuse could not start them all from the donors (a donor, the schedule hub among them,
    lacks a Winograd kernel of one of their shapes); else ``lowering``, which ``budgeted_tasks``
    may still make direct. An extraction lowers the whole model: seconds for a large one. ``held``:
    the donors' Winograd kernels (``_held_winograd``), read when first needed."""
    trials, time_budget = budget
    if lowering.winograd != "auto" or (trials is None and not time_budget):
        return lowering
    convolutions, winograd = lowering.convolutions(model.mod, target)
    direct = lowering.for_budget(trials, convolutions, time_budget)
    held = held or (lambda: _held_winograd(donor_dbs))
    if direct == lowering or not winograd or (reuse and _donors_hold(lowering, winograd, held())):
        return lowering
    return direct


def _held_winograd(donor_dbs: list) -> set[tuple]:
    """``winograd.kernel_key`` of every Winograd kernel the donors hold (records or not)."""
    return {key for db in donor_dbs for mod in db.modules_of_class("conv2d_winograd")
            if (key := winograd_kernel_key(mod)) is not None}


RELATED_MIN_CHANNELS = 64  # input and output channels (the GEMM's depth and width) of every kernel it keeps


def _donors_hold(lowering: Lowering, keys: Sequence[tuple], held: set[tuple]) -> bool:
    """Whether the donors' Winograd kernels (``held``, ``winograd.kernel_key`` each) start every one
    of ``keys`` (input shape, output channels, alpha): each itself, or ``_related``."""
    return set(keys) <= held or _related(lowering, keys, held)


def _related(lowering: Lowering, keys: Sequence[tuple], held: set[tuple]) -> bool:
    """With ``Lowering.winograd_related``: whether the donors hold a Winograd kernel of each one's
    tile size (alpha) for another shape and every one reads and writes at least
    ``RELATED_MIN_CHANNELS`` channels (its GEMM, which a transfer starts well, outweighs its
    transforms)."""
    return lowering.winograd_related and all(min(key[0][-1], key[1]) >= RELATED_MIN_CHANNELS for key in keys) \
        and {key[2] for key in keys} <= {key[2] for key in held}


def budgeted_tasks(model: Model, target: Target, lowering: Lowering,
                   extracted: tuple[Lowering, tuple[tvm.IRModule, list]], budget: tuple[int | None, float | None],
                   donor_dbs: list, reuse: bool, held: Callable[[], set[tuple]] | None = None
                   ) -> tuple[tvm.IRModule, list[tuple[Kernel, int]], Lowering]:
    """The fused module, tasks and lowering a tune under ``budget`` (trials, time budget) works on,
    from ``extracted`` (the lowering the tasks were extracted with, ``first_lowering``, and its fused
    module and tasks): every convolution direct where the budget is too small for Winograd kernels
    (``Lowering.for_budget``), unless ``reuse`` is on and the donors (the schedule hub among them)
    hold every one of them (with ``Lowering.winograd_related``: Winograd kernels of each one's tile
    size; ``held`` as ``first_lowering`` takes it)."""
    first, (fused, tasks) = extracted
    trials, time_budget = budget
    budget_words = f"{trials} trials" if trials is not None else f"a {time_budget or 0:.0f}-s budget"
    direct = (f"{model.name}: {budget_words} for {len(tasks)} tasks: every convolution direct (Winograd kernels "
              "need more trials)")
    if first != lowering:  # extracted direct already (``first_lowering``)
        log.info(direct)
        return fused, tasks, first
    budgeted = lowering.for_budget(trials, len(tasks), time_budget)
    winograd = [k for k, _ in tasks if "winograd" in k.name]
    if budgeted == lowering or not winograd:
        return fused, tasks, lowering
    if reuse and all(tuned_in(k.mod, canonical(target), donor_dbs) for k in winograd):
        log.info("%s: %s for %d tasks: Winograd kept, every Winograd kernel has tuned schedules "
                 "among the donors (the schedule hub)", model.name, budget_words, len(tasks))
        return fused, tasks, lowering
    keys = [key for k in winograd if (key := winograd_kernel_key(k.mod)) is not None]
    held = held or (lambda: _held_winograd(donor_dbs))
    if reuse and lowering.winograd_related and len(keys) == len(winograd) and _related(lowering, keys, held()):
        log.info("%s: %s for %d tasks: Winograd kept, the donors (the schedule hub) hold Winograd kernels "
                 "of each one's tile size", model.name, budget_words, len(tasks))
        return fused, tasks, lowering
    log.info(direct)
    return *extract_tasks(model, target, budgeted), budgeted


def budgeted_extraction(model: Model, target: Target, lowering: Lowering, budget: tuple[int | None, float | None],
                        donor_dbs: list, reuse: bool) -> tuple[tvm.IRModule, list[tuple[Kernel, int]], Lowering]:
    """The fused module, tasks and lowering a tune under ``budget`` works on: extracted with
    ``first_lowering``, then ``budgeted_tasks`` (the donors' Winograd kernels read once for both)."""
    held = functools.cache(lambda: _held_winograd(donor_dbs))
    first = first_lowering(model, target, lowering, budget, donor_dbs, reuse, held)
    return budgeted_tasks(model, target, lowering, (first, extract_tasks(model, target, first)), budget, donor_dbs,
                          reuse, held)


@contextlib.contextmanager
def _databases(db: Any, reuse_from: Sequence[str], target: Target, hub: bool | str,
               extract: Callable[[list], tuple]) -> Iterator[tuple[Any, list, tuple]]:
    """``tuning.driver.run_databases`` with the model's tasks (``extract(donors)``) made after the
    donors are open and before the run's database is: a model that cannot be lowered touches nothing."""
    with donor_databases(reuse_from, target, hub) as donors:
        extracted = extract(donors)
        with run_database(db) as database:
            yield database, donors, extracted


def _reaching_every_task(trials: int | None, used: int, sessions: Sequence[TaskSession]) -> int | None:
    """``trials``, raised (with a warning) to what gives every task without a schedule one trial
    after the ``used`` ones of earlier runs (``cap_reaching_every_task``)."""
    unreached = sum(not math.isfinite(s.best) for s in sessions)
    raised = cap_reaching_every_task(trials, used, unreached)
    if raised != trials:
        log.warning("--trials %s cannot give each of the model's %d tasks without a schedule a trial: raised to %s "
                    "(a task left untuned runs as a naive loop nest, often slower than the rest of the model)",
                    trials, unreached, raised)
    return raised


def tune_model(spec: Any, options: ModelOptions | None = None, *, target: Any = None, db: Any = None) -> ModelResult:
    """Tune every task of a model as ``options`` say (``ModelOptions``; default: 1000 trials in
    all, 128 per task) on ``target`` (default: the host CPU), storing in ``db`` (a path or an open
    ``Database``; default: the per-user database); then compile, time and verify the model.

    ``spec``: a ``Model`` (``load_model`` with its input shapes), or what ``load_model`` takes
    with default shapes (an ONNX path, a zoo name, a Relax module, a ``torch.export`` program).
    """
    start = time.monotonic()
    started_at = time.time()  # the same instant on the records' clock
    opts = options or ModelOptions()
    search, trials, trials_per_task, seed = opts.search, opts.trials, opts.trials_per_task, opts.seed
    check_samples(opts.measure, search.phases, trials_per_task - max(1, trials_per_task // 2))
    tgt = parse_target(target)
    model = spec if isinstance(spec, Model) else load_model(spec, seed=seed)
    deadline = start + opts.time_budget if opts.time_budget else float("inf")
    measure = (opts.measure or MeasureConfig()).for_models(tgt)
    in_model_candidates = 1 if measure.rpc else opts.in_model_candidates  # the VM instrument times kernels here only
    lowering = opts.lowering or Lowering()
    budget = (trials, opts.time_budget) if opts.lowering_for_budget else (None, None)  # None: lowering kept
    display = None
    try:
        reuse = search.reuse > 0 and Phase.REUSE in search.phases
        with _databases(db, search.reuse_from, tgt, search.hub_source,
                        lambda donors: budgeted_extraction(model, tgt, lowering, budget, donors, reuse)
                        ) as (database, donor_dbs, (fused, tasks, lowering)):
            with Gateway(tgt, measure) as gateway:
                stages = {"tasks": time.monotonic() - start}
                sessions = [TaskSession(database, gateway, k, tgt, seed) for k, _ in tasks]
                gateway.make_references()  # every task's, side by side
                stages["set_up"] = time.monotonic() - start - stages["tasks"]
                note = {"target": canonical(tgt), "started_at": started_at, **lowering.noted(),
                        "tasks": [{"workload_id": s.entry.workload_id, "name": k.name, "weight": w}
                                  for s, (k, w) in zip(sessions, tasks)]}
                database.note_model(model.name, note)  # a killed run's report knows its tasks too
                # the ledger: --trials counts what earlier runs measured on these tasks too, so that a
                # killed and resumed run measures no more than an uninterrupted one
                used = sum(s.spent() for s in sessions)
                trials = _reaching_every_task(trials, used, sessions)
                first = first_batch_size(trials, len(tasks), search.storm.batch_size)
                storm_trials = storm_share(trials, len(tasks), trials_per_task, first)
                leads = [lead_batch(first, n, search.storm.batch_size, search.storm.lead_samples)
                         for n in heirs([s.entry.op_class for s in sessions])]
                drop = search.raindrop
                task_search = search if not drop.batch_by_share else replace(search, raindrop=replace(
                    drop, batch_size=raindrop_batch(trials, len(tasks), drop.batch_size)))
                tuners = [TaskTuner(s, trials=storm_trials, exploit_trials=trials_per_task - storm_trials,
                                    search=task_search,
                                    first_batch=first, lead_batch=lead, donor_dbs=donor_dbs)
                          for s, lead in zip(sessions, leads)]
                # no global cap and no time budget: the per-task caps bound the run
                cap = float("inf") if trials is None else trials
                shown_cap = cap if trials is not None or opts.time_budget else trials_per_task * len(tasks)
                display = ModelDisplay() if opts.progress else None

                def show(i: int, used: int) -> None:
                    if display is None:
                        return
                    lines = [TaskLine(k.name, w, tu.phase.value, se.best, measured(se), se.result.trials["failed"])
                             for (k, w), tu, se in zip(tasks, tuners, sessions)]
                    now = time.monotonic()
                    display.show(used, shown_cap, now - start, eta_s(used, now - start, shown_cap, deadline - now),
                                 lines, current=i)

                budget = Budget(trials=trials, deadline=deadline, extend=bool(opts.time_budget), per_task_cap=trials_per_task,
                                builds_after=len(tasks) * model_compiles(in_model_candidates))
                stopped_by = drive(tuners, sessions, [w for _, w in tasks], budget, used=used, seed=seed, storm=search.storm,
                                   warm_up=opts.warm_up, unit=opts.gradient_unit, on_step=show)
                result = ModelResult(canonical(tgt), model.name, 0.0, [s.result for s in sessions], stopped_by=stopped_by)
                stages["search"] = time.monotonic() - start - stages["tasks"] - stages["set_up"]
            # after the gateway is closed: its runners' devices (RPC) are free again for the model
            deployed = _compile_and_verify(result, model, fused, sessions, tgt, opts.output, seed, start,
                                           rpc=measure.rpc, untuned=opts.untuned, candidates=in_model_candidates)
            result.stages_s = {**stages, "compile": result.tuning_s - sum(stages.values())}
            result.faster_after_s = faster_after(run_estimate(  # time to fast, from this run's records
                database, [(s.entry.workload_id, w) for s, (_, w) in zip(sessions, tasks)], canonical(tgt),
                started_at), result.latency_s)
            database.note_model(model.name, {**note, "tuning_s": result.tuning_s, "latency_s": result.latency_s,
                                             "stopped_by": stopped_by, "deployed": deployed,
                                             "faster_after_s": result.faster_after_s})
    finally:
        if display is not None:
            display.close()
    return result


def ranked_candidates(session: TaskSession, k: int) -> list[Deployable]:
    """The task's best record as verified after tuning (``verify_bests``), then the next records
    by stored time, ``k`` in all. Records ranked above the verified one failed verification
    and are never candidates."""
    if not session.result.trace_json:
        return []
    first = Deployable(session.result.trace_json, session.result.latency_s or 0.0,
                       candidate_key(session.result.trace_json))
    if k < 2:
        return [first]
    return [first] + [Deployable(r.trace_json, r.mean, r.candidate_key) for r in records_after_verified(session, k - 1)]


def _ms_database(sessions: list[TaskSession], ranked: list[list[Deployable]], picks: list[int],
                 target: Target) -> ms.database.MemoryDatabase:
    """A MetaSchedule database holding candidate ``picks[i]`` of each task that has one."""
    mdb = ms.database.MemoryDatabase()
    for s, cands, pick in zip(sessions, ranked, picks):
        if cands:
            c = cands[min(pick, len(cands) - 1)]
            commit_best(mdb, s.kernel.mod, c.trace_json, c.latency_s, target)
    return mdb


def _compile_and_verify(result: ModelResult, model: Model, fused: tvm.IRModule, sessions: list[TaskSession],
                        target: Target, output: str | None, seed: int, start: float, rpc: RpcConfig | None = None,
                        untuned: bool = False, candidates: int = 1) -> dict[str, str]:
    """Compile with every task's best record, or with the in-model choice among its ``candidates``
    best (``model_choice``; ``result.tuning_s`` ends at the compiled model, counted from ``start``),
    run and time it (on the RPC device when tuning was remote, the untuned build too when it runs;
    ONNX Runtime runs here), and check its outputs. Returns workload id -> the deployed candidate's key."""
    no_schedule = [s.kernel.name for s in sessions if not s.result.trace_json]
    if no_schedule:
        log.warning("%d task(s) have no valid schedule and run with TVM's default: %s", len(no_schedule),
                    ", ".join(no_schedule))
    ranked = [ranked_candidates(s, candidates) for s in sessions]
    inputs = random_inputs(model, seed)
    choice = choose([s.kernel.name for s in sessions], ranked,
                    lambda picks: compile_model(fused, _ms_database(sessions, ranked, picks, target), target),
                    inputs, target)
    ex = choice.executable
    result.tuning_s = time.monotonic() - start
    result.deployed = {s.kernel.name: p for s, p in zip(sessions, choice.picks) if p}
    result.choice_s = {"best_s": choice.best_s, "chosen_s": choice.chosen_s}
    if choice.changed:
        log.info("in-model choice: %d task(s) deploy another of their best records: %.3f ms (best records: %.3f ms)",
                 choice.changed, choice.chosen_s * 1e3, choice.best_s * 1e3)
    latency, result.max_abs_error = side_by_side(model, ex, inputs, target, rpc=rpc, untuned=untuned)
    result.latency_s.update(latency)
    if output:
        export_library(ex, output, target)
    return {str(s.entry.workload_id): cands[min(p, len(cands) - 1)].candidate_key
            for s, cands, p in zip(sessions, ranked, choice.picks) if cands}
