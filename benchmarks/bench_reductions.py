"""Global average pooling in NHWC: TVM's legalization (a sum over H and W, then a divide) against
``reductions.weighted_sum`` (the same mean as a reduction that multi-level tiling tiles), each
tuned with the same seed and trials, then the two best schedules re-timed by one measurement
gateway, taking turns for ``--rounds`` rounds (median).

The shape that chose the rewrite is 1x112x112x128 (issue 35's MobileNet-like CNN); the
defaults below are held out from it.

    PYTHONPATH=src python benchmarks/bench_reductions.py --trials 48
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

HELD_OUT = [(56, 256), (28, 512), (14, 1024)]  # (image side, channels)
VARIANTS = ("default", "tiled")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(f"{h}x{c}" for h, c in HELD_OUT),
                   help="comma-separated HxC: an H x H image of C channels, batch 1")
    p.add_argument("--trials", type=int, default=48, help="storm trials; the raindrop gets as many")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def kernel(variant: str, h: int, c: int):
    import numpy as np
    import tvm
    from tvm import te, topi

    from stormdrop.lowering.reductions import weighted_sum
    from stormdrop.workloads import Kernel

    x = te.placeholder((1, h, h, c), "float32", name="x")
    if variant == "default":  # relax.mean's own legalization
        tensors = [x, topi.divide(topi.sum(x, axis=[1, 2], keepdims=True), float(h * h))]
    else:
        w = te.placeholder((h,), "float32", name="w")
        tensors = [x, w, weighted_sum(x, w, [1, 2], True)]
    mod = tvm.IRModule({"main": te.create_prim_func(tensors)})
    name = f"mean_{variant}_{h}x{h}x{c}"
    return Kernel(name, name, f"mean_{variant}", mod, int(np.prod(x.shape)))


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, pair_rows, pinned_host, publish, save_json, table, tuned_and_retimed


    target, key = pinned_host()
    raw = []
    with tempfile.TemporaryDirectory(prefix="bench-red-") as tmp:
        for shape in args.shapes.split(","):
            h, c = (int(v) for v in shape.lower().split("x"))
            entry = {"side": h, "channels": c, "bytes": 4 * h * h * c}
            entry.update(tuned_and_retimed(target, {v: kernel(v, h, c) for v in VARIANTS}, args.trials, args.rounds,
                                           args.seed, tmp))
            raw.append(entry)
            print(json.dumps(entry), flush=True)
    save_json(args.json, key, "rows", raw)
    header = ["mean over H, W (1 x H x W x C)", "default us", "tiled us", "default GB/s", "tiled GB/s",
              "tiled / default speed", "default tuning s", "tiled tuning s"]
    rows, summary = pair_rows(raw, "default", "tiled", lambda e: f"{e['side']}x{e['side']}x{e['channels']}")
    lines = ["", f"## Reductions, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- NHWC global average pooling, TVM's legalization ('default') against `reductions.weighted_sum` "
             f"('tiled'), each tuned {args.trials} storm + {args.trials} raindrop trials (seed {args.seed}), the "
             f"bests re-timed in turns ({args.rounds} rounds, median; inputs warm in the caches); GB/s = the "
             "input's bytes / time", "",
             *table(header, rows),
             "", summary, ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
