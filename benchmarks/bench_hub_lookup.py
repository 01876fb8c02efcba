"""Reuse's donor lookup in the shipped hub, as two code trees run it: for each of a model's tasks,
the donors that reuse would take from the hub (``search.donors.donors`` with ``StormConfig``'s
defaults, at most 8 a task), wall seconds from opening the hub to the last task's donors (the hub's
workloads decoded and checked on the way; task extraction left out). Each arm is a source tree (the
repository's ``src`` at some commit, e.g. a ``git worktree``) run in its own process, the arms taking
turns; the donors each arm found are compared (the same names in the same order, or the row says so).

    PYTHONPATH=src python benchmarks/bench_hub_lookup.py --models efficientnet_b0@176,googlenet@96 \\
        --trees before=/tmp/old/src,after=src --json benchmarks/results_hub_lookup_X.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HEADER = ["model", "input", "tasks", "hub workloads decoded", "arm", "seconds", "over the first arm", "same donors"]
DONORS_A_TASK = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", required=True, help="comma-separated zoo names or ONNX files, NAME@RES for an input size")
    p.add_argument("--trees", default="this=src", help="NAME=PATH of each arm's source tree, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: time one model in this process
    return p.parse_args(argv)


def lookup(spec: str) -> dict:
    """In this process (the arm's tree on the path): the model's tasks, then the timed lookup."""
    import tempfile

    from stormdrop import StormConfig, extract_tasks, load_model
    from stormdrop.search.donors import donors
    from stormdrop.storage.database import Database
    from stormdrop.storage.hub import open_hub
    from stormdrop.target import canonical, host_target

    target = host_target()
    key = canonical(target)
    name, _, res = spec.partition("@")
    model = load_model(name, resolution=int(res)) if res else load_model(name)
    _, tasks = extract_tasks(model, target)
    cfg = StormConfig()
    found = []
    with tempfile.TemporaryDirectory() as tmp, Database(os.path.join(tmp, "run.db")) as db:
        entries = [db.commit_workload(k.mod, name=k.name, op_class=k.op_class, flops=k.flops) for k, _ in tasks]
        start = time.monotonic()
        hub = open_hub(target)
        try:
            for entry in entries:
                names = []
                for donor, _ in donors(db, entry, key, [hub], order=cfg.donor_order,
                                       exact_sources=not cfg.hub_transfers, fastest_of=cfg.fastest_donors,
                                       exact_too=cfg.fastest_exact):
                    names.append(donor.name)
                    if len(names) >= DONORS_A_TASK:
                        break
                found.append(names)
            seconds = time.monotonic() - start
            decoded = len(Database.workloads(hub))  # those decoded on the way
        finally:
            hub.close()
    return {"tasks": len(tasks), "seconds": seconds, "decoded": decoded, "donors": found}


def run_arm(tree: str, spec: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--models", spec, "--one", spec],
                          env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {tree} on {spec}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_one(spec: str, trees: list[tuple[str, str]], rounds: int) -> dict:
    runs: dict[str, list[dict]] = {arm: [] for arm, _ in trees}
    for _ in range(rounds):
        for arm, tree in trees:
            runs[arm].append(run_arm(tree, spec))
            print(f"  {spec}: {arm} {runs[arm][-1]['seconds']:.2f} s", flush=True)
    name, _, res = spec.partition("@")
    first = runs[trees[0][0]][0]
    return {"model": os.path.splitext(os.path.basename(name))[0], "input": res or "model's", "tasks": first["tasks"],
            "arms": {arm: {"seconds": [r["seconds"] for r in rs], "decoded": rs[0]["decoded"],
                           "same_donors": all(r["donors"] == first["donors"] for r in rs)} for arm, rs in runs.items()}}


def rows(r: dict) -> list[list[str]]:
    arms = list(r["arms"])
    base = statistics.median(r["arms"][arms[0]]["seconds"])
    out = []
    for arm in arms:
        a = r["arms"][arm]
        s = statistics.median(a["seconds"])
        out.append([r["model"], r["input"], str(r["tasks"]), str(a["decoded"]), arm, f"{s:.2f}",
                    f"{s / base:.2f}", "yes" if a["same_donors"] else "no"])
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print(json.dumps(lookup(args.one)))
        return 0
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import emit, machine, table

    from stormdrop.target import canonical, host_target

    trees = [tuple(t.split("=", 1)) for t in args.trees.split(",")]
    if any(len(t) != 2 or not os.path.isdir(t[1]) for t in trees):
        print(f"bench_hub_lookup: --trees wants NAME=DIRECTORY,...: {args.trees}", file=sys.stderr)
        return 2
    key = canonical(host_target())
    results = [bench_one(spec, trees, args.rounds) for spec in filter(None, args.models.split(","))]
    lines = ["", f"### Hub lookup, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- wall seconds from opening the shipped hub to every task's donors (at most {DONORS_A_TASK} a task, "
             f"StormConfig's defaults), median of {args.rounds} turns; each arm a source tree in its own process", "",
             *table(HEADER, [row for r in results for row in rows(r)])]
    emit(lines, args.out, args.json, {"target": key, "trees": dict(trees), "models": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
