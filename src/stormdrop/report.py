"""Tables in MetaSchedule's task-table style."""

from __future__ import annotations

from collections.abc import Sequence


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
    header = ["ID", "Name", "FLOP", "Weight", "Speed (GFLOPS)", "Latency (us)", "Trials (storm+drop)",
              "Failed", "Verified", "Tuning (s)"]
    rows = []
    for i, t in enumerate(tasks):
        lat = t.latency_s * 1e6 if t.latency_s else None
        rows.append([i, t.name, t.flops, getattr(t, "weight", 1), t.gflops, lat,
                     f"{t.trials['storm']}+{t.trials['raindrop']}", t.trials["failed"],
                     "yes" if t.verified else "NO", t.tuning_s])
    return table(header, rows)
