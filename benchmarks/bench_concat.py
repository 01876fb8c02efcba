"""Channel concatenations in NHWC: TVM's legalization (one block, each element choosing its input)
against ``concat.copies`` (one copy per input into its slice), each tuned with the same seed and
trials, then the two best schedules re-timed by one measurement gateway, taking turns for
``--rounds`` rounds (median). The defaults are the shapes of squeezenet1_0's, googlenet's and a
DenseNet's concatenations at 96x96.

    PYTHONPATH=src python benchmarks/bench_concat.py --trials 16
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile

SHAPES = ["22x64+64", "11x192+192", "6x64+128+32+32", "6x256+32"]  # side x the inputs' channels
VARIANTS = ("tvm", "copies")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES),
                   help="comma-separated HxC1+C2+...: inputs of H x H pixels and C1, C2, ... channels, batch 1")
    p.add_argument("--trials", type=int, default=16, help="storm trials; the raindrop gets as many")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def kernel(variant: str, side: int, channels: list[int]):
    import tvm
    from tvm import te, topi

    from stormdrop.lowering.concat import copies
    from stormdrop.workloads import Kernel

    shapes = [[1, side, side, c] for c in channels]
    if variant == "tvm":  # relax.concat's own legalization
        xs = [te.placeholder(s, "float32", name=f"x{i}") for i, s in enumerate(shapes)]
        func = te.create_prim_func([*xs, topi.concatenate(xs, axis=3)])
    else:
        func = copies(shapes, 3, "float32")
    name = f"concat_{variant}_{side}x{side}x{'+'.join(map(str, channels))}"
    return Kernel(name, name, f"concat_{variant}", tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), 0)


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, pair_rows, pinned_host, publish, save_json, table, tuned_and_retimed

    target, key = pinned_host()
    raw = []
    with tempfile.TemporaryDirectory(prefix="bench-concat-") as tmp:
        for shape in args.shapes.split(","):
            side, _, parts = shape.lower().partition("x")
            channels = [int(c) for c in parts.split("+")]
            entry = {"side": int(side), "channels": channels, "bytes": 4 * int(side) ** 2 * sum(channels)}
            entry.update(tuned_and_retimed(target, {v: kernel(v, int(side), channels) for v in VARIANTS},
                                           args.trials, args.rounds, args.seed, tmp))
            raw.append(entry)
            print(json.dumps(entry), flush=True)
    save_json(args.json, key, "rows", raw)
    header = ["concatenation (1 x H x W x C1+C2+...)", "TVM's us", "copies us", "TVM's GB/s", "copies GB/s",
              "copies / TVM's speed", "TVM's tuning s", "copies tuning s"]
    rows, summary = pair_rows(raw, "tvm", "copies", lambda e: f"{e['side']}x{e['side']}x{'+'.join(map(str, e['channels']))}")
    lines = ["", f"## Concatenations, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- NHWC concatenations on the channel axis, TVM's legalization ('TVM's') against `concat.copies` "
             f"('copies'), each tuned {args.trials} storm + {args.trials} raindrop trials (seed {args.seed}), the "
             f"bests re-timed in turns ({args.rounds} rounds, median; inputs warm in the caches); GB/s = the "
             "output's bytes / time", "",
             *table(header, rows),
             "", summary, ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
