"""Layout benchmark: the same network tuned with each convolution layout, timed side by side.

Phase 1 tunes the network once per layout (``stormdrop tune --model ... --layout L``,
one database per layout in ``--db-dir``; an existing database is used as it is, not
tuned again). Phase 2, in this one process on the same inputs and thread count,
compiles each layout from its database, checks it against ONNX Runtime and times it,
and times ONNX Runtime. Use networks that are in no other benchmark (the default,
googlenet, is in none): this chose stormdrop's default layout.

    PYTHONPATH=src python benchmarks/bench_layouts.py --models googlenet --resolution 112 --trials 320
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="googlenet")
    p.add_argument("--layouts", default="nhwc,blocked,nchw")
    p.add_argument("--resolution", type=int, default=112)
    p.add_argument("--trials", type=int, default=320, help="global trial budget per tuning run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--db-dir", default="bench-layout-dbs", help="one database per model and layout")
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, publish, save_json, table
    from bench_kernels import pin_threads

    from stormdrop import Lowering, ModelOptions, load_model, open_database, tune_model
    from stormdrop.target import canonical, host_target, num_cores, physical_cores
    from stormdrop.timing import (
        max_abs_diff,
        onnxruntime_timer,
        random_inputs,
        run_tvm,
        tuned_build,
    )

    pin_threads(physical_cores())
    target = host_target()
    os.makedirs(args.db_dir, exist_ok=True)
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    raw = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        model = load_model(name, resolution=args.resolution, seed=args.seed)
        entry = {"model": name, "layouts": {}}
        for layout in layouts:  # phase 1: tune (or reuse) one database per layout
            db = os.path.join(args.db_dir, f"{name}_{args.resolution}_{layout}.db")
            if os.path.exists(db):
                entry["layouts"][layout] = {"db": db, "tuning_s": None}
                continue
            t0 = time.monotonic()
            tune_model(model, ModelOptions(trials=args.trials, seed=args.seed, lowering=Lowering(layout)),
                       target=target, db=db)
            entry["layouts"][layout] = {"db": db, "tuning_s": time.monotonic() - t0}
            print(f"  {name} {layout}: tuned in {entry['layouts'][layout]['tuning_s']:.0f} s", flush=True)
        inputs = random_inputs(model, args.seed)  # phase 2: time everything here, one after the other
        ref, ort = onnxruntime_timer(model.onnx_model, inputs, num_cores(target))
        entry["onnxruntime_s"] = ort()
        for layout in layouts:
            cell = entry["layouts"][layout]
            with open_database(cell["db"]) as db:
                ex, rows = tuned_build(model, db, target, Lowering(layout))
            outs, lat = run_tvm(ex, inputs, target)
            err, scale = max_abs_diff(outs, ref)
            cell.update(latency_s=lat if err <= 1e-3 * scale else None, max_abs_diff=err, tasks=len(rows),
                        trials=sum(r.trials for r in rows),
                        tasks_sum_s=sum(r.weight * r.latency_s for r in rows if r.latency_s))
            print(f"  {name} {layout}: {cell}", flush=True)
        raw.append(entry)
    header = ["model", "ONNX Runtime ms", *(f"{lay} ms" for lay in layouts), *(f"ORT/{lay}" for lay in layouts)]
    rows = []
    for e in raw:
        lats = [e["layouts"][lay].get("latency_s") for lay in layouts]
        rows.append([e["model"], f"{e['onnxruntime_s'] * 1e3:.2f}",
                     *(f"{v * 1e3:.2f}" if v else "wrong" for v in lats),
                     *(f"{e['onnxruntime_s'] / v:.2f}" if v else "-" for v in lats)])
    lines = ["", f"## Layouts, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{canonical(target)}`", f"- command: `{' '.join(sys.argv)}`",
             f"- each layout tuned with {args.trials} global trials at resolution {args.resolution} "
             "(databases in --db-dir; tuning seconds in the JSON), then every build timed in one process "
             "(Relax VM, median of 5 x >= 100 ms) next to ONNX Runtime; ORT/x > 1: x faster than ONNX Runtime", "",
             *table(header, rows),
             ""]
    save_json(args.json, canonical(target), "models", raw)
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
