"""Winograd A/B: 3x3 stride-1 NHWC convolutions tuned direct and as Winograd F(2x2) and
F(4x4), same seed and trials, on held-out shapes; then the three best schedules are
re-timed by one measurement gateway, taking turns for ``--rounds`` rounds (median).

A Winograd kernel takes its weights already transformed (a model transforms them once,
at compile time), so the three variants compute the same convolution from the same
activations; GFLOPS are a direct convolution's FLOPs over the time. The default
shapes are in no zoo network and were not looked at when ``winograd.choose_tile``'s
``auto`` rule was set (on ResNet-18's four 3x3 shapes): the column 'auto' says which
variant the rule picks for each.

    PYTHONPATH=src python benchmarks/bench_winograd.py --trials 32
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

HELD_OUT = [(80, 36), (160, 18), (320, 9)]  # (channels in = out, image side); pad 1 keeps the side
VARIANTS = {"direct": 0, "winograd2": 2, "winograd4": 4}


DEFAULT_SHAPES = ",".join(f"{c}x{h}" for c, h in HELD_OUT)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=DEFAULT_SHAPES,
                   help="comma-separated CxH: C channels in and out, an H x H image")
    p.add_argument("--trials", type=int, default=32, help="storm trials; the raindrop gets as many")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def spec(c: int, h: int, m: int) -> str:
    return f"conv2d:N=1,C={c},H={h},W={h},K={c},R=3,S=3,pad=1,layout=NHWC" + (f",winograd={m}" if m else "")


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, pinned_host, publish, save_json, table, tuned_and_retimed

    from stormdrop import parse_kernel
    from stormdrop.lowering.winograd import choose_tile

    target, key = pinned_host()
    raw = []
    with tempfile.TemporaryDirectory(prefix="bench-wino-") as tmp:
        for shape in args.shapes.split(","):
            c, h = (int(x) for x in shape.lower().split("x"))
            m = choose_tile("auto", (h, h), c, c)
            entry = {"channels": c, "side": h, "auto": f"winograd{m}" if m else "direct"}
            kernels = {name: parse_kernel(spec(c, h, mm)) for name, mm in VARIANTS.items()}
            entry["flops"] = kernels["direct"].flops
            entry.update(tuned_and_retimed(target, kernels, args.trials, args.rounds, args.seed, tmp))
            raw.append(entry)
            print(json.dumps(entry), flush=True)
    save_json(args.json, key, "rows", raw)
    header = ["conv (C in = out, H x W)", *(f"{n} us" for n in VARIANTS), *(f"{n} GFLOPS" for n in VARIANTS),
              "fastest", "auto picks", "auto / direct speed", *(f"{n} tuning s" for n in VARIANTS)]
    rows, speeds = [], []
    for e in raw:
        t = {n: e[n].get("retimed_s") for n in VARIANTS}
        done = {n: s for n, s in t.items() if s}
        fastest = min(done, key=done.get) if done else "-"
        speed = t["direct"] / t[e["auto"]] if t["direct"] and t[e["auto"]] else None
        if speed:
            speeds.append(speed)
        rows.append([f"{e['channels']} ch, {e['side']}x{e['side']}",
                     *(f"{s * 1e6:.1f}" if s else "-" for s in t.values()),
                     *(f"{e['flops'] / s / 1e9:.0f}" if s else "-" for s in t.values()),
                     fastest, e["auto"], f"{speed:.2f}" if speed else "-",
                     *(f"{e[n]['tuning_s']:.0f}" for n in VARIANTS)])
    lines = ["", f"## Winograd, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- {'held-out ' if args.shapes == DEFAULT_SHAPES else ''}3x3 stride-1 NHWC convolutions, each variant tuned {args.trials} storm + {args.trials} "
             f"raindrop trials (seed {args.seed}), the bests re-timed in turns ({args.rounds} rounds, median); "
             "GFLOPS = a direct convolution's FLOPs / time; 'auto picks' = `--winograd auto`'s choice", "",
             *table(header, rows),
             "", f"- geometric mean speed of auto's pick over direct: {statistics.geometric_mean(speeds):.2f} "
             f"over {len(speeds)} convolutions" if speeds else "- no run finished", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
