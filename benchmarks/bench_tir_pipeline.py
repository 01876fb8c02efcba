"""Tuned models compiled through TVM's default TIR pipeline and through stormdrop's
(``tvm_compat.tir_pipeline``: vector loops that cross a row split first), the same schedules
from one database, timed in turns with ONNX Runtime and OpenVINO.

Each model is an ONNX file and its database (as ``bench_models.py --keep-db DIR`` leaves it:
``DIR/<file name>.db``). Both builds' outputs are checked against ONNX Runtime's. The kernels the
split changed are counted and timed inside both builds (``model.run.kernel_times``, the builds
taking turns): a model without any is the same code twice, and its two latencies show how far two
builds of one model differ on this machine anyway.

    PYTHONPATH=src python benchmarks/bench_tir_pipeline.py --models A.onnx,B.onnx --db-dir KEEP \\
        --json benchmarks/results_tir_pipeline_X.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

HEADER = ["model", "kernels split", "their time in TVM's build", "in stormdrop's", "TVM's TIR pipeline",
          "stormdrop's", "gain", "ONNX Runtime", "OpenVINO", "ORT / stormdrop's", "OV / stormdrop's", "max diff"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma-separated ONNX files")
    p.add_argument("--db-dir", required=True, help="where <file name>.db holds each model's tuned records")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _counting_splits(changed: list[str]):
    """``tir_pipeline.split_row_vectors``, noting the name of every function it changes."""
    from stormdrop.tvm_compat import tir_pipeline

    real = tir_pipeline.split_row_vectors

    def split(func):
        out = real(func)
        if not out.same_as(func):
            changed.append(str(func.attrs["global_symbol"]))
        return out

    return split


def bench_one(path: str, args: argparse.Namespace, target) -> dict:
    from unittest import mock

    from stormdrop import load_model, open_database
    from stormdrop.target import num_cores
    from stormdrop.timing import (
        in_turns,
        kernel_times,
        max_abs_diff,
        peers,
        random_inputs,
        run_tvm,
        tuned_build,
        tvm_timer,
    )
    from stormdrop.tvm_compat import tir_pipeline  # what this benchmark changes: an internal

    model = load_model(path, seed=args.seed)
    inputs = random_inputs(model, args.seed)
    found = peers(model, inputs, num_cores(target))  # OpenVINO timed where its outputs match
    ref, timers, out = found.reference, dict(found.timers), {"model": os.path.basename(path), "diff": {}}
    db_path = os.path.join(args.db_dir, os.path.basename(path) + ".db")
    changed: list[str] = []
    builds = {}
    with open_database(db_path, read_only=True) as db:
        for arm, pipeline in (("default", "default"), ("stormdrop", None)):
            with mock.patch.object(tir_pipeline, "split_row_vectors", _counting_splits(changed)):
                ex, rows = tuned_build(model, db, target, tir_pipeline=pipeline)
            outs, _ = run_tvm(ex, inputs, target, time_it=False)
            err, scale = max_abs_diff(outs, ref)
            out["diff"][arm] = err / scale
            timers[arm] = tvm_timer(ex, inputs, target)
            builds[arm] = ex
    out["tasks"], out["kernels_split"] = len(rows), sorted(set(changed))
    # the split kernels' time inside each build: the medians of three runs of 10, the builds taking turns
    times: dict[str, list[float]] = {arm: [] for arm in builds}
    for _ in range(3 if changed else 0):
        for arm, ex in builds.items():
            per = kernel_times(ex, inputs, target, runs=10)
            times[arm].append(sum(v for k, v in per.items() if k in out["kernels_split"]))
    out["split_kernels_s"] = {arm: sorted(v)[len(v) // 2] for arm, v in times.items() if v}
    out["latency_s"] = in_turns(timers, rounds=args.rounds)
    return out


def row(r: dict) -> list[str]:
    lat = r["latency_s"]
    ms = {k: f"{v * 1e3:.2f}" for k, v in lat.items()}
    ov = lat.get("openvino")
    split = r["split_kernels_s"]
    return [r["model"], f"{len(r['kernels_split'])} of {r['tasks']}",
            f"{split['default'] * 1e3:.3f}" if split else "-", f"{split['stormdrop'] * 1e3:.3f}" if split else "-",
            ms["default"], ms["stormdrop"], f"{lat['default'] / lat['stormdrop']:.3f}x",
            ms["onnxruntime"], ms.get("openvino", "n/a"), f"{lat['onnxruntime'] / lat['stormdrop']:.2f}x",
            f"{ov / lat['stormdrop']:.2f}x" if ov else "n/a", f"{max(r['diff'].values()):.1e}"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import each_row, machine, pinned_host, publish, table

    target, key = pinned_host()
    _, rows = each_row(args.models, lambda path: bench_one(path, args, target), row, args.json, key, "models")
    lines = ["", f"## TIR pipeline, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             "- each model's tuned schedules (its database) compiled twice: through TVM's default TIR pipeline and "
             "through stormdrop's (vector loops that cross a row split first); kernels split: the model's kernels the "
             "split changed, and their summed time inside each build (ms, medians of 3 turns of 10 runs); latencies in "
             f"ms: median of {args.rounds} rounds in which the four take turns; gain = TVM's / stormdrop's (a model "
             "with no kernel split is the same code twice); max diff: both builds' outputs against ONNX Runtime's, "
             "relative to their scale", "", *table(HEADER, rows)]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
