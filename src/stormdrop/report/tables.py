"""Tables in MetaSchedule's task-table style."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table with a rule under the header, columns right-aligned."""
    cells = [[str(h) for h in header]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    rule = "-" * len(lines[0])
    return "\n".join([lines[0], rule, *lines[1:], rule])


def _fmt(value: object) -> str:
    if value is None:
        return "N/A"
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.2f}"
    return str(value)


def task_table(tasks: Sequence[object]) -> str:
    """One row per TaskResult: the final table of ``stormdrop tune``."""
    header = ["ID", "Name", "FLOP", "Weight", "Speed (GFLOPS)", "Latency (us)", "Share",
              "Trials (reuse+storm+drop)", "Failed", "Verified", "Tuning (s)"]
    weighted = [getattr(t, "weight", 1) * t.latency_s if t.latency_s else 0.0 for t in tasks]
    total = sum(weighted)
    rows = []
    for i, t in enumerate(tasks):
        lat = t.latency_s * 1e6 if t.latency_s else None
        share = f"{100 * weighted[i] / total:.1f}%" if total > 0 else None  # of the tasks' weight x latency
        rows.append([i, t.name, t.flops, getattr(t, "weight", 1), t.gflops, lat, share,
                     f"{t.trials['reuse']}+{t.trials['storm']}+{t.trials['raindrop']}", t.trials["failed"],
                     _verified(t), t.tuning_s])
    return table(header, rows)


def _verified(t: object) -> str:
    if not t.verified:
        return "NO" if t.latency_s is None else "unchecked"
    n = getattr(t, "fallbacks", 0)
    return "yes" if not n else f"yes (best {n} failed)"


def format_best_table(db: Any, target: str | None = None) -> str:
    """The best record per (workload, target) as a MetaSchedule-style task table.

    One section per target (headed ``Target: ...``); rows for workloads with at
    least one record there. ``Trials`` counts all records, failures included.
    """
    from stormdrop.storage.database import canonical_target

    if target is not None:
        target = canonical_target(target)
    sections: dict[str, list[list[str]]] = {}
    totals: dict[str, tuple[int, float]] = {}
    for wl in db.workloads():
        for tgt in db.targets(wl.workload_id) if target is None else [target]:
            trials = db.count(wl.workload_id, tgt)
            if trials == 0:
                continue
            best = db.best(wl.workload_id, tgt, 1)
            if best:
                lat_us = best[0].mean * 1e6
                speed = f"{wl.flops / lat_us / 1e3:.4f}" if wl.flops > 0 and lat_us > 0 else "N/A"
                lat = f"{lat_us:.4f}"
            else:
                lat_us, speed, lat = 0.0, "N/A", "N/A"
            final, retry = db.failures(wl.workload_id, tgt)
            row = [str(wl.workload_id), wl.name, str(wl.flops), "1", speed, lat, str(trials), str(final), str(retry)]
            sections.setdefault(tgt, []).append(row + ["Y" if best else ""])
            n, total = totals.get(tgt, (0, 0.0))
            totals[tgt] = (n + trials, total + lat_us)
    if not sections:
        return "No records." + ("" if target is None else f" (target {target})")
    header = ["ID", "Name", "FLOP", "Weight", "Speed (GFLOPS)", "Latency (us)", "Trials", "Failed", "To retry",
              "Done"]
    out: list[str] = []
    for tgt, rows in sections.items():
        n, total = totals[tgt]
        out += [f"Target: {tgt}", table(header, rows)]
        out += [f"Total trials: {n}", f"Total latency (us): {total:.4f}", ""]
    return "\n".join(out).rstrip("\n")


def faster_text(faster_after_s: dict[str, float | None]) -> str:
    """``faster_after_s`` in words: "faster than ONNX Runtime after 84 s of tuning; not faster than OpenVINO"."""
    names = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}
    return "; ".join(f"faster than {names[p]} after {s:.0f} s of tuning" if s is not None
                     else f"not faster than {names[p]}" for p, s in faster_after_s.items())
