"""The averages over bench_reuse runs: each pair's fractions of (d)'s speedup and shares of (d)'s time,
as the runs' JSONs hold them (ratios within each run), and their means.

Usage: ``python benchmarks/reuse_summary.py JSON[:TARGET,...] ...`` (a JSON alone: all its pairs).
"""

from __future__ import annotations

import json
import statistics
import sys


def main(argv: list[str]) -> int:
    rows = []
    for arg in argv:
        path, _, names = arg.partition(":")
        with open(path) as f:
            pairs = json.load(f)["pairs"]
        rows += [p for p in pairs if not names or p["target"] in names.split(",")]
    if not rows:
        raise SystemExit("usage: reuse_summary.py JSON[:TARGET,...] ...")
    arms = [("reuse", "(b) reuse"), ("reuse_raindrop", "(c) reuse+raindrop")]
    print("| donor -> target | " + " | ".join(f"{label} of (d)'s speedup | time / (d)" for _, label in arms) + " |")
    print("|" + " --- |" * (1 + 2 * len(arms)))
    for p in rows:
        cells = [f"{100 * p[f'{k}_fraction']:.1f}% | {100 * p[f'{k}_time_share']:.1f}%" for k, _ in arms]
        print(f"| {p['donor']} -> {p['target']} | " + " | ".join(cells) + " |")
    means = [f"{100 * statistics.mean(p[f'{k}_fraction'] for p in rows):.1f}% | "
             f"{100 * statistics.mean(p[f'{k}_time_share'] for p in rows):.1f}%" for k, _ in arms]
    print(f"| mean of {len(rows)} | " + " | ".join(means) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
