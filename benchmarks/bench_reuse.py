"""Reuse across models against the transfer-tuning paper (Gibson & Cano, arXiv 2201.05587).

For each donor -> target pair: the donor is tuned from scratch into its own database, then
the target is compiled five ways (six with ``--ms``), all timed in the same process, taking turns:

- (a) untuned (TVM's default schedules);
- (b) reuse only: ``--phases reuse`` with ``--reuse-from donor.db`` (transfer-tuning);
- (c) reuse + raindrop: ``--phases reuse,raindrop`` (Droplet Search from the best transfer);
- (d) storm + raindrop from scratch, ``--time-budget`` seconds;
- (e) with ``--ms``: MetaSchedule's ``tune_relax`` on the same fused module for (d)'s tuning
  seconds (``--ms-seconds``; MetaSchedule has no time budget: it runs in a process of its own,
  stopped then, its JSON database kept as far as it got), compiled and timed as the others;
- ONNX Runtime (default graph optimizations, same threads) beside them.

Printed: latencies, tuning seconds, and the fraction of (d)'s speedup over untuned that (b)
and (c) reach, ``(untuned / x) / (untuned / d) = d / x`` (the paper: 49% for reuse alone on
average, and Ansor needed 6.5x its search time to match it), with their share of (d)'s tuning
time. (Untuned TVM on a CPU runs naive loops, far slower than the paper's default TOPI
schedules, so the fraction of the latency *gain*, ``(untuned - x) / (untuned - d)``, would be
near 100% for anything tuned; it is in the JSON as ``*_gain_fraction``.)

``--b0 FIELD=VALUE,...`` adds (b0), reuse only with other StormConfig fields (an A/B of the
reuse choice: ``--b0 transfer_pool=1`` is reuse without the prior's ranking); ``--config`` sets
them for (b) and (c). ``--c-share F`` gives (c) a time budget of F x (d)'s tuning time (the
gradient scheduler then gives the costliest tasks more raindrop trials while time is left);
``--c0 FIELD=VALUE,...`` adds (c0), (c) with other StormConfig fields (and ``reuse=N``,
``share=F``). Tuning seconds are tune_model's: extraction, search, verification and the tuned
model's compile (what ``--time-budget`` bounds), not the final timing beside ONNX Runtime. ``--keep-tuned`` with the ``--db-dir`` of an earlier run keeps its donors
and (d) and tunes the reuse arms again (A/Bs of reuse at the cost of its arms alone).

All tuning runs in this process; the timing then in a fresh one (the script re-executes itself
with ``--retime``): tunes run in-process left the TVM runtime slower for the builds timed after
them (a mobilenet_v2 build 4.6 ms timed alone, 7.7 ms after three tunes), ONNX Runtime not.

Usage: ``python benchmarks/bench_reuse.py --pairs resnet50:resnet18 --resolution 56 --time-budget 600``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

PAIRS = ["resnet50:resnet18", "efficientnet_b4:mobilenet_v2", "googlenet:resnet50", "vgg16:alexnet",
         "bert_base:mobilebert"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", default=",".join(PAIRS), help="donor:target,... (zoo names)")
    p.add_argument("--resolution", type=int, default=None, help="image models' input size (default: the paper's)")
    p.add_argument("--seq-len", type=int, default=None, help="sequence models' length (default: the paper's)")
    p.add_argument("--time-budget", type=float, default=600, help="seconds for (d)")
    p.add_argument("--donor-budget", type=float, default=None, help="seconds for each donor (default: --time-budget)")
    p.add_argument("--trials-per-task", type=int, default=64, help="per-task cap of the donor and (d)")
    p.add_argument("--raindrop-trials", type=int, default=16, help="(c): raindrop trials per task")
    p.add_argument("--reuse", type=int, default=8, help="(b), (c): transfers measured per task at most")
    p.add_argument("--config", default="", metavar="FIELD=VALUE,...",
                   help="StormConfig fields for (b) and (c), e.g. donor_order=shape,transfer_pool=1")
    p.add_argument("--b0", default=None, metavar="FIELD=VALUE,...",
                   help="also (b0): reuse only with these StormConfig fields instead (an A/B of (b))")
    p.add_argument("--unranked", action="store_const", const="transfer_pool=1", dest="b0",
                   help="same as --b0 transfer_pool=1")
    p.add_argument("--c-share", type=float, default=None, metavar="F",
                   help="(c) under a time budget of F x (d)'s tuning time (the per-task cap then grows for the "
                        "costliest tasks while time is left) instead of --raindrop-trials a task alone")
    p.add_argument("--c0", default=None, metavar="FIELD=VALUE,...",
                   help="also (c0): reuse + raindrop with these StormConfig fields, and reuse=N, share=F for its "
                        "--reuse and --c-share (an A/B of (c))")
    p.add_argument("--keep-tuned", action="store_true",
                   help="with the --db-dir of an earlier run: keep its donor and (d) tunings (and their times, "
                        "from its tuning.json) and tune the reuse arms again")
    p.add_argument("--ms", action="store_true",
                   help="also (e): MetaSchedule tune_relax on the same fused module for (d)'s tuning seconds")
    p.add_argument("--ms-seconds", type=float, default=None, help="(e)'s wall time (default: (d)'s tuning seconds)")
    p.add_argument("--ms-trials", type=int, default=None,
                   help="(e)'s trial cap (default: 10x what (d) measured: the time stops it first)")
    p.add_argument("--ms-only", default=None, help=argparse.SUPPRESS)  # (e)'s tuning process: this model into --db-dir
    p.add_argument("--ms-batch", type=int, default=16, help="(e)'s num_trials_per_iter (16: the storm's batch)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--db-dir", default=None, help="keep the databases here (default: a new temporary directory, left in place: the "
                   "timing process reads it, and its path is in the printed command)")
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    p.add_argument("--retime", default=None, metavar="JSON",
                   help="no tuning: time the builds of the run whose tuning JSON (tuning.json in its --db-dir) "
                        "this is, in this fresh process; a run re-executes itself with it once tuned")
    return p.parse_args(argv)


def load(name: str, args: argparse.Namespace):
    from stormdrop import load_model
    from stormdrop.workloads.zoo import SEQUENCE_MODELS

    kw = ({"seq_len": args.seq_len} if args.seq_len else {}) if name in SEQUENCE_MODELS else (
        {"resolution": args.resolution} if args.resolution else {})
    return load_model(name, seed=args.seed, **kw)


def one_pair(donor: str, target_name: str, args: argparse.Namespace, target, db_dir: str) -> dict:
    from stormdrop import ModelOptions, Phase, SearchOptions, StormConfig, tune_model

    def tuned(model, db: str, phases=None, reuse: int = 8, reuse_from=(), storm=None, **kw) -> tuple[float, float]:
        """(tuning seconds as tune_model reports them: extraction, search, verification and the tuned
        model's compile, what --time-budget bounds; wall seconds of the call, its final timing beside
        ONNX Runtime included)."""
        t0 = time.monotonic()
        search = SearchOptions(phases=phases or SearchOptions().phases, storm=storm or StormConfig(), reuse=reuse,
                               reuse_from=tuple(reuse_from))
        result = tune_model(model, ModelOptions(seed=args.seed, search=search, **kw), target=target, db=db)
        return result.tuning_s, time.monotonic() - t0

    out = {"donor": donor, "target": target_name}
    kept = earlier(args, db_dir, donor, target_name)
    donor_db = os.path.join(db_dir, f"{donor}.db")
    if kept:
        out["donor_tuning_s"] = kept["donor_tuning_s"]
    else:
        out["donor_tuning_s"], _ = tuned(load(donor, args), donor_db, trials=None,
                                         trials_per_task=args.trials_per_task,
                                         time_budget=args.donor_budget or args.time_budget)
    model = load(target_name, args)
    config = storm_config(args.config)

    def with_reuse(phases, reuse: int, per_task: int, storm, share: float | None) -> dict:
        # (share: a time budget, set once (d)'s tuning time is known)
        return dict(phases=phases, reuse=reuse, reuse_from=[donor_db], trials=None, trials_per_task=per_task,
                    storm=storm, share=share)

    both = (Phase.REUSE, Phase.RAINDROP)
    runs = {
        "scratch": dict(trials=None, trials_per_task=args.trials_per_task, time_budget=args.time_budget, reuse=0),
        "reuse": with_reuse((Phase.REUSE,), args.reuse, 2 * args.reuse, config, None),
        "reuse_raindrop": with_reuse(both, args.reuse, 2 * args.raindrop_trials, config, args.c_share),
    }
    if args.b0 is not None:
        runs["reuse_unranked"] = {**runs["reuse"], "storm": storm_config(args.b0)}
    if args.c0 is not None:
        fields = dict(x.split("=", 1) for x in args.c0.split(",") if x.strip())
        reuse, share = int(fields.pop("reuse", args.reuse)), fields.pop("share", args.c_share)
        runs["reuse_raindrop0"] = with_reuse(both, reuse, 2 * args.raindrop_trials,
                                             storm_config(",".join(f"{k}={v}" for k, v in fields.items())),
                                             None if share is None else float(share))
    for key, kw in runs.items():
        path = os.path.join(db_dir, f"{target_name}_{key}.db")
        if kept and key == "scratch":
            out["scratch_tuning_s"] = kept.get("scratch_tuning_s")
            continue
        for suffix in ("", "-wal", "-shm"):  # a reuse arm of an earlier run is tuned again, from nothing
            if kept and os.path.exists(path + suffix):
                os.remove(path + suffix)
        share = kw.pop("share", None)
        if share:
            kw["time_budget"] = share * out["scratch_tuning_s"]
        out[f"{key}_tuning_s"], out[f"{key}_wall_s"] = tuned(model, path, **kw)
    if args.ms:
        from _peers import meta_schedule_for

        from stormdrop import open_database

        with open_database(os.path.join(db_dir, f"{target_name}_scratch.db")) as d:
            measured = sum(len(d.records(w.workload_id)) for w in d.workloads())
        work_dir = os.path.join(db_dir, f"{target_name}_ms")
        shutil.rmtree(work_dir, ignore_errors=True)
        seconds = args.ms_seconds or out["scratch_tuning_s"]
        trials = args.ms_trials or 10 * measured  # a cap the time stops it before
        size = ["--seq-len", str(args.seq_len)] if args.seq_len else (
            ["--resolution", str(args.resolution)] if args.resolution else [])
        argv = [sys.executable, os.path.abspath(__file__), "--ms-only", target_name, "--db-dir", work_dir,
                "--ms-trials", str(trials), "--ms-batch", str(args.ms_batch), "--seed", str(args.seed), *size]
        wall, out["ms_trials"], out["ms_finished"] = meta_schedule_for(seconds, argv, work_dir)
        out["ms_tuning_s"] = out["ms_wall_s"] = wall
    return out


def storm_config(text: str):
    """A StormConfig with the ``FIELD=VALUE,...`` of ``text`` (ints where the default is one)."""
    import dataclasses

    from stormdrop import StormConfig

    base, fields = StormConfig(), {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        kind = type(getattr(base, name))
        fields[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return dataclasses.replace(base, **fields)


def earlier(args: argparse.Namespace, db_dir: str, donor: str, target_name: str) -> dict | None:
    """With ``--keep-tuned``: the earlier run's tuning of this pair (its tuning.json), if its donor and
    (d) databases are in ``db_dir``."""
    path = os.path.join(db_dir, "tuning.json")
    if not args.keep_tuned or not os.path.exists(path):
        return None
    with open(path) as f:
        pairs = [p for p in json.load(f)["pairs"] if p["donor"] == donor and p["target"] == target_name]
    found = all(os.path.exists(os.path.join(db_dir, f)) for f in (f"{donor}.db", f"{target_name}_scratch.db"))
    if not (pairs and found):
        return None
    from stormdrop import open_database

    with open_database(os.path.join(db_dir, f"{target_name}_scratch.db")) as d:  # tune_model's own figure
        note = d.model_notes().get(target_name, {})
    return {**pairs[0], "scratch_tuning_s": note.get("tuning_s", pairs[0]["scratch_tuning_s"])}


def timed(out: dict, args: argparse.Namespace, target, db_dir: str) -> dict:
    """``out`` (one pair's tuning) with every peer's latency, timed in turns, and the fractions."""
    import tvm

    from stormdrop import extract_tasks, open_database
    from stormdrop.target import num_cores
    from stormdrop.timing import (
        compile_model,
        in_turns,
        max_abs_diff,
        onnxruntime_timer,
        random_inputs,
        run_tvm,
        tuned_build,
        tvm_timer,
    )

    model = load(out["target"], args)
    inputs = random_inputs(model, args.seed)
    ref, ort = onnxruntime_timer(model.onnx_model, inputs, num_cores(target))
    timers = {"untuned": tvm_timer(tvm.compile(model.mod, target=target), inputs, target), "onnxruntime": ort}
    arms = [k for k in ("reuse_unranked", "reuse", "reuse_raindrop", "reuse_raindrop0", "ms", "scratch")
            if f"{k}_tuning_s" in out]
    for key in arms:
        if key == "ms":  # (e): MetaSchedule's JSON database, compiled as stormdrop compiles its own
            import tvm.s_tir.meta_schedule as ms

            fused, _ = extract_tasks(model, target)
            mdb = ms.database.JSONDatabase(work_dir=os.path.join(db_dir, f"{out['target']}_ms"))
            ex = compile_model(fused, mdb, target)
            err, scale = max_abs_diff(run_tvm(ex, inputs, target, time_it=False)[0], ref)
            out["ms_max_abs_diff"] = err
            if err <= 1e-3 * scale:  # (stormdrop's arms are checked when tuned: side_by_side)
                timers[key] = tvm_timer(ex, inputs, target)
            else:
                print(f"(e) MetaSchedule's build is wrong (max |diff| {err:.3g}): not timed", flush=True)
            continue
        with open_database(os.path.join(db_dir, f"{out['target']}_{key}.db")) as d:
            ex, rows = tuned_build(model, d, target)
        out[f"{key}_tasks_tuned"] = f"{sum(r.latency_s is not None for r in rows)}/{len(rows)}"
        timers[key] = tvm_timer(ex, inputs, target)
    out.update({f"{k}_s": v for k, v in in_turns(timers, rounds=args.rounds).items()})
    gain = out["untuned_s"] - out["scratch_s"]
    for key in (k for k in arms[:-1] if f"{k}_s" in out):
        out[f"{key}_fraction"] = out["scratch_s"] / out[f"{key}_s"]
        out[f"{key}_gain_fraction"] = (out["untuned_s"] - out[f"{key}_s"]) / gain if gain > 0 else None
        out[f"{key}_time_share"] = out[f"{key}_tuning_s"] / out["scratch_tuning_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, publish, table
    from bench_kernels import pin_threads

    from stormdrop.target import canonical, host_target, physical_cores

    pin_threads(physical_cores())
    target = host_target()
    if args.ms_only:  # (e)'s tuning, in a process of its own that meta_schedule_for stops at (e)'s time
        from _peers import meta_schedule_model

        meta_schedule_model(load(args.ms_only, args), target, args.ms_trials, args.seed, args.ms_batch, None,
                            args.db_dir)
        return 0
    pairs = [p.strip().split(":") for p in args.pairs.split(",") if p.strip()]
    if not args.retime:
        db_dir = args.db_dir or tempfile.mkdtemp(prefix="bench-reuse-")
        os.makedirs(db_dir, exist_ok=True)
        tunings = []
        for donor, target_name in pairs:
            print(f"[{donor} -> {target_name}] tuning", flush=True)
            tunings.append(one_pair(donor, target_name, args, target, db_dir))
            print(json.dumps(tunings[-1]), flush=True)
        path = os.path.join(db_dir, "tuning.json")
        with open(path, "w") as f:
            json.dump({"pairs": tunings}, f, indent=1)
        # every peer is timed in a fresh process: tune_model run in this one leaves its TVM runtime
        # slower (mobilenet_v2: 4.25 -> 5.35 ms after one reuse-only tune; after three tunes a
        # 4.6-ms build timed 7.7 ms here), while ONNX Runtime is not
        argv = [*sys.argv[1:], "--retime", path, *([] if args.db_dir else ["--db-dir", db_dir])]
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), *argv])
    if not args.db_dir:
        raise SystemExit("--retime needs the --db-dir of the run it times again")
    with open(args.retime) as f:
        tuned_pairs = [{k: v for k, v in r.items() if k in ("donor", "target", "ms_trials", "ms_finished") or k.endswith(("tuning_s", "wall_s"))}
                       for r in json.load(f)["pairs"]]
    command = " ".join(["benchmarks/bench_reuse.py", *sys.argv[1:]])
    results = []
    for tuning in tuned_pairs:
        print(f"[{tuning['donor']} -> {tuning['target']}] timing", flush=True)
        results.append(timed(tuning, args, target, args.db_dir))
        print(json.dumps(results[-1]), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"command": command, "target": canonical(target), "pairs": results}, f, indent=1)

    def ms(v):
        return f"{v * 1e3:.2f}" if v else "-"

    def pct(v):
        return f"{100 * v:.0f}%" if v is not None else "-"

    arms = [(k, label) for k, label in (("reuse_unranked", f"(b0) reuse, {args.b0}"), ("reuse", "(b) reuse"),
                                        ("reuse_raindrop", "(c) reuse+raindrop"),
                                        ("reuse_raindrop0", f"(c0) reuse+raindrop, {args.c0}"),
                                        ("ms", "(e) MetaSchedule"))
            if any(f"{k}_s" in r for r in results)]
    header = ["donor -> target", "untuned", *(x for _, label in arms for x in (label, "s")), "(d) scratch", "s",
              "ONNX Runtime", *(f"{label.split()[0]} of (d)'s speedup" for _, label in arms),
              *(f"{label.split()[0]} time / (d)" for _, label in arms)]
    rows = [[f"{r['donor']} -> {r['target']}", ms(r["untuned_s"]),
             *(x for k, _ in arms for x in (ms(r.get(f"{k}_s")), f"{r.get(f'{k}_tuning_s', 0):.0f}")),
             ms(r["scratch_s"]), f"{r['scratch_tuning_s']:.0f}", ms(r["onnxruntime_s"]),
             *(pct(r.get(f"{k}_fraction")) for k, _ in arms), *(pct(r.get(f"{k}_time_share")) for k, _ in arms)]
            for r in results]
    e_note = "" if not args.ms else (
        f"; (e) MetaSchedule tune_relax (num_trials_per_iter {args.ms_batch}) stopped after "
        f"{f'{args.ms_seconds:.0f} s' if args.ms_seconds else 'the tuning seconds of (d)'}, its records: "
        + ", ".join(f"{r.get('ms_trials')}{' (ended on its own)' if r.get('ms_finished') else ''}"
                    for r in results))
    lines = ["", f"## Reuse, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{canonical(target)}`", f"- command: `{command}`",
             f"- donors tuned with --time-budget {args.donor_budget or args.time_budget:.0f} s, (d) with "
             f"{args.time_budget:.0f} s{' (kept from an earlier run: --keep-tuned)' if args.keep_tuned else ''}; "
             f"(b) up to {args.reuse} transfers{f' ({args.config})' if args.config else ''} "
             f"a task; (c) the same, then up to {args.raindrop_trials} raindrop trials a task"
             f"{f' (the costliest tasks more) under a time budget of {args.c_share:g} x (d)' if args.c_share else ''}"
             f"{f'; (c0) (c) with {args.c0}' if args.c0 else ''}{e_note}; s: tuning seconds as tune_model reports them "
             "(extraction, search, verification, the model's compile; not the final timing); latencies in ms, "
             f"median of {args.rounds} rounds in which all peers take turns, in a fresh process after the tuning "
             "(`--retime`); (x) of (d)'s speedup = (untuned / x) / (untuned / d) = d / x", "",
             *table(header, rows), ""]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
