"""A lowering change on whole models with every other kernel the same: each model tuned with the
default lowering into one database (``--trials``), then tuned into the same database with one
``Lowering`` field changed (``--change FIELD=VALUE``, ``--change-trials``: the kernels the change
makes get their first rounds there, the others more trials that both builds share); both builds
compiled from the database's best records, outputs checked against ONNX Runtime, and timed in
turns with ONNX Runtime and OpenVINO. Two tunes of one tree differ by several percent at small
budgets; here only the kernels the change touches differ between the builds.

    PYTHONPATH=src python benchmarks/bench_same_db.py --models squeezenet1_0 --resolution 96 \\
        --change concat_copies=false --json benchmarks/results_same_db_X.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import tempfile

HEADER = ["model", "tasks", "kernels only in one build", "their stored ms (default / changed)", "default ms",
          "changed ms", "changed / default", "ONNX Runtime ms", "OpenVINO ms", "ORT / default", "max diff"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma-separated zoo names and .onnx paths")
    p.add_argument("--resolution", type=int, default=None, help="image models' input size (default: the paper's)")
    p.add_argument("--change", required=True, help="FIELD=VALUE: the Lowering field the second build changes "
                   "(a bool: true or false)")
    p.add_argument("--trials", type=int, default=128, help="the first tune's global trial budget")
    p.add_argument("--change-trials", type=int, default=64, help="the second tune's global trial budget")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def changed_lowering(spec: str):
    """The default ``Lowering`` and that with the ``FIELD=VALUE`` of ``spec`` (``_arms.fields``)."""
    from _arms import fields

    from stormdrop import Lowering

    default = Lowering()
    return default, dataclasses.replace(default, **fields(spec, default, "--change"))


def bench_one(spec: str, args: argparse.Namespace, target, work: str) -> dict:
    from stormdrop import ModelOptions, extract_tasks, load_model, open_database, tune_model
    from stormdrop.target import num_cores
    from stormdrop.timing import (
        in_turns,
        max_abs_diff,
        peers,
        random_inputs,
        run_tvm,
        tuned_build,
        tvm_timer,
    )

    model = load_model(spec, resolution=args.resolution, seed=args.seed)
    db_path = os.path.join(work, f"{os.path.basename(spec)}.db")
    arms = dict(zip(("default", "changed"), changed_lowering(args.change)))
    # a trial cap counts the records a database holds for the model's tasks: the second tune's is the sum
    for arm, trials in (("default", args.trials), ("changed", args.trials + args.change_trials)):
        tune_model(model, ModelOptions(trials=trials, seed=args.seed, lowering=arms[arm]), target=target, db=db_path)
    inputs = random_inputs(model, args.seed)
    found = peers(model, inputs, num_cores(target))
    ref, timers = found.reference, dict(found.timers)
    out = {"model": os.path.basename(spec), "diff": {}, "rows": {}}
    with open_database(db_path, read_only=True) as db:
        note = db.model_notes().get(model.name, {})
        for arm, lowering in arms.items():
            # both as the tunes lowered them (a trial cap that kept every convolution direct: the last
            # tune's note, which the other arm's tasks do not match, so tuned_build would not apply it)
            lowering = lowering.as_tuned(note)
            ex, rows = tuned_build(model, db, target, lowering=lowering, deployed=False)
            _, tasks = extract_tasks(model, target, lowering)
            ids = [getattr(db.find_workload(k.mod), "workload_id", k.name) for k, _ in tasks]
            outs, _ = run_tvm(ex, inputs, target, time_it=False)
            err, scale = max_abs_diff(outs, ref)
            out["diff"][arm] = err / scale
            out["rows"][arm] = {str(i): (r.name, r.weight, r.latency_s, r.trials) for i, r in zip(ids, rows)}
            timers[arm] = tvm_timer(ex, inputs, target)
    out["latency_s"] = in_turns(timers, rounds=args.rounds)
    return out


def row(r: dict) -> list[str]:
    lat, rows = r["latency_s"], r["rows"]
    only = {arm: [n for n in rows[arm] if n not in rows[other]]
            for arm, other in (("default", "changed"), ("changed", "default"))}

    def stored(arm: str) -> str:
        secs = [rows[arm][n][1] * rows[arm][n][2] for n in only[arm] if rows[arm][n][2]]
        return f"{sum(secs) * 1e3:.3f}" if secs else "-"

    ov = lat.get("openvino")
    return [r["model"], str(len(rows["default"])), f"{len(only['default'])} / {len(only['changed'])}",
            f"{stored('default')} / {stored('changed')}", f"{lat['default'] * 1e3:.3f}", f"{lat['changed'] * 1e3:.3f}",
            f"{lat['changed'] / lat['default']:.3f}", f"{lat['onnxruntime'] * 1e3:.3f}",
            f"{ov * 1e3:.3f}" if ov else "n/a", f"{lat['onnxruntime'] / lat['default']:.2f}x",
            f"{max(r['diff'].values()):.1e}"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import each_row, machine, publish, table

    from stormdrop.target import canonical, host_target

    target = host_target()
    key = canonical(target)
    changed_lowering(args.change)  # a bad field fails before any tuning
    with tempfile.TemporaryDirectory(prefix="bench-same-db-") as work:
        _, rows = each_row(args.models, lambda spec: bench_one(spec, args, target, work), row, args.json, key, "models")
    lines = ["", f"## Same database, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- each model tuned with the default lowering ({args.trials} trials), then with `{args.change}` "
             f"({args.change_trials} more trials) into the same database; both builds from its best records; "
             "kernels only in one build: the tasks one lowering has and the other has not, their weight x stored "
             f"latency summed; latencies in ms: median of {args.rounds} rounds in which the four take turns; max "
             "diff: both builds' outputs against ONNX Runtime's, relative to their scale", "", *table(HEADER, rows)]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
