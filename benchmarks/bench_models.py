"""Model benchmark: stormdrop vs MetaSchedule tune_relax (same and 3x global trials) vs ONNX
Runtime and OpenVINO.

One model at a time, one tuner at a time, on one target string. Every compiled
model runs on the same random inputs in this process (TVM on the target's
cores, ONNX Runtime and OpenVINO with as many threads, OpenVINO at fp32 precision
with the latency hint: ``stormdrop.model.runtimes``); a build whose output differs
from ONNX Runtime's is reported as "wrong", never as a latency. Ratios > 1 mean
stormdrop is faster. ``--models`` takes zoo names and ``.onnx`` paths (e.g. the
networks written by ``benchmarks/export_networks.py``).

    PYTHONPATH=src python benchmarks/bench_models.py --models resnet18,mobilenet_v2 --resolution 112 --trials 200
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time

import _arms  # beside this script: benchmarks/ is on sys.path when it runs

WARM_UP_MS = 40.0  # --warm-up on: each candidate's untimed warm-up runs (MeasureConfig.warmup_ms)
MODELS = ["resnet18", "mobilenet_v2", "bert_base", "squeezenet1_0", "resnet50", "mnasnet1_0"]
HEADER = ["model", "tasks", "untuned ms", "ONNX Runtime ms", "OpenVINO ms", "stormdrop ms", "tuning s", "MS same ms",
          "tuning s", "MS 3x ms", "tuning s", "ratio MS-same/stormdrop", "ratio MS-3x/stormdrop", "ratio ORT/stormdrop",
          "ratio OV/stormdrop"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS[:3]))
    p.add_argument("--resolution", type=int, default=None, help="image models' input size (default: the paper's)")
    p.add_argument("--seq-len", type=int, default=None, help="BERT sequence length (default 128)")
    p.add_argument("--trials", type=int, default=200, help="global trial budget of stormdrop and MS 'same'")
    p.add_argument("--trials-per-task", type=int, default=32, help="stormdrop's per-task cap (half storm, half drop)")
    p.add_argument("--ms-batch", type=int, default=16,
                   help="MetaSchedule's num_trials_per_iter (its default 64 reaches few tasks at small budgets; "
                        "16 = stormdrop's storm batch)")
    p.add_argument("--skip-3x", action="store_true")
    p.add_argument("--skip-ms", action="store_true", help="no MetaSchedule columns (stormdrop vs ONNX Runtime)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stormdrop tunes by time (no global trial cap, the budget is spent); MetaSchedule "
                        "'same' then gets as many trials as stormdrop measured")
    p.add_argument("--layout", default="auto", choices=["auto", "nhwc", "blocked", "nchw"],
                   help="stormdrop's convolution layout (MetaSchedule tunes the same fused module)")
    p.add_argument("--winograd", default="auto", choices=["auto", "off", "2", "4"],
                   help="stormdrop's 3x3 convolutions as Winograd (MetaSchedule tunes the same fused module)")
    p.add_argument("--winograd-ab", action="store_true",
                   help="also tune with every convolution direct (Lowering winograd='off'), timed in turns")
    p.add_argument("--in-model-candidates", type=int, default=1,
                   help="stormdrop's in-model choice among each task's K best records (1: off, the default)")
    _arms.add_lowering_switches(p)
    p.add_argument("--cache-flush", default="auto", choices=["auto", "off", "on", "ab"],
                   help="stormdrop times candidates with the caches flushed (auto: the library's default, on "
                        "for CPUs), or tunes twice, without and with, both timed in turns with the peers (ab)")
    p.add_argument("--warm-up", default="off", choices=["on", "off", "ab"],
                   help=f"stormdrop runs each candidate untimed for {WARM_UP_MS:.0f} ms before its samples (on), "
                        "not (off, the library's default), or tunes both ways, timed in turns with the peers (ab)")
    p.add_argument("--storm-split", default="share", choices=["share", "half"],
                   help="A/B of issue 40: 'half' gives every task's storm half its per-task cap whatever the "
                        "global --trials (the split before: no raindrop under a small cap)")
    p.add_argument("--in-order-ab", action="store_true",
                   help="tunes with the tasks' first rounds heaviest first (ModelOptions.warm_up='heaviest') and "
                        "once more in the model's order ('in order'), timed in turns with the peers")
    p.add_argument("--per-trial-ab", action="store_true",
                   help="also tunes with the task scheduler's diminishing returns counted in trials "
                        "(ModelOptions.gradient_unit='trials'; the default counts rounds, Ansor's unit), timed in "
                        "turns with the peers")
    p.add_argument("--hub", default="on", choices=["on", "off", "ab"],
                   help="stormdrop draws reuse donors from the shipped schedule hub of the target's ISA class (on, "
                        "the library's default), not (off), or tunes both ways, timed in turns with the peers (ab)")
    p.add_argument("--other-hub", default=None, metavar="HUB.jsonl.gz", type=_arms.existing_file,
                   help="also tune with this schedule hub file instead of the shipped one (e.g. the hub before a "
                        "rebuild), timed in turns with the peers")
    p.add_argument("--prior-ab", default=None, metavar="PRIOR.npz",
                   help="also tune with this cost-model prior file instead of the shipped one, timed in turns "
                        "with the peers (tools/train_prior.py writes them)")
    p.add_argument("--prior-ab-alone", type=int, default=None, metavar="N",
                   help="with --prior-ab: that arm's model also ranks with its prior alone until a workload has N "
                        "measurements of its own (StormConfig.prior_alone; default: the library's)")
    _arms.add_config_arm_flags(p)
    p.add_argument("--rounds", type=int, default=5,
                   help="latencies: median over this many rounds in which the peers take turns")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    p.add_argument("--keep-db", default=None, metavar="DIR",
                   help="keep stormdrop's database of each model as DIR/<model>.db (default: a temporary one)")
    p.add_argument("--merge-json", default=None,
                   help="a JSON written by an earlier run of this script (same target): its models are "
                        "not run again, their rows are put first in the table")
    return p.parse_args(argv)


def run_ms(model, target, trials: int, seed: int, batch: int, layout: str, winograd: str) -> dict:
    from _peers import meta_schedule_model

    from stormdrop import Lowering
    from stormdrop.timing import compile_model

    with tempfile.TemporaryDirectory(prefix="bench-ms-") as work_dir:
        fused, db, tuning_s = meta_schedule_model(model, target, trials, seed, batch, Lowering(layout, winograd=winograd),
                                                  work_dir)
        ex = compile_model(fused, db, target)
    return {"ex": ex, "tuning_s": tuning_s}


def bench_one(name: str, args: argparse.Namespace, target) -> dict:
    from _peers import short

    from stormdrop import (
        Lowering,
        MeasureConfig,
        ModelOptions,
        RaindropConfig,
        SearchOptions,
        StormConfig,
        load_model,
        open_database,
        tune_model,
    )
    from stormdrop.target import num_cores
    from stormdrop.timing import (
        in_turns,
        max_abs_diff,
        peers,
        random_inputs,
        run_tvm,
        task_times_in_model,
        tuned_build,
        tvm_timer,
    )
    from stormdrop.workloads.zoo import SEQUENCE_MODELS

    lowering = Lowering(args.layout, winograd=args.winograd, **_arms.lowering_switches(args))

    size = ("seq_len", args.seq_len) if name in SEQUENCE_MODELS else ("resolution", args.resolution)
    kw = {size[0]: size[1]} if size[1] else {}
    model = load_model(name, seed=args.seed, **kw)
    inputs = random_inputs(model, args.seed)
    found = peers(model, inputs, num_cores(target))
    ref = found.reference
    out = {"model": name, "openvino_s": None}
    if "openvino" in found.errors:  # a failure is a cell: its one-line reason
        out["openvino_status"] = f"failed: {short(found.errors['openvino'])}"
    elif "openvino" in found.missing:
        out["openvino_status"] = found.missing["openvino"]
    timers = dict(found.timers)  # every peer's latency is taken at the end, peers taking turns
    with tempfile.TemporaryDirectory(prefix="bench-sd-") as tmp:
        db_path = os.path.join(tmp, "sd.sqlite")
        if args.keep_db:
            os.makedirs(args.keep_db, exist_ok=True)
            db_path = os.path.join(args.keep_db, f"{os.path.basename(name)}.db")  # (a path: its file name)

        warmup_ms = 0.0 if args.warm_up == "off" else WARM_UP_MS

        def tune(db: str, cache_flush: bool | None, untuned: bool = False, lowering: Lowering = lowering,
                 hub: bool | str = args.hub != "off", warmup_ms: float = warmup_ms, prior_file: str | None = None,
                 prior_alone: int | None = None, storm: dict | None = None,
                 warm_up: str = "heaviest" if args.in_order_ab else ModelOptions.warm_up, measure: dict | None = None,
                 raindrop: dict | None = None, gradient_unit: str = ModelOptions.gradient_unit):
            return tune_model(model,
                              ModelOptions(trials=None if args.time_budget else args.trials,
                                           trials_per_task=args.trials_per_task, time_budget=args.time_budget,
                                           seed=args.seed, lowering=lowering, untuned=untuned,
                                           search=SearchOptions(hub=hub, raindrop=RaindropConfig(**(raindrop or {})),
                                                                storm=StormConfig(
                                               prior_file=prior_file,
                                               **({} if prior_alone is None else {"prior_alone": prior_alone}),
                                               **(storm or {}))),
                                           in_model_candidates=args.in_model_candidates, warm_up=warm_up,
                                           gradient_unit=gradient_unit,
                                           measure=MeasureConfig(cache_flush=cache_flush, warmup_ms=warmup_ms,
                                                                 **(measure or {}))),
                              target=target, db=db)

        t0 = time.monotonic()
        try:
            r = tune(db_path, {"auto": None, "on": True}.get(args.cache_flush, False), untuned=True)
            wall_s = time.monotonic() - t0  # with tune --model's own check (untuned build run, peers timed)
            with open_database(db_path) as db:
                ex, rows = tuned_build(model, db, target, lowering)
                if args.in_model_candidates > 1:  # the A/B of the in-model choice: every task's best record
                    ex_best, _ = tuned_build(model, db, target, lowering, deployed=False)
                    timers["best_records"] = tvm_timer(ex_best, inputs, target)
            task_times_in_model(ex, inputs, target, rows)
            in_model = {row.name: row.in_model_s for row in rows}
            timers["stormdrop"] = tvm_timer(ex, inputs, target)
            out["stormdrop"] = {"tuning_s": r.tuning_s, "wall_s": wall_s,  # tuning_s: up to the compiled model
                                "tasks": len(r.tasks), "trials": sum(sum(t.trials.values()) - t.trials["failed"]
                                                                     for t in r.tasks),
                                "stopped_by": r.stopped_by, "flops": sum(t.flops * t.weight for t in r.tasks),
                                "deployed": r.deployed, "best_records": {},
                                "in_model_candidates": args.in_model_candidates,
                                "faster_after_s": r.faster_after_s, "stages_s": r.stages_s,
                                "per_task": [{"name": t.name, "weight": t.weight, "flops": t.flops,
                                              "latency_s": t.latency_s, "in_model_s": in_model.get(t.name),
                                              "trials": t.trials} for t in r.tasks]}
            out["untuned_s"] = r.latency_s["untuned"]
        except Exception as err:  # noqa: BLE001 - a failure is a cell
            out["stormdrop"] = {"status": f"failed: {short(err)}", "tuning_s": time.monotonic() - t0}
        arms = _arms.tuning_arms(args, lowering)  # A/B arms: (key, what its tuning changes)
        for key, changes in arms:
            arm = {"cache_flush": {"auto": None, "on": True}.get(args.cache_flush, False), "lowering": lowering,
                   **changes}
            arm_db = db_path.replace(".db", "") + f".{key}.db" if args.keep_db else os.path.join(tmp, f"{key}.sqlite")
            ra = tune(arm_db, **arm)
            with open_database(arm_db) as db:
                ex_arm, rows_arm = tuned_build(model, db, target, arm["lowering"])
            task_times_in_model(ex_arm, inputs, target, rows_arm)
            timers[key] = tvm_timer(ex_arm, inputs, target)
            out[key] = {"tuning_s": ra.tuning_s, "trials": sum(sum(t.trials.values()) - t.trials["failed"]
                                                               for t in ra.tasks),
                        "faster_after_s": ra.faster_after_s, "stages_s": ra.stages_s,
                        "per_task": [{"name": row.name, "weight": row.weight, "latency_s": row.latency_s,
                                      "in_model_s": row.in_model_s} for row in rows_arm]}
    print(f"  {name} stormdrop: tuned in {out['stormdrop']['tuning_s']:.0f} s", flush=True)
    same = out["stormdrop"].get("trials", args.trials) if args.time_budget else args.trials
    runs = [] if args.skip_ms else [("ms_same", same)] + ([] if args.skip_3x else [("ms_3x", 3 * same)])
    for key, trials in runs:
        t0 = time.monotonic()
        try:
            res = run_ms(model, target, trials, args.seed, args.ms_batch, args.layout, args.winograd)
            outs, _ = run_tvm(res["ex"], inputs, target, time_it=False)
            err, scale = max_abs_diff(outs, ref)
            out[key] = {"tuning_s": res["tuning_s"], "budget": trials}
            if err <= 1e-3 * scale:
                timers[key] = tvm_timer(res["ex"], inputs, target)
            else:
                out[key]["status"] = f"wrong (max diff {err:.2g})"
        except Exception as e:  # noqa: BLE001
            out[key] = {"status": f"failed: {short(e)}", "tuning_s": time.monotonic() - t0}
        print(f"  {name} {key}: {out[key]}", flush=True)
    latency = in_turns(timers, rounds=args.rounds)
    out["onnxruntime_s"] = latency.pop("onnxruntime")
    out["openvino_s"] = latency.pop("openvino", None)
    if "best_records" in latency:
        out["stormdrop"]["best_records"] = {"latency_s": latency.pop("best_records")}
    for key, secs in latency.items():
        out[key]["latency_s"] = secs
    print(f"  {name} latencies (s, median of {args.rounds} interleaved rounds): {latency} "
          f"onnxruntime {out['onnxruntime_s']} openvino {out['openvino_s'] or out.get('openvino_status')}", flush=True)
    return out


def breakdown(raw: list[dict], top: int = 6) -> list[str]:
    """Per network: effective GFLOPS and the tasks with the largest weight x latency share."""
    lines = []
    for r in raw:
        sd = r.get("stormdrop", {})
        tasks = [t for t in sd.get("per_task", []) if t.get("latency_s")]
        if not tasks:
            continue
        total = sum(t["weight"] * t["latency_s"] for t in tasks)
        in_model = sum(t.get("in_model_s") or 0 for t in tasks)
        eff = sd["flops"] / sd["latency_s"] / 1e9 if sd.get("latency_s") else 0
        ort = sd["flops"] / r["onnxruntime_s"] / 1e9
        ov = f", OpenVINO {sd['flops'] / r['openvino_s'] / 1e9:.0f}" if r.get("openvino_s") else ""
        lines.append(f"- {r['model']}: stormdrop {eff:.0f} GFLOPS effective (ONNX Runtime {ort:.0f}{ov}); "
                     f"tasks' weight x stored latency {total * 1e3:.2f} ms, their kernels timed inside the model "
                     f"{in_model * 1e3:.2f} ms, the model {sd['latency_s'] * 1e3:.2f} ms; "
                     f"{sd.get('trials', '?')} trials, stopped by {sd.get('stopped_by', '?')}{_stages(sd)}; largest shares of "
                     "the tasks' weight x latency: " + ", ".join(
                         f"{t['name']} {100 * t['weight'] * t['latency_s'] / total:.0f}% "
                         f"({t['flops'] / t['latency_s'] / 1e9:.0f} GFLOPS"
                         + (f", {t['in_model_s'] / t['weight'] * 1e6:.0f} us a call in the model vs "
                            f"{t['latency_s'] * 1e6:.0f} as tuned" if t.get("in_model_s") else "") + ")"
                         for t in sorted(tasks, key=lambda t: -t["weight"] * t["latency_s"])[:top]))
        if sd.get("best_records", {}).get("latency_s"):
            lines.append(f"  - in-model choice: {len(sd.get('deployed', {}))} task(s) deploy another of their best "
                         f"records; the model {sd['latency_s'] * 1e3:.2f} ms, with every task's best record "
                         f"{sd['best_records']['latency_s'] * 1e3:.2f} ms (timed in turns)")
        for key, (how, main, ratio_name, main_over_arm, arm_name) in _arms.arm_words(r).items():
            arm = r.get(key, {})
            if arm.get("latency_s") and sd.get("latency_s"):
                ratio = sd["latency_s"] / arm["latency_s"] if main_over_arm else arm["latency_s"] / sd["latency_s"]
                lines.append(f"  - {how}, {arm['trials']} trials in {arm['tuning_s']:.0f} s{_stages(arm)}): the model "
                             f"{arm['latency_s'] * 1e3:.2f} ms vs {sd['latency_s'] * 1e3:.2f} ms {main} (timed in "
                             f"turns): {ratio_name} = {ratio:.2f}; ONNX Runtime / {arm_name} = "
                             f"{r['onnxruntime_s'] / arm['latency_s']:.2f}; its kernels timed inside the model "
                             f"{sum(t['in_model_s'] or 0 for t in arm['per_task']) * 1e3:.2f} ms")
    return lines + ([""] if lines else [])


def _stages(run: dict) -> str:
    """Where a tune's time went (``ModelResult.stages_s``), as words in parentheses; "" without it."""
    stages = run.get("stages_s") or {}
    words = {"tasks": "tasks", "set_up": "set-up", "search": "search", "compile": "compile"}
    return f" ({', '.join(f'{words.get(k, k)} {v:.1f} s' for k, v in stages.items())})" if stages else ""


