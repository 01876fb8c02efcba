"""``stormdrop report``: one self-contained HTML page of a database's tuning runs.

Everything on the page comes from the database: records carry their time and phase,
and a model run leaves a note of its tasks, weights and latencies (``Database.note_model``).
Plots are PNGs embedded in the page, so it opens anywhere without a network.
"""

from __future__ import annotations

import base64
import datetime
import html
import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stormdrop import __version__
from stormdrop.errors import SpecError
from stormdrop.report.history import Trial, model_estimate, trials_of, trials_per_phase
from stormdrop.report.plots import model_plot, task_plot
from stormdrop.storage.database import Database, WorkloadEntry
from stormdrop.storage.metaschedule import import_metaschedule


@dataclass
class TaskView:
    """One task of the report: a workload, its weight in the model and its trials on the target."""

    name: str
    flops: int
    weight: int
    trials: list[Trial]
    entry: WorkloadEntry = field(repr=False)

    @property
    def best_s(self) -> float | None:
        return next((t.best_s for t in reversed(self.trials) if t.best_s is not None), None)


@dataclass
class Run:
    """What one database says about the selected tasks."""

    label: str
    target: str
    tasks: list[TaskView]
    model: str | None = None
    onnxruntime_s: float | None = None
    tuned_s: float | None = None
    openvino_s: float | None = None

    def estimate(self) -> list[tuple[float, float]]:
        return model_estimate([(t.weight, t.trials) for t in self.tasks])


def read_run(db: Database, *, label: str, model: str | None = None, workloads: Sequence[str] = (),
             target: str | None = None) -> Run:
    """The tasks to report: a model run's (from its note), the named workloads, or every workload."""
    if model is not None:
        notes = db.model_notes()
        if model not in notes:
            known = ", ".join(notes) or "none"
            raise SpecError(f"--model: no model run named {model!r} in {db.path} (model runs there: {known})")
        note = notes[model]
        tgt = target or note["target"]
        picked = [(db.workload(t["workload_id"]), int(t["weight"])) for t in note["tasks"]]
        latency = note.get("latency_s") or {}
        run = Run(label, tgt, [], model, latency.get("onnxruntime"), latency.get("tuned"), latency.get("openvino"))
    else:
        picked = [(e, 1) for e in _pick_workloads(db, workloads)]
        tgt = target or _busiest_target(db, [e for e, _ in picked])
        run = Run(label, tgt, [])
    records = {e.workload_id: db.records(e.workload_id, tgt) for e, _ in picked}
    # a model's tasks share one clock (its first record); separate kernels each start at their own
    start = min((r.measured_at for recs in records.values() for r in recs), default=None) if model else None
    run.tasks = [TaskView(e.name, e.flops, w, trials_of(records[e.workload_id], start), e) for e, w in picked
                 if records[e.workload_id]]
    if not run.tasks:
        raise SpecError(f"no records to report in {db.path} on target {tgt}")
    return run


def _pick_workloads(db: Database, keys: Sequence[str]) -> list[WorkloadEntry]:
    every = db.workloads()
    if not keys:
        return every
    out = []
    for key in keys:
        found = [e for e in every if str(e.workload_id) == key or e.name == key]
        if not found:
            raise SpecError(f"--workload: no workload with id or name {key!r} in {db.path}")
        out += [e for e in found if e not in out]
    return out


def _busiest_target(db: Database, entries: Sequence[WorkloadEntry]) -> str:
    counts = Counter({t: db.count(e.workload_id, t) for e in entries for t in db.targets(e.workload_id)})
    if not counts:
        raise SpecError(f"no records to report in {db.path}")
    return counts.most_common(1)[0][0]


def compared_run(db: Database, base: Run, label: str) -> Run:
    """The same tasks as ``base`` in another database (matched structurally), on the base run's target
    where it has records there, else on the target with the most records of each task."""
    notes = db.model_notes()
    weights = {t["workload_id"]: int(t["weight"]) for t in notes[base.model]["tasks"]} if base.model in notes else {}
    found = []
    for t in base.tasks:
        entry = db.find_workload(t.entry.mod)
        if entry is not None:
            tgt = base.target if db.count(entry.workload_id, base.target) else _busiest_target(db, [entry])
            found.append((t, entry, db.records(entry.workload_id, tgt), tgt))
    if not found:
        raise SpecError(f"--compare: none of the reported tasks is in {db.path}")
    # a model's tasks share one clock, as in the base run
    start = min(r.measured_at for _, _, recs, _ in found for r in recs) if base.model else None
    tasks = [TaskView(t.name, t.flops, weights.get(e.workload_id, t.weight), trials_of(recs, start), e)
             for t, e, recs, _ in found if recs]
    latency = (notes.get(base.model) or {}).get("latency_s") or {}
    return Run(label, found[0][3], tasks, base.model, latency.get("onnxruntime"), latency.get("tuned"),
               latency.get("openvino"))


def open_compared(path: str, workdir: str) -> Database:
    """A stormdrop database file, or a MetaSchedule JSON database directory imported into a scratch one."""
    if os.path.isdir(path):
        db = Database(os.path.join(workdir, "compared.db"))
        if import_metaschedule(db, path) == 0:
            raise SpecError(f"--compare: no MetaSchedule records in {path}")
        return db
    if not os.path.exists(path):
        raise SpecError(f"--compare: no database at {path}")
    return Database(path, read_only=True)


