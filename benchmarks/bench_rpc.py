"""RPC dispatch: candidates timed per minute with 1, 2 and 4 loopback servers under one key.

A tracker and N servers are started on this machine; one gateway times the same candidates
(a small matmul's storm batch) on every free device at once. Each timing is wall-time bound
(``--repeat`` samples of at least ``--min-repeat-ms`` each), like a remote device's, so the
rate shows whether dispatch scales with devices even where the servers share this machine's
cores (their kernels then run slower, which the rate does not see).

Usage: ``python benchmarks/bench_rpc.py [--servers 1,2,4] [--candidates 16] [--json PATH] [--out RESULTS.md]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

from _loopback import Loopback
from _peers import emit

KEY = "bench-rpc"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", default="1,2,4")
    p.add_argument("--candidates", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--min-repeat-ms", type=float, default=300)
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="append the table to this Markdown file")
    args = p.parse_args(argv)

    from stormdrop import MeasureConfig, StormConfig, parse_kernel
    from stormdrop.measure.gateway import Gateway
    from stormdrop.search.storm import Storm
    from stormdrop.target import canonical, host_target

    target = host_target()
    kernel = parse_kernel("matmul:M=64,N=64,K=64")
    storm = Storm(kernel.mod, target, trials=args.candidates, seed=0,
                  config=StormConfig(batch_size=args.candidates, prior=False))
    mods = [c.mod for c in storm.propose()]
    storm.close()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-rpc-") as logs:
        for n in [int(x) for x in args.servers.split(",")]:
            os.makedirs(os.path.join(logs, str(n)))
            with Loopback(os.path.join(logs, str(n)), KEY, n) as cluster:
                config = MeasureConfig(rpc=cluster.rpc, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms)
                with Gateway(target, config) as g:
                    g.prepare("mm", kernel.mod)
                    g.measure("mm", mods[:2])  # references and sessions warm on every device
                    run0 = g.costs.runs.seconds
                    t0 = time.monotonic()
                    results = g.measure("mm", mods)
                    secs, run_s = time.monotonic() - t0, g.costs.runs.seconds - run0
                    rows.append({"servers": n, "runners": len(g._runners), "candidates": len(mods),
                                 "ok": sum(r.ok for r in results), "seconds": secs, "run_seconds": run_s,
                                 "per_minute": 60 * len(mods) / secs, "timed_per_minute": 60 * len(mods) / run_s})
            print(json.dumps(rows[-1]), flush=True)
    base, run_base = rows[0]["per_minute"], rows[0]["timed_per_minute"]
    lines = [f"## RPC dispatch, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- command: `benchmarks/bench_rpc.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
             f"- target `{canonical(target)}`; loopback servers on this machine; each timing {args.repeat} samples "
             f"of >= {args.min_repeat_ms:.0f} ms (wall-time bound); seconds: the batch, builds included; "
             "timing: its timing phase alone (the devices' share)", "",
             "| servers | runners | candidates | ok | seconds | candidates / min | vs 1 server | timing s | "
             "timed / min | vs 1 server |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['servers']} | {r['runners']} | {r['candidates']} | {r['ok']} | {r['seconds']:.1f} | "
              f"{r['per_minute']:.1f} | {r['per_minute'] / base:.2f} | {r['run_seconds']:.1f} | "
              f"{r['timed_per_minute']:.1f} | {r['timed_per_minute'] / run_base:.2f} |" for r in rows]
    emit(lines, args.out, args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
