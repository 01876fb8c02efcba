"""Final pick: a kernel's reported schedule as the stored best, or as the fastest of its best
records timed side by side in turns (``KernelOptions.final_candidates``).

Each kernel is tuned once per seed into a fresh database with ``final_candidates=1`` (the
search is the same for both arms: only the pick differs). Arm A is the verified best as stored;
arm B is what ``tuning.verify.fastest_in_turns`` picks among the best ``--k`` records. Both picks
are then timed again, independently, in turns (``--rounds`` rounds in alternating order, the
evaluator of ``bench_kernels.py``: repeat 10, 50 ms a sample, outputs checked); where B picks
the stored best the two are the same kernel (ratio 1). Ratios > 1: B faster.

    PYTHONPATH=src python benchmarks/bench_final_pick.py --kernels inc3_3x3,mnas_dw5 --seeds 0,1,2 \\
        --held-out inc3_3x3,mnas_dw5 --json benchmarks/results_final_pick.json
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HEADER = ["kernel", "held out", "seed", "A: stored best (us)", "B: fastest in turns (us)", "B's rank", "A / B"]


def pick_both(kernel, target, args, seed: int, work_dir: str):
    """Tune ``kernel`` (final pick off), then (arm A's module, arm B's module, B's rank among the records)."""
    from stormdrop import KernelOptions, MeasureConfig, tune_kernel
    from stormdrop.measure.gateway import Gateway
    from stormdrop.storage.database import Database, candidate_key
    from stormdrop.tuning.task import TaskSession
    from stormdrop.tuning.verify import fastest_in_turns
    from stormdrop.tvm_compat.trace_json import schedule_from_trace_json

    path = os.path.join(work_dir, f"{kernel.name}-{seed}.db")
    task = tune_kernel(kernel, KernelOptions(trials=args.trials, exploit_trials=args.exploit_trials, seed=seed,
                                             final_candidates=1), target=target, db=path).tasks[0]
    a_trace = task.trace_json
    with Database(path) as db, Gateway(target, MeasureConfig().for_kernels()) as gateway:
        session = TaskSession(db, gateway, kernel, target, seed)
        session.result.trace_json, session.result.fallbacks = a_trace, task.fallbacks
        fastest_in_turns(session, args.k)
        b_trace = session.result.trace_json
        keys = [r.candidate_key for r in db.best(session.entry.workload_id, session.target_key, k=64)]
    rank = keys.index(candidate_key(b_trace)) - keys.index(candidate_key(a_trace))
    return (schedule_from_trace_json(kernel.mod, a_trace).mod, schedule_from_trace_json(kernel.mod, b_trace).mod,
            rank)


def in_turns(gateway, key: str, mods: list, rounds: int) -> list[float]:
    """Each module's median over ``rounds`` rounds of one measurement each, in alternating order."""
    secs: list[list[float]] = [[] for _ in mods]
    for r in range(rounds):
        order = list(range(len(mods)))[:: -1 if r % 2 else 1]
        for i, res in zip(order, gateway.measure(key, [mods[i] for i in order])):
            if not res.ok:
                raise RuntimeError(f"{key}: a pick failed its re-timing: {res.error_msg}")
            secs[i].extend(res.run_secs)
    return [statistics.median(s) for s in secs]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("STORMDROP_HUB", "off")  # searches from nothing, as bench_kernels
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", default="mbv2_dw_s2,r18_c2")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--trials", type=int, default=32, help="storm trials")
    p.add_argument("--exploit-trials", type=int, default=32, help="raindrop trials")
    p.add_argument("--k", type=int, default=4, help="arm B: the fastest of this many best records")
    p.add_argument("--rounds", type=int, default=4, help="the independent re-timing's rounds")
    p.add_argument("--held-out", default="", help="the kernels named held out before the run")
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from _peers import checkpoint, machine, pinned_host, publish, table
    from bench_kernels import KERNELS

    from stormdrop import MeasureConfig, parse_kernel
    from stormdrop.measure.gateway import Gateway

    target, key = pinned_host()
    held = {h.strip() for h in args.held_out.split(",") if h.strip()}
    rows, raw, ratios = [], [], {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-pick-") as work, \
            Gateway(target, MeasureConfig(repeat=10, min_repeat_ms=50)) as evaluator:
        for name in filter(None, (n.strip() for n in args.kernels.split(","))):
            kernel = parse_kernel(KERNELS[name])
            evaluator.prepare(kernel.name, kernel.mod)
            for seed in (int(s) for s in args.seeds.split(",")):
                a_mod, b_mod, rank = pick_both(kernel, target, args, seed, work)
                a_s, b_s = in_turns(evaluator, kernel.name, [a_mod, b_mod], args.rounds) if rank else (None, None)
                ratio = a_s / b_s if rank else 1.0
                ratios[name in held].append(ratio)
                raw.append({"kernel": name, "spec": KERNELS[name], "held_out": name in held, "seed": seed,
                            "a_s": a_s, "b_s": b_s, "b_rank": rank, "a_over_b": ratio})
                rows.append([name, "yes" if name in held else "no", str(seed),
                             f"{a_s * 1e6:.1f}" if a_s else "(same)", f"{b_s * 1e6:.1f}" if b_s else "(same)",
                             str(rank), f"{ratio:.3f}"])
                checkpoint(rows[-1], args.json, key, "picks", raw)

    def geomean(v: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, v)) / len(v)):.3f} over {len(v)}" if v else "-"

    lines = ["", f"## Final pick, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- each row: one tune ({args.trials} storm + {args.exploit_trials} raindrop trials, final pick off); A: "
             f"the verified best as stored, B: the fastest of the {args.k} best records timed side by side in turns; "
             f"both re-timed in {args.rounds} rounds in turns (median, us); B's rank 0: B is A", "",
             *table(HEADER, rows), "",
             f"- geomean A / B: held out {geomean(ratios[True])}; not held out {geomean(ratios[False])}", ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
