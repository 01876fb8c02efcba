"""PNG plots of tuning histories, drawn headless (matplotlib's Agg backend)."""

from __future__ import annotations

import io
from collections.abc import Sequence

from stormdrop.records import ErrorKind, Phase
from stormdrop.report.history import Trial

PHASE_COLOURS = {Phase.REUSE: "#2ca02c", Phase.STORM: "#1f77b4", Phase.RAINDROP: "#d62728"}
FAILURE_MARKERS = {ErrorKind.INVALID_SCHEDULE: "1", ErrorKind.BUILD_ERROR: "x", ErrorKind.BUILD_TIMEOUT: "X",
                   ErrorKind.BUILDER_CRASH: "4", ErrorKind.RUN_ERROR: "+", ErrorKind.RUN_TIMEOUT: "P",
                   ErrorKind.RUNNER_CRASH: "3", ErrorKind.WRONG_RESULT: "*"}
RUN_STYLES = ("-", "--")  # the report's run, the compared run


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def task_plot(title: str, runs: Sequence[tuple[str, Sequence[Trial]]]) -> bytes:
    """Best latency against trials (left) and against wall time (right) for one task.

    Each run (label, trials) is one line style; every valid measurement is a dot in its
    phase's colour, the best-so-far a step line, failures a marker by kind along the top.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2))
    seen: dict[str, object] = {}
    for r, (label, trials) in enumerate(runs):
        style = RUN_STYLES[r % len(RUN_STYLES)]
        for ax, x_of in ((axes[0], lambda t: t.index), (axes[1], lambda t: t.elapsed_s)):
            best = [(x_of(t), t.best_s * 1e6) for t in trials if t.best_s is not None]
            if best:
                line, = ax.step([x for x, _ in best], [y for _, y in best], where="post", linestyle=style,
                                color="black", linewidth=1.2)
                seen.setdefault(f"best ({label})", line)
            for phase, colour in PHASE_COLOURS.items():
                pts = [(x_of(t), t.latency_s * 1e6) for t in trials if t.phase == phase and t.latency_s is not None]
                if pts:
                    dots = ax.scatter([x for x, _ in pts], [y for _, y in pts], s=6, color=colour, alpha=0.5)
                    seen.setdefault(phase.value, dots)
            for kind, marker in FAILURE_MARKERS.items():
                xs = [x_of(t) for t in trials if t.error == kind]
                if xs:
                    marks = ax.scatter(xs, [0.97] * len(xs), marker=marker, color="#7f7f7f", s=28,
                                       transform=ax.get_xaxis_transform())
                    seen.setdefault(f"failed: {kind.value}", marks)
    valid = [t.latency_s * 1e6 for _, trials in runs for t in trials if t.latency_s is not None]
    for ax, xlabel in ((axes[0], "measured trials"), (axes[1], "wall time (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("latency (us)")
        ax.grid(alpha=0.3)
        if valid:  # the slowest outliers would flatten the curve: show up to 3x the best
            ax.set_ylim(min(valid) * 0.95, min(max(valid), 3 * min(valid)) * 1.05)
    fig.suptitle(title, fontsize=10)
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=8, frameon=False)
    return _png(fig)


def model_plot(title: str, runs: Sequence[tuple[str, Sequence[tuple[float, float]]]],
               onnxruntime_s: float | None = None, openvino_s: float | None = None) -> bytes:
    """The model's estimated latency (sum of weight x best) against tuning time, one line per run;
    the peers' measured latencies as horizontal lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for r, (label, curve) in enumerate(runs):
        if curve:
            ax.step([x for x, _ in curve], [y * 1e3 for _, y in curve], where="post",
                    linestyle=RUN_STYLES[r % len(RUN_STYLES)], color="black", label=f"stormdrop estimate ({label})")
    if onnxruntime_s:
        ax.axhline(onnxruntime_s * 1e3, color="#ff7f0e", label="ONNX Runtime (measured)")
    if openvino_s:
        ax.axhline(openvino_s * 1e3, color="#9467bd", linestyle="--", label="OpenVINO (measured)")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return _png(fig)
