"""Two code versions' reuse + raindrop arms of an A/B timed in one process, taking turns.

Each version tuned the same pair with ``bench_reuse.py --keep-tuned`` into its own ``--db-dir``
(copies of one earlier run's donor and (d), so (d) is the same database); each version's own
final timing ran in a process of its own, so their latencies do not compare. This times (d),
both (c) databases and ONNX Runtime in one process, in turns, and prints each (c)'s fraction
of (d)'s speedup, ``d / c``.

Usage: ``python benchmarks/reuse_ab_timing.py --pair alexnet:DIR_A:DIR_B [--pair ...] --json OUT``
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pair", action="append", required=True, help="TARGET:DIR_A:DIR_B (bench_reuse --db-dir of each)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_kernels import pin_threads

    from stormdrop.target import host_target, physical_cores

    pin_threads(physical_cores())
    from stormdrop import load_model, open_database
    from stormdrop.target import canonical, num_cores
    from stormdrop.timing import in_turns, onnxruntime_timer, random_inputs, tuned_build, tvm_timer

    target = host_target()
    out = {"command": " ".join(["benchmarks/reuse_ab_timing.py", *(argv or sys.argv[1:])]),
           "target": canonical(target), "pairs": []}
    for spec in args.pair:
        name, *dirs = spec.split(":")
        model = load_model(name, seed=0)
        inputs = random_inputs(model, 0)
        _, ort = onnxruntime_timer(model.onnx_model, inputs, num_cores(target))
        timers = {"onnxruntime": ort}
        with open_database(os.path.join(dirs[0], f"{name}_scratch.db")) as d:
            timers["scratch"] = tvm_timer(tuned_build(model, d, target)[0], inputs, target)
        row = {"target": name}
        for arm, db_dir in zip("AB", dirs):
            with open_database(os.path.join(db_dir, f"{name}_reuse_raindrop.db")) as d:
                timers[arm] = tvm_timer(tuned_build(model, d, target)[0], inputs, target)
            with open(os.path.join(db_dir, "tuning.json")) as f:
                tuning = [t for t in json.load(f)["pairs"] if t["target"] == name][0]
            row[f"{arm}_tuning_s"], row["scratch_tuning_s"] = tuning["reuse_raindrop_tuning_s"], tuning["scratch_tuning_s"]
        row.update({f"{k}_s": v for k, v in in_turns(timers, rounds=args.rounds).items()})
        for arm in "AB":
            row[f"{arm}_fraction"] = row["scratch_s"] / row[f"{arm}_s"]
            row[f"{arm}_time_share"] = row[f"{arm}_tuning_s"] / row["scratch_tuning_s"]
        out["pairs"].append(row)
        print(f"{name}: (d) {row['scratch_s'] * 1e3:.2f} ms, A {row['A_s'] * 1e3:.2f} ms ({row['A_fraction']:.1%} of "
              f"(d)'s speedup, {row['A_time_share']:.1%} of its time), B {row['B_s'] * 1e3:.2f} ms "
              f"({row['B_fraction']:.1%}, {row['B_time_share']:.1%}), ONNX Runtime {row['onnxruntime_s'] * 1e3:.2f} ms",
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
