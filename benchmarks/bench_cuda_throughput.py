"""Candidates per minute on a GPU: stormdrop's measurement gateway against MetaSchedule's
``LocalBuilder`` + ``LocalRunner``, on the same candidates.

The storm's first sample of one kernel (seed 0) is built and timed by each arm, the arms in
turns, one batch each a round, after one untimed batch each (processes started, TVM imported):

- ``stormdrop``: ``Gateway.measure`` (a builder on every core; each candidate's CUDA source
  compiled once, ``tvm_compat.nvrtc.compiling``);
- ``MetaSchedule``: ``LocalBuilder`` (its workers given the cheap intrinsics import, as
  ``bench_kernels.py`` does) and ``LocalRunner`` with their defaults (no output check).

stormdrop checks each candidate's outputs and takes 5 samples of >= 20 ms; MetaSchedule's
runner one sample of >= 100 ms. The JSON is written after every batch (a run cut short keeps its
batches; its totals then count round 0 where no later round ended). ``--target llvm`` rehearses every
step on a CPU host.

    python benchmarks/bench_cuda_throughput.py --candidates 32 --rounds 2 --json OUT.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def stormdrop_arm(target, key, workload):
    from stormdrop import MeasureConfig
    from stormdrop.measure.gateway import Gateway

    gw = Gateway(target, MeasureConfig())
    gw.prepare(key, workload)

    def measure(mods) -> int:
        return sum(r.ok for r in gw.measure(key, mods))

    return measure, gw.close


def meta_schedule_arm(target):
    import tvm.s_tir.meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics

    builder = ms.builder.LocalBuilder(timeout_sec=60.0, initializer=functools.partial(load_tensor_intrinsics, "llvm"))
    runner = ms.runner.LocalRunner(timeout_sec=30.0)
    device = "cuda" if target.kind.name == "cuda" else "cpu"

    def measure(mods) -> int:
        built = builder.build([ms.builder.BuilderInput(m, target) for m in mods])
        inputs = [ms.runner.RunnerInput(b.artifact_path, device, ArgInfo.from_prim_func(m["main"]))
                  for b, m in zip(built, mods) if b.error_msg is None]
        ok = sum(1 for f in runner.run(inputs) if f.result().error_msg is None)
        for b in built:
            if b.artifact_path:
                os.remove(b.artifact_path)
        return ok

    return measure, lambda: None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", default="matmul:M=1024,N=1024,K=1024")
    p.add_argument("--target", default="cuda")
    p.add_argument("--candidates", type=int, default=32)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from _peers import quiet_meta_schedule

    from stormdrop import StormConfig, parse_kernel
    from stormdrop.search.storm import Storm
    from stormdrop.target import canonical, parse_target

    quiet_meta_schedule()
    target = parse_target(args.target)
    kernel = parse_kernel(args.kernel)
    storm = Storm(kernel.mod, target, trials=args.candidates, seed=0, config=StormConfig(batch_size=args.candidates))
    mods = [c.mod for c in storm.propose()]
    storm.close()
    print(f"{len(mods)} candidates of {args.kernel} on {canonical(target)}", flush=True)
    arms = {"stormdrop": stormdrop_arm(target, kernel.name, kernel.mod), "MetaSchedule": meta_schedule_arm(target)}
    rounds = []  # (round, arm, candidates, ok, seconds): round 0 untimed (processes start, TVM loads)
    for rnd in range(args.rounds + 1):
        for name, (measure, _) in arms.items():
            t0 = time.monotonic()
            good = measure(mods)
            rounds.append((rnd, name, len(mods), good, time.monotonic() - t0))
            print(f"round {rnd} {name}: {good}/{len(mods)} ok in {rounds[-1][-1]:.1f} s", flush=True)
            write_json(args, canonical(target), rounds)  # after every batch: a run cut short keeps what it did
    for _, close in arms.values():
        close()
    print("| arm | candidates | ok | seconds | candidates / min | vs MetaSchedule |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = totals(rounds)
    ms_per_min = next(r["per_min"] for r in rows if r["arm"] == "MetaSchedule")
    for row in rows:
        print(f"| {row['arm']} | {row['candidates']} | {row['ok']} | {row['seconds']:.1f} | {row['per_min']:.1f} | "
              f"{row['per_min'] / ms_per_min:.2f} |")
    return 0


def totals(rounds: list[tuple]) -> list[dict]:
    """Each arm's timed rounds (1 and later; round 0 where none other finished) summed."""
    out = []
    for name in dict.fromkeys(r[1] for r in rounds):
        mine = [r for r in rounds if r[1] == name]
        timed = [r for r in mine if r[0] > 0] or mine
        n, secs = sum(r[2] for r in timed), sum(r[4] for r in timed)
        out.append({"arm": name, "rounds": sorted({r[0] for r in timed}), "candidates": n,
                    "ok": sum(r[3] for r in timed), "seconds": round(secs, 2), "per_min": round(n * 60 / secs, 1)})
    return out


def write_json(args: argparse.Namespace, target: str, rounds: list[tuple]) -> None:
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "target": target, "kernel": args.kernel, "rows": totals(rounds),
                       "batches": [dict(zip(("round", "arm", "candidates", "ok", "seconds"), r)) for r in rounds]},
                      f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