def write_report(db_path: str, out_dir: str, *, model: str | None = None, workloads: Sequence[str] = (),
                 target: str | None = None, compare: str | None = None) -> Path:
    """Write ``out_dir/index.html`` and return its path."""
    if not os.path.exists(db_path):
        raise SpecError(f"--db: no database at {db_path}")
    with Database(db_path, read_only=True) as db:
        runs = [read_run(db, label=Path(db_path).name, model=model, workloads=workloads, target=target)]
    if compare:
        with tempfile.TemporaryDirectory(prefix="stormdrop-report-") as tmp:
            with open_compared(compare, tmp) as other:
                runs.append(compared_run(other, runs[0], Path(compare).name))
    page = render(runs)
    out = Path(out_dir) / "index.html"
    partial = out.with_name(f".index.html.{os.getpid()}.tmp")
    try:  # whole or not at all: written beside the old page, then renamed over it
        os.makedirs(out_dir, exist_ok=True)
        partial.write_text(page, encoding="utf-8")
        os.replace(partial, out)
    except OSError as e:
        raise SpecError(f"--out: cannot write the report to {out_dir}: {e.strerror}") from None
    finally:
        if partial.exists():
            partial.unlink()
    return out


# -- the page --------------------------------------------------------------------------------------

_STYLE = """body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
img{display:block;max-width:100%;margin:.3em 0 1.2em}h2{margin-top:1.5em}.muted{color:#777}"""


def render(runs: Sequence[Run]) -> str:
    base = runs[0]
    title = f"stormdrop report: {base.model or f'{len(base.tasks)} workload(s)'}"
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>",
             f"<p class='muted'>{' vs '.join(_e(r.label) for r in runs)} &middot; target {_e(base.target)} &middot; "
             f"stormdrop {__version__} &middot; {datetime.datetime.now():%Y-%m-%d %H:%M}</p>"]
    if base.model:
        parts.append(_model_section(runs))
    parts.append(_task_table(base))
    if len(runs) > 1:
        parts.append(_compare_table(runs[0], runs[1]))
    parts.append("<h2>Tasks</h2>")
    others = {t.entry.shash: t for t in runs[1].tasks} if len(runs) > 1 else {}
    for t in sorted(base.tasks, key=lambda t: -(t.weight * (t.best_s or 0))):
        curves = [(base.label, t.trials)] + ([(runs[1].label, others[t.entry.shash].trials)]
                                              if t.entry.shash in others else [])
        parts.append(f"<h3>{_e(t.name)}</h3>{_img(task_plot(t.name, curves), t.name)}")
    parts.append("</body></html>")
    return "\n".join(parts)


def _model_section(runs: Sequence[Run]) -> str:
    base = runs[0]
    ort = next((r.onnxruntime_s for r in runs if r.onnxruntime_s), None)
    ov = next((r.openvino_s for r in runs if r.openvino_s), None)
    lines = [f"<h2>{_e(base.model)}: estimated latency during tuning</h2>",
             _img(model_plot(base.model, [(r.label, r.estimate()) for r in runs], ort, ov), "model estimate")]
    facts = []
    for r in runs:
        est = r.estimate()
        if est:
            facts.append(f"{_e(r.label)}: sum of weight x best latency {est[-1][1] * 1e3:.3f} ms after "
                         f"{est[-1][0]:.0f} s")
        if r.tuned_s:
            facts.append(f"{_e(r.label)}: compiled model measured at {r.tuned_s * 1e3:.3f} ms")
    if ort:
        facts.append(f"ONNX Runtime measured at {ort * 1e3:.3f} ms")
    if ov:
        facts.append(f"OpenVINO measured at {ov * 1e3:.3f} ms")
    return "\n".join(lines) + "".join(f"<p>{f}</p>" for f in facts)


def _task_table(run: Run) -> str:
    total = sum(t.weight * t.best_s for t in run.tasks if t.best_s) or 1.0
    rows = []
    for t in sorted(run.tasks, key=lambda t: -(t.weight * (t.best_s or 0))):
        n = trials_per_phase(t.trials)
        best = t.best_s
        rows.append([t.name, f"{t.flops:,}", t.weight, _us(best),
                     f"{t.flops / best / 1e9:.1f}" if best and t.flops else "",
                     n["reuse"], n["storm"], n["raindrop"], n["failed"],
                     f"{100 * t.weight * best / total:.1f}%" if best else ""])
    return "<h2>Tasks at a glance</h2>" + _table(
        ["task", "FLOPs", "weight", "best latency (us)", "GFLOPS", "reuse", "storm", "raindrop", "failed",
         "share of the tasks' time"], rows)


def _compare_table(a: Run, b: Run) -> str:
    others = {t.entry.shash: t for t in b.tasks}
    rows = []
    for t in a.tasks:
        o = others.get(t.entry.shash)
        ratio = f"{o.best_s / t.best_s:.2f}" if o and o.best_s and t.best_s else ""
        rows.append([t.name, _us(t.best_s), _us(o.best_s if o else None), ratio, len(t.trials),
                     len(o.trials) if o else ""])
    return (f"<h2>Comparison</h2><p>ratio = {_e(b.label)} / {_e(a.label)} best latency (above 1: "
            f"{_e(a.label)} is faster)</p>") + _table(
        ["task", f"best (us), {a.label}", f"best (us), {b.label}", "ratio", f"trials, {a.label}",
         f"trials, {b.label}"], rows)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _img(png: bytes, alt: str) -> str:
    return f"<img alt='{_e(alt)}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"


def _us(secs: float | None) -> str:
    return "" if secs is None else f"{secs * 1e6:.1f}"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)
