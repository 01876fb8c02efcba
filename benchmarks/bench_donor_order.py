"""Which donor's transfer reuse should measure first: every task of a network gets its first transfer
from each of its nearest K donors (the schedule hub's; the class-then-shape order of
``search.donors``) measured cold, one a donor, and the rules of which one to take are scored on the
same measurements: the nearest (the default before), the fastest of the K whatever its size, the
fastest of those within ``FASTEST_WITHIN`` of the nearest's shapes (``StormConfig.fastest_donors``),
and the best measured (an oracle). Printed per network: the tasks' summed weight x latency of each
rule's pick, which is what a model's first round under a trial cap of one candidate a task buys.

    python benchmarks/bench_donor_order.py --cases mnasnet1_0@88,mobilenet_v2@64 --donors 4 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import tvm  # noqa: E402

from stormdrop import (  # noqa: E402
    KernelOptions,
    MeasureConfig,
    Phase,
    SearchOptions,
    StormConfig,
    extract_tasks,
    load_model,
    open_database,
    tune_kernel,
)
from stormdrop.search.donors import donors, fastest_near, shape_distance  # noqa: E402
from stormdrop.search.reuse import transfer  # noqa: E402
from stormdrop.search.sketches import Sketches  # noqa: E402
from stormdrop.storage.hub import open_hub  # noqa: E402
from stormdrop.target import canonical, host_target  # noqa: E402


def first_transfers(kernel, target, k: int, tmp: str) -> tuple[list[float | None], list[dict]]:
    """The first transfer of each of the kernel's nearest ``k`` hub donors, measured cold (seconds,
    None: failed), and each donor's FLOPs, FLOPs a second and shape distance."""
    path = os.path.join(tmp, f"{kernel.name}.db")
    search = SearchOptions(phases=(Phase.REUSE,), reuse=k, storm=StormConfig(transfer_sketches=False))
    tune_kernel(kernel, KernelOptions(trials=k, exploit_trials=0, search=search,
                                      measure=MeasureConfig(cache_flush=True)), target=target, db=path)
    key, hub = canonical(target), open_hub(target)
    postprocs = Sketches(kernel.mod, target, seed=0).postprocs
    with open_database(path) as db:
        entry = db.find_workload(kernel.mod)
        secs = [r.mean if r.ok else None for r in db.records(entry.workload_id, key)]
        info = []
        for other, traces in donors(db, entry, key, [hub], 1, "class", exact_sources=False):
            if transfer(other.mod, traces[0], kernel.mod, postprocs) is None:
                continue  # reuse passes over a donor whose schedule does not transfer: so does the pairing
            best = hub.best(other.workload_id, key, k=1)
            info.append({"exact": other.shash == entry.shash, "flops": other.flops,
                         "flops_per_s": other.flops / best[0].mean,
                         "distance": shape_distance(other.mod, kernel.mod)})
            if len(info) == k:
                break
    return secs, info


def pick(rule: str, secs: list[float], info: list[dict]) -> int:
    """The index of the donor a rule takes (the measured ``secs`` only for the oracle)."""
    if rule == "nearest" or len(info) != len(secs) or info[0]["exact"]:
        return 0  # (this very workload, the hub's, comes first whatever the rule)
    if rule == "fastest":  # the fastest of the k whatever its size (StormConfig.fastest_donors' first rule)
        return max(range(len(info)), key=lambda i: info[i]["flops_per_s"])
    if rule == "fastest near":  # search.donors' own pick
        return fastest_near([d["distance"] for d in info], [d["flops_per_s"] for d in info])
    return min(range(len(secs)), key=lambda i: secs[i])


RULES = ("nearest", "fastest", "fastest near", "best measured")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", required=True, help="NAME@RES,... (zoo networks)")
    p.add_argument("--donors", type=int, default=4)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    target = tvm.target.Target(host_target())
    result = {"command": "benchmarks/bench_donor_order.py " + " ".join(sys.argv[1:]),
              "target": canonical(target), "cases": []}
    print(f"## Donor order, {time.strftime('%Y-%m-%d %H:%M')}\n\n- target: `{result['target']}`\n"
          f"- command: `{result['command']}`\n")
    print(f"| network | tasks | {' | '.join(RULES)} (weight x latency of each rule's first transfer, us) |")
    print("| --- | --- |" + " --- |" * len(RULES))
    with tempfile.TemporaryDirectory(prefix="bench-donor-order-") as tmp:
        for case in args.cases.split(","):
            name, res = case.split("@")
            _, tasks = extract_tasks(load_model(name, resolution=int(res)), target)
            rows = []
            for kernel, weight in tasks:
                secs, info = first_transfers(kernel, target, args.donors, tmp)
                rows.append({"task": kernel.name, "weight": weight, "flops": kernel.flops, "secs": secs, "donors": info})
            sums = {}
            for rule in RULES:
                total = 0.0
                for r in rows:
                    secs = [s if s is not None else float("inf") for s in r["secs"]]
                    total += r["weight"] * secs[pick(rule, secs, r["donors"])] if secs else 0.0
                sums[rule] = total
            result["cases"].append({"network": name, "resolution": int(res), "sums_s": sums, "tasks": rows})
            print(f"| {name} at {res} | {len(rows)} | " + " | ".join(f"{sums[r] * 1e6:.0f}" for r in RULES) + " |",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
