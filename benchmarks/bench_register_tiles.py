"""Register-tile jumps A/B: the same kernels tuned with and without the raindrop's
register-tile jumps (``--register-tiles 0`` vs the default), on held-out kernels.

Each kernel is tuned once per setting (same seed and trials, one database per
setting); then the two best schedules are re-timed side by side by the same
measurement gateway, taking turns for ``--rounds`` rounds, so the comparison
does not rest on each run's own (optimistic) best-of-many figure. The default
kernels are in no zoo network and were not looked at when the jumps were designed
(their shapes came from ResNet-18's convolutions at 224x224).

    PYTHONPATH=src python benchmarks/bench_register_tiles.py --trials 32
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

HELD_OUT = [
    "conv2d:N=1,C=80,H=36,W=36,K=80,R=3,S=3,pad=1,layout=NHWC",
    "conv2d:N=1,C=160,H=18,W=18,K=160,R=3,S=3,pad=1,layout=NHWC",
    "conv2d:N=1,C=320,H=9,W=9,K=320,R=3,S=3,pad=1,layout=NHWC",
    "conv2d:N=1,C=240,H=18,W=18,K=96,R=1,S=1,layout=NHWC",
    "dense:M=48,N=1280,K=640",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", default=";".join(HELD_OUT), help="';'-separated kernel specs")
    p.add_argument("--trials", type=int, default=32, help="storm trials; the raindrop gets as many")
    p.add_argument("--register-tiles", type=int, default=8, help="the 'on' setting")
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, pinned_host, publish, save_json, table

    from stormdrop import (
        KernelOptions,
        RaindropConfig,
        SearchOptions,
        open_database,
        parse_kernel,
        tune_kernel,
    )
    from stormdrop.measure.gateway import Gateway
    from stormdrop.tvm_compat.trace_json import schedule_from_trace_json

    target, key = pinned_host()
    settings = {"off": 0, "on": args.register_tiles}
    raw = []
    with tempfile.TemporaryDirectory(prefix="bench-rt-") as tmp:
        for spec in [k.strip() for k in args.kernels.split(";") if k.strip()]:
            kernel = parse_kernel(spec)
            for seed in [int(s) for s in args.seeds.split(",")]:
                entry = {"kernel": spec, "seed": seed, "flops": kernel.flops}
                best = {}
                for name, n in settings.items():
                    path = os.path.join(tmp, f"{kernel.name}-{seed}-{name}.db")
                    r = tune_kernel(kernel,
                                    KernelOptions(trials=args.trials, exploit_trials=args.trials, seed=seed,
                                                  search=SearchOptions(raindrop=RaindropConfig(register_tiles=n))),
                                    target=target, db=path)
                    t = r.tasks[0]
                    entry[name] = {"stored_s": t.latency_s, "tuning_s": t.tuning_s, "trials": t.trials}
                    with open_database(path) as db:
                        wl = db.find_workload(kernel.mod)
                        best[name] = db.best(wl.workload_id, key, k=1)[0]
                with Gateway(target) as gw:
                    gw.prepare(spec, kernel.mod, seed)
                    mods = {n: schedule_from_trace_json(kernel.mod, b.trace_json).mod for n, b in best.items()}
                    times = {n: [] for n in mods}
                    for _ in range(args.rounds):
                        for n, res in zip(mods, gw.measure(spec, list(mods.values()))):
                            if res.run_secs:
                                times[n].append(statistics.mean(res.run_secs))
                for n in settings:
                    entry[n]["retimed_s"] = statistics.median(times[n]) if times[n] else None
                raw.append(entry)
                print(json.dumps(entry), flush=True)
    save_json(args.json, key, "rows", raw)
    header = ["kernel", "seed", "off us (re-timed)", "on us (re-timed)", "on/off speed", "off stored us",
              "on stored us", "off tuning s", "on tuning s"]
    rows = []
    for e in raw:
        off, on = e["off"], e["on"]
        speed = f"{off['retimed_s'] / on['retimed_s']:.2f}" if off.get("retimed_s") and on.get("retimed_s") else "-"
        rows.append([e["kernel"], str(e["seed"]), *(f"{d['retimed_s'] * 1e6:.1f}" if d.get("retimed_s") else "-"
                                                    for d in (off, on)),
                     speed, *(f"{d['stored_s'] * 1e6:.1f}" if d.get("stored_s") else "-" for d in (off, on)),
                     *(f"{d['tuning_s']:.0f}" for d in (off, on))])
    speeds = [e["off"]["retimed_s"] / e["on"]["retimed_s"] for e in raw
              if e["off"].get("retimed_s") and e["on"].get("retimed_s")]
    lines = ["", f"## Register tiles, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- {args.trials} storm + {args.trials} raindrop trials per kernel and setting; 'on' = "
             f"--register-tiles {args.register_tiles}, 'off' = 0; the two best schedules re-timed side by side "
             f"({args.rounds} rounds, median); on/off speed > 1: the jumps found the faster schedule", "",
             *table(header, rows),
             "", f"- geometric mean on/off speed: {statistics.geometric_mean(speeds):.3f} over {len(speeds)} runs"
             if speeds else "- no run finished", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
