"""Time to fast: how long a user tunes before the model beats ONNX Runtime and OpenVINO, with and
without the schedule hub. Each case is a network tuned under one time budget
(``stormdrop tune --model M --time-budget S``), once with the hub and once without, into fresh
databases; the two builds are then timed against ONNX Runtime and OpenVINO in turns
(``bench_models.bench_one --hub ab``: same target string, same threads, outputs checked). Each
budget is its own run (what a user who gives that budget gets), not a prefix of a longer one.

A row also says how many of the network's tasks the hub holds exactly (its exact workloads: a
network the hub was built from has them all, a network it was not built from few or none), whether
the network was named held out before the run, and "faster after": the tuning time at which each
run's model became faster than ONNX Runtime by the tune's own reading (``ModelResult.faster_after_s``:
every task's best so far, scaled to the measured model), against the ONNX Runtime latency that tune
measured. ``--other-hub FILE``: the second arm tunes with that hub file (the hub before a rebuild)
instead of none, so a grown hub is measured against the one it replaces in the same run.
``--in-order-ab``: the second arm tunes with the hub too, every task's first round in the model's
order (``ModelOptions.warm_up="in order"``) instead of heaviest first. ``--measure-ab FIELD=VALUE``: the
second arm tunes with the hub too, with those ``MeasureConfig`` fields changed.

    PYTHONPATH=src python benchmarks/bench_time_to_fast.py --cases resnet50,resnet18@56 --budgets 60,120,300 \\
        --held-out resnet34 --json benchmarks/results_time_to_fast.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HEADER = ["network", "budget s", "held out", "hub's exact tasks", "ONNX Runtime ms", "OpenVINO ms", "hub ms",
          "no hub ms", "ORT / hub", "ORT / no hub", "OV / hub", "OV / no hub", "hub: faster than ORT after s",
          "no hub: faster than ORT after s"]


def hub_tasks(name: str, resolution: int | None, target, budget: float, hub_file: str | None = None
              ) -> tuple[int, int]:
    """(tasks whose workload the target's hub (or ``hub_file``) holds exactly, tasks) of the network as
    a tune under ``budget`` seconds lowers it (every convolution direct unless the hub holds its
    Winograd kernels)."""
    from stormdrop import Lowering, extract_tasks, load_model
    from stormdrop.model.tune import budgeted_extraction
    from stormdrop.storage.donors import tuned_in
    from stormdrop.storage.hub import open_hub
    from stormdrop.target import canonical

    model = load_model(name, **({"resolution": resolution} if resolution else {}))
    hub = open_hub(target, hub_file or True)
    if hub is None:
        return 0, len(extract_tasks(model, target)[1])
    with hub:
        _, tasks, _ = budgeted_extraction(model, target, Lowering(), (None, budget), [hub], True)
        return sum(tuned_in(k.mod, canonical(target), [hub]) for k, _ in tasks), len(tasks)


def main(argv: list[str] | None = None) -> int:
    import _arms

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="resnet50,resnet18@56", help="networks: NAME[@RESOLUTION] or .onnx paths")
    p.add_argument("--budgets", default="60,120,300,900", help="time budgets in seconds, each its own run")
    p.add_argument("--hub", default="ab", choices=["ab", "on"],
                   help="both arms (ab), or with the hub only (on: a network it holds nothing of)")
    p.add_argument("--other-hub", default=None, metavar="HUB.jsonl.gz", type=_arms.existing_file,
                   help="the second arm tunes with this hub file (e.g. the hub before a rebuild) instead of none")
    p.add_argument("--in-order-ab", action="store_true",
                   help="the second arm tunes with the hub, every task's first round in the model's order")
    p.add_argument("--measure-ab", default=None, metavar="FIELD=VALUE[,FIELD=VALUE]",
                   help="the second arm: the hub on too, these MeasureConfig fields changed (e.g. slow_build_factor=1e9)")
    p.add_argument("--held-out", default="", help="the networks named held out before the run (NAME or NAME@RES)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    p.add_argument("--exact-only", action="store_true",
                   help="print each case's exact hub tasks per budget (what a row's column says) and exit: no tuning")
    args = p.parse_args(argv)

    import bench_models
    from _peers import checkpoint, machine, pinned_host, publish, table

    arm, words = ("other_hub", "other hub") if args.other_hub else \
        ("in_order", "in order") if args.in_order_ab else \
        (_arms.config_arm("measure", args.measure_ab), args.measure_ab) if args.measure_ab else ("no_hub", "no hub")
    hub_only = bool(args.other_hub or args.in_order_ab or args.measure_ab)  # both arms with the hub
    header = [h.replace("no hub", words) for h in HEADER]
    target, key = pinned_host()
    held = {h.strip() for h in args.held_out.split(",") if h.strip()}
    budgets = [float(b) for b in args.budgets.split(",") if b.strip()]
    rows, raw = [], []

    def ms_(v):
        return f"{v * 1e3:.2f}" if v else "-"

    def ratio(peer, v):
        return f"{peer / v:.2f}" if peer and v else "-"

    def after(d):
        s = (d.get("faster_after_s") or {}).get("onnxruntime")
        return "-" if not d.get("faster_after_s") else ("never" if s is None else f"{s:.0f}")

    for case in filter(None, (c.strip() for c in args.cases.split(","))):
        name, _, res_text = case.partition("@")
        res = int(res_text) if res_text else None
        if args.exact_only:
            for budget in budgets:
                exact, num_tasks = hub_tasks(name, res, target, budget)
                print(f"{case}: {budget:.0f} s: the hub holds {exact} of its {num_tasks} tasks exactly", flush=True)
                if args.other_hub:
                    other, _ = hub_tasks(name, res, target, budget, args.other_hub)
                    print(f"{case}: {budget:.0f} s: the other hub holds {other} of them", flush=True)
            continue
        for budget in budgets:
            exact, num_tasks = hub_tasks(name, res, target, budget)
            print(f"[{case}, {budget:.0f} s]", flush=True)
            margs = bench_models.parse_args(["--models", name, "--time-budget", str(budget), "--skip-ms",
                                             "--rounds", str(args.rounds), "--seed", str(args.seed),
                                             "--hub", "on" if hub_only else args.hub]
                                            + (["--in-order-ab"] if args.in_order_ab else [])
                                            + (["--measure-ab", args.measure_ab] if args.measure_ab else [])
                                            + (["--resolution", str(res)] if res else [])
                                            + (["--other-hub", args.other_hub] if args.other_hub else []))
            r = bench_models.bench_one(name, margs, target)
            r = {k: ({kk: vv for kk, vv in v.items() if kk != "ex"} if isinstance(v, dict) else v) for k, v in r.items()}
            r.update(network=name, resolution=res, budget_s=budget, held_out=case in held or name in held,
                     hub_exact_tasks=exact, tasks=num_tasks)
            raw.append(r)
            sd, nh = r["stormdrop"], r.get(arm, {})
            ort, ov = r["onnxruntime_s"], r.get("openvino_s")
            rows.append([case, f"{budget:.0f}", "yes" if r["held_out"] else "no", f"{exact}/{num_tasks}", ms_(ort),
                         ms_(ov), ms_(sd.get("latency_s")) if sd.get("latency_s") else sd.get("status", "-"),
                         ms_(nh.get("latency_s")), ratio(ort, sd.get("latency_s")), ratio(ort, nh.get("latency_s")),
                         ratio(ov, sd.get("latency_s")), ratio(ov, nh.get("latency_s")), after(sd), after(nh)])
            checkpoint(rows[-1], args.json, key, "cases", raw)
    if args.exact_only:
        return 0
    lines = ["", f"## Time to fast, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- each row: `tune --model M --time-budget S` with the schedule hub ({bench_models._hub_name(target)}) "
             + (f"and with the hub file {os.path.basename(args.other_hub)}" if args.other_hub else
                "and with it, every task's first round in the model's order (--in-order-ab; 'hub': heaviest "
                "first)" if args.in_order_ab else f"and with it, {args.measure_ab} (--measure-ab)" if args.measure_ab
                else "and without it")
             + ", fresh databases, defaults otherwise; latencies in ms: median of "
             f"{args.rounds} rounds in which the peers take turns; ratios > 1: stormdrop faster; 'faster than ORT "
             "after': the tune's own reading (every task's best so far, scaled to the measured model, against the "
             "ONNX Runtime latency that tune measured), 'never': not faster when it ended", "",
             *table(header, rows),
             ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
