"""Where reuse loses: per task, the best kernel latency of each bench_reuse arm against scratch's.

Reads the databases a ``bench_reuse.py --db-dir DIR`` run left (nothing is built or timed): for each
task of the target model, its weight (calls per model run), scratch's best and each arm's best
(as tuned: the best stored time, not the deployed model's), and the weighted loss ``weight x (arm -
scratch)`` in ms; tasks sorted by the loss of the last arm, the worst first. Useful to see which
kernels a transfer or a raindrop left behind.

Usage: ``python benchmarks/reuse_tasks.py DIR TARGET [--arms reuse,reuse_raindrop] [--top 10]``
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys


def bests(path: str, model: str) -> dict[str, tuple[int, float | None]]:
    """Task name -> (weight, best valid mean seconds or None) in the database ``path``."""
    from stormdrop import open_database

    with open_database(path) as d:
        tasks = d.model_notes()[model]["tasks"]
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t["name"]: (t["weight"], con.execute("SELECT MIN(mean_secs) FROM records WHERE workload_id=? AND "
                                                      "error IS NULL", (t["workload_id"],)).fetchone()[0])
                for t in tasks}
    finally:
        con.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("db_dir")
    p.add_argument("target", help="the target model's zoo name")
    p.add_argument("--arms", default="reuse,reuse_raindrop", help="bench_reuse arms (database suffixes)")
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    paths = {a: os.path.join(args.db_dir, f"{args.target}_{a}.db") for a in ["scratch", *arms]}
    missing = [p for p in paths.values() if not os.path.exists(p)]
    if missing:
        print(f"error: no database {missing[0]}", file=sys.stderr)
        return 2
    got = {a: bests(path, args.target) for a, path in paths.items()}

    def ms(x: float | None) -> str:
        return f"{x * 1e3:.3f}" if x is not None else "-"

    def loss(arm: str, name: str) -> float:
        w, s = got["scratch"][name]
        a = got[arm].get(name, (w, None))[1]
        return w * (a - s) if a is not None and s is not None else float("inf")

    names = sorted(got["scratch"], key=lambda n: loss(arms[-1], n), reverse=True)
    print(f"| task | weight | scratch ms | {' | '.join(f'{a} ms' for a in arms)} | "
          f"{' | '.join(f'{a} loss ms' for a in arms)} |")
    print("|" + " --- |" * (3 + 2 * len(arms)))
    for n in names[:args.top]:
        w, s = got["scratch"][n]
        print(f"| {n} | {w} | {ms(s)} | {' | '.join(ms(got[a].get(n, (w, None))[1]) for a in arms)} | "
              f"{' | '.join(f'{loss(a, n) * 1e3:+.3f}' for a in arms)} |")
    for a in ["scratch", *arms]:
        known = [w * b for w, b in got[a].values() if b is not None]
        print(f"{a}: sum of weight x best {sum(known) * 1e3:.2f} ms over {len(known)} of {len(got[a])} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
