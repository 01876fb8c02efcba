"""A model's set-up: the reference outputs of its tasks (what each candidate is checked against),
made one after another by the runner (one task at a time, ``Gateway.make_references([key])``), or
compiled side by side by the builders and run by the runner (``Gateway.make_references()``, what
``tune`` does), the two arms taking turns on fresh gateways (worker start-up included).

    PYTHONPATH=src python benchmarks/bench_setup.py --models densenet121.onnx,googlenet@96 \\
        --json benchmarks/results_setup_X.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

ARMS = ("runner", "builders")
HEADER = ["model", "input", "tasks", "one at a time s", "side by side s", "speed-up"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma-separated zoo names or ONNX files, NAME@RES for an input size")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def references_s(tasks: list, target, arm: str) -> float:
    """Wall seconds from a fresh gateway to every task's reference made, as ``arm`` makes them."""
    from stormdrop import MeasureConfig
    from stormdrop.measure.gateway import Gateway

    start = time.monotonic()
    with Gateway(target, MeasureConfig().for_models(target)) as gw:
        for i, (kernel, _) in enumerate(tasks):
            gw.prepare(f"task{i}", kernel.mod)
        if arm == "builders":
            gw.make_references()
        else:
            for i in range(len(tasks)):
                gw.make_references([f"task{i}"])
        return time.monotonic() - start


def bench_one(spec: str, rounds: int, target) -> dict:
    from stormdrop import extract_tasks, load_model

    name, _, res = spec.partition("@")
    model = load_model(name, resolution=int(res)) if res else load_model(name)
    _, tasks = extract_tasks(model, target)
    secs: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            secs[arm].append(references_s(tasks, target, arm))
            print(f"  {name}: {arm} {secs[arm][-1]:.1f} s", flush=True)
    return {"model": os.path.splitext(os.path.basename(name))[0], "input": res or "model's", "tasks": len(tasks), "seconds": secs}


def row(r: dict) -> list[str]:
    one, side = (statistics.median(r["seconds"][arm]) for arm in ARMS)
    return [r["model"], r["input"], str(r["tasks"]), f"{one:.1f}", f"{side:.1f}", f"{one / side:.2f}x"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import each_row, machine, publish, table

    from stormdrop.target import canonical, host_target

    target = host_target()
    key = canonical(target)
    _, rows = each_row(args.models, lambda spec: bench_one(spec, args.rounds, target), row, args.json, key, "models")
    lines = ["", f"## Set-up, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             "- seconds from a fresh gateway (its worker processes started) to every task's reference output made: "
             "one task at a time by the runner, or compiled side by side by the builders and run by the runner "
             f"(`tune`'s set-up); medians of {args.rounds} rounds in which the two take turns", "", *table(HEADER, rows)]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
