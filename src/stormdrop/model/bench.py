"""``stormdrop bench --model``: one model, side by side on the same inputs.

Untuned TVM, TVM compiled with every task's deployed record (from the database,
nothing is tuned here: the record the model's last tune chose inside the model,
``model_choice``, else the best stored one), ONNX Runtime (ONNX and zoo models) and
PyTorch (``torch.export`` programs, when torch is installed). The tuned build
must match the reference (ONNX Runtime, else the untuned build) before its
latency is reported.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from stormdrop.errors import TuningError
from stormdrop.lowering.pipeline import Lowering
from stormdrop.measure.tracker import RpcConfig
from stormdrop.model.run import (
    commit_best,
    compile_model,
    random_inputs,
    side_by_side,
    task_times,
)
from stormdrop.model.runtimes import run_pytorch
from stormdrop.model.tune import extract_tasks
from stormdrop.report.history import faster_after, run_estimate
from stormdrop.storage.database import Database
from stormdrop.target import canonical, num_cores, parse_target
from stormdrop.workloads.models import Model, load_model

log = logging.getLogger("stormdrop")


@dataclass
class TaskRow:
    name: str
    weight: int
    flops: int
    latency_s: float | None  # best stored record; None = untuned (TVM's default schedule)
    trials: int
    in_model_s: float | None = None  # all its calls in one run of the compiled model (``task_times_in_model``)

    def to_json(self) -> dict:
        return {"name": self.name, "weight": self.weight, "flops": self.flops, "latency_s": self.latency_s,
                "trials": self.trials, "in_model_s": self.in_model_s}


@dataclass
class BenchResult:
    target: str
    model: str
    latency_s: dict[str, float | None] = field(default_factory=dict)
    tasks: list[TaskRow] = field(default_factory=list)
    max_abs_error: float | None = None
    # time to fast of the model's last tune, against the latencies measured here (``last_tune_faster_after``)
    faster_after_s: dict[str, float | None] = field(default_factory=dict)

    @property
    def tuned_tasks(self) -> int:
        return sum(t.latency_s is not None for t in self.tasks)

    def to_json(self) -> dict:
        return {"target": self.target, "model": self.model, "latency_s": dict(self.latency_s),
                "max_abs_error": self.max_abs_error, "tasks": [t.to_json() for t in self.tasks],
                "faster_after_s": {k: None if v is None else round(v, 1) for k, v in self.faster_after_s.items()}}


def deployed_keys(db: Database, model: str, target: str) -> dict[str, str]:
    """Workload id -> the candidate key the model's last tune on ``target`` deployed (its
    note's ``deployed``; {} for a model tuned before it was noted, or on another target)."""
    note = db.model_notes().get(model, {})
    return note.get("deployed") or {} if note.get("target") == target else {}


def last_tune_faster_after(db: Database, model: str, target: str, latency_s: dict) -> dict[str, float | None]:
    """Time to fast of the model's last tune on ``target`` (its note: tasks, start, tuning time),
    its records read against ``latency_s`` (as measured now); {} where no tune of it is noted."""
    note = db.model_notes().get(model, {})
    if note.get("target") != target or not note.get("started_at") or not note.get("tasks"):
        return {}
    start = float(note["started_at"])
    curve = run_estimate(db, [(int(t["workload_id"]), int(t["weight"])) for t in note["tasks"]], target, start,
                         until=start + float(note.get("tuning_s") or math.inf))
    return faster_after(curve, latency_s)


def _as_tuned(model: Model, db: Database, target: Target, lowering: Lowering) -> tuple[Any, list]:
    """The model's fused module and tasks as its last tune on ``target`` lowered them: where its
    trial cap kept the convolutions direct (``Lowering.for_budget``) and the tasks so lowered are
    the noted ones (the same network at another input size may have been tuned since)."""
    note = db.model_notes().get(model.name, {})
    tuned = lowering.as_tuned(note) if note.get("target") == canonical(target) else lowering
    if tuned != lowering:
        fused, tasks = extract_tasks(model, target, tuned)
        entries = [db.find_workload(k.mod) for k, _ in tasks]
        if {e.workload_id for e in entries if e} == {t["workload_id"] for t in note.get("tasks", [])}:
            return fused, tasks
    return extract_tasks(model, target, lowering)