def row(r: dict) -> list[str]:
    def ms_(v):
        return f"{v * 1e3:.2f}" if v else "-"

    def cell(d):
        return [ms_(d.get("latency_s")) if d.get("latency_s") else d.get("status", "-"), f"{d.get('tuning_s', 0):.0f}"]

    sd = r["stormdrop"].get("latency_s")

    def ratio(d):
        v = d.get("latency_s") if isinstance(d, dict) else d
        return f"{v / sd:.2f}" if v and sd else "-"

    return [r["model"], str(r["stormdrop"].get("tasks", "-")), ms_(r.get("untuned_s")), ms_(r["onnxruntime_s"]),
            ms_(r.get("openvino_s")) if r.get("openvino_s") else r.get("openvino_status", "-"),
            *cell(r["stormdrop"]), *cell(r.get("ms_same", {})), *cell(r.get("ms_3x", {})),
            ratio(r.get("ms_same", {})), ratio(r.get("ms_3x", {})), ratio(r["onnxruntime_s"]),
            ratio(r.get("openvino_s"))]


def _hub_name(target) -> str:
    from stormdrop.storage.hub import hub_path

    path = hub_path(target)
    return os.path.basename(path) if path else "none for this target"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import checkpoint, machine, publish, table
    from bench_kernels import pin_threads

    from stormdrop.target import canonical, host_target, physical_cores

    pin_threads(physical_cores())
    if args.storm_split == "half":  # the split before issue 40, for its A/B only
        import stormdrop.model.tune as model_tune

        model_tune.storm_share = lambda trials, num_tasks, trials_per_task, first: max(1, trials_per_task // 2)
        model_tune.first_batch_size = lambda trials, n, batch: (
            None if trials is None or n <= 0 or trials >= n * batch else max(2, trials // n))
    target = host_target()
    rows, raw = [], []
    if args.merge_json:
        with open(args.merge_json) as f:
            earlier = json.load(f)
        if earlier["target"] != canonical(target):
            print(f"error: {args.merge_json} was measured on another target: {earlier['target']}", file=sys.stderr)
            return 2
        raw = list(earlier["models"])
        rows = [row(r) for r in raw]
    done = {r["model"] for r in raw}
    for name in [m.strip() for m in args.models.split(",") if m.strip() and m.strip() not in done]:
        print(f"[{name}]", flush=True)
        r = bench_one(name, args, target)
        raw.append({k: ({kk: vv for kk, vv in v.items() if kk != "ex"} if isinstance(v, dict) else v)
                    for k, v in r.items()})
        rows.append(row(r))
        checkpoint(rows[-1], args.json, canonical(target), "models", raw)
    size = f"resolution {args.resolution or 'paper'}, BERT seq {args.seq_len or 128}"
    lines = ["", f"## Models, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{canonical(target)}`", f"- command: `{' '.join(sys.argv)}`"
             + (f" (rows {', '.join(sorted(done))} from the earlier run that wrote {args.merge_json}: "
                f"`{earlier['command']}`)" if args.merge_json else ""),
             f"- {size}; stormdrop layout {args.layout}, winograd {args.winograd}, cache flush {args.cache_flush}, warm-up {args.warm_up}, "
             f"storm split {args.storm_split}, schedule hub {args.hub} ({_hub_name(target)}); "
             + (f"time budget {args.time_budget:.0f} s (per-task cap {args.trials_per_task} extended while time is "
                "left; MetaSchedule 'same' = the trials stormdrop measured); "
                if args.time_budget else
                f"global budget {args.trials} trials (stormdrop at most {args.trials_per_task} per task); ")
             + f"MetaSchedule num_trials_per_iter={args.ms_batch}; "
             f"latencies in ms: median of {args.rounds} rounds in which the peers take turns (a round: Relax VM median "
             "of 5 x >= 100 ms; ONNX Runtime and OpenVINO (fp32, latency hint), same thread count, median run over "
             "0.5 s); "
             "ratios > 1: stormdrop faster", "",
             *table(HEADER, rows),
             "", *breakdown(raw)]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