def tuned_build(model: Model, db: Database, target: Target, lowering: Lowering | None = None,
                deployed: bool = True, tir_pipeline: str | None = None) -> tuple[Any, list[TaskRow]]:
    """The model compiled with every task's deployed record (``deployed_keys``; ``deployed=False``
    or none noted: the best stored one that stormdrop checked, never an unchecked import), and one row per
    task (``lowering``: as the model was tuned; ``tir_pipeline``: as ``compile_model`` takes it)."""
    key = canonical(target)
    fused, tasks = _as_tuned(model, db, target, lowering or Lowering())
    chosen = deployed_keys(db, model.name, key) if deployed else {}
    mdb = ms.database.MemoryDatabase()
    rows, unchecked = [], 0
    for kernel, weight in tasks:
        entry = db.find_workload(kernel.mod)
        noted = db.lookup(entry.workload_id, key, chosen[str(entry.workload_id)]) if (
            entry and str(entry.workload_id) in chosen) else None
        if noted is not None and noted.ok:
            best = [noted]
        else:  # never a record imported from another tuner that no stormdrop run checked
            best = db.best(entry.workload_id, key, k=1, checked=True) if entry else []
            unchecked += bool(entry and not best and db.best(entry.workload_id, key, k=1))
        rows.append(TaskRow(kernel.name, weight, kernel.flops, best[0].mean if best else None,
                            db.count(entry.workload_id, key) if entry else 0))
        if best:
            commit_best(mdb, kernel.mod, best[0].trace_json, best[0].mean, target)
    if not any(r.latency_s is not None for r in rows):
        what = (f"only imported records, never checked by stormdrop, for {unchecked}" if unchecked
                else "no record for any")
        raise TuningError(f"{model.name}: the database holds {what} of its {len(tasks)} tasks "
                          f"on this target; run `stormdrop tune --model` first")
    if unchecked:
        log.warning("%s: %d task(s) hold only imported records, never checked by stormdrop: compiled "
                    "with TVM's default schedule (`stormdrop tune --model` checks them)", model.name, unchecked)
    return compile_model(fused, mdb, target, tir_pipeline), rows


def task_times_in_model(ex: Any, inputs: dict, target: Target, rows: list[TaskRow]) -> None:
    """Fill each row's ``in_model_s``: its kernel's time in one run of the compiled model
    (``model.run.task_times``)."""
    times = task_times(ex, inputs, target)
    for r in rows:
        r.in_model_s = times.get(r.name)


def bench_model(spec: Any, *, db: Database, target: Any = None, seed: int = 0, lowering: Lowering | None = None,
                rpc: RpcConfig | None = None, **load_kw: Any) -> BenchResult:
    """Measure ``spec`` untuned, tuned from ``db``, in ONNX Runtime, and in OpenVINO and PyTorch
    when available.

    ``rpc``: untuned and tuned TVM run on that RPC device (the other runtimes run here, and
    the per-kernel times inside the model are left out: the VM instrument runs only here)."""
    tgt = parse_target(target)
    model = spec if isinstance(spec, Model) else load_model(spec, seed=seed, **load_kw)
    result = BenchResult(canonical(tgt), model.name)
    ex, result.tasks = tuned_build(model, db, tgt, lowering)
    inputs = random_inputs(model, seed)
    if rpc is None:  # before the other runtimes run here: their idle threads take the cores a while
        task_times_in_model(ex, inputs, tgt, result.tasks)
    latency, result.max_abs_error = side_by_side(model, ex, inputs, tgt, rpc=rpc)
    result.latency_s.update(latency)
    result.faster_after_s = last_tune_faster_after(db, model.name, result.target, latency)
    result.latency_s["pytorch"] = None
    if model.torch_program is not None:
        try:
            _, result.latency_s["pytorch"] = run_pytorch(model.torch_program, inputs, num_cores(tgt))
        except ImportError:
            log.warning("PyTorch is not installed: no PyTorch column")
    return result


def format_bench(result: BenchResult) -> str:
    from stormdrop.report.tables import table

    rows = []
    for t in sorted(result.tasks, key=lambda t: -(t.in_model_s or (t.latency_s or 0) * t.weight)):
        lat = "untuned" if t.latency_s is None else f"{t.latency_s * 1e6:.1f}"
        share = "" if t.latency_s is None else f"{t.latency_s * t.weight * 1e6:.1f}"
        in_model = "" if t.in_model_s is None else f"{t.in_model_s * 1e6:.1f}"
        rows.append([t.name, str(t.weight), lat, share, in_model, str(t.trials)])
    lines = [table(["Task", "Weight", "Latency (us)", "Weighted (us)", "In model (us)", "Trials"], rows), ""]
    lines.append(f"{result.model}: {result.tuned_tasks}/{len(result.tasks)} tasks tuned; "
                 f"output max |diff| {result.max_abs_error:.2g}")
    stored = sum(t.latency_s * t.weight for t in result.tasks if t.latency_s is not None)
    in_model = sum(t.in_model_s or 0 for t in result.tasks)
    if in_model:
        lines.append(f"kernels: {stored * 1e3:.3f} ms as tuned (weight x stored latency), {in_model * 1e3:.3f} ms "
                     "inside the model (each call timed in place)")
    for name, v in result.latency_s.items():
        lines.append(f"  {name:12s} {'n/a' if v is None else f'{v * 1e3:.3f} ms'}")
    tuned = result.latency_s.get("tuned")
    for peer in ("onnxruntime", "openvino"):
        if tuned and result.latency_s.get(peer):
            lines.append(f"  tuned / {peer} = {tuned / result.latency_s[peer]:.2f}")
    if result.faster_after_s:
        from stormdrop.report.tables import faster_text

        lines.append("time to fast (the last tune): " + faster_text(result.faster_after_s))
    return "\n".join(lines)

