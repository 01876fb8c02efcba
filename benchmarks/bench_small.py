"""Small inputs, small budgets: where a newcomer starts. Each case is a network at one input
size tuned under one global trial cap (``stormdrop tune --model M --trials N``, per-task cap
128 as the CLI's), then timed against ONNX Runtime and OpenVINO in turns (``bench_models.bench_one``:
same target string, same threads, outputs checked).

Networks: the small CNNs of ``small_networks.py`` (``smallcnn`` chose the small-budget
defaults; ``smallres`` and ``smallmb`` are held out) and zoo networks at a given resolution
(``resnet18@56`` is the README's quick start: it chose them too). A case is
``NAME[@RESOLUTION]:TRIALS[/TRIALS...]``.

    PYTHONPATH=src python benchmarks/bench_small.py --cases smallres:128/256,mobilenet_v2@96:128 \\
        --json benchmarks/results_small.json
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HEADER = ["network", "input", "trials", "tasks", "ONNX Runtime ms", "OpenVINO ms", "stormdrop ms", "tuning s",
          "ORT / stormdrop", "OV / stormdrop", "held out"]
def parse_cases(text: str) -> list[tuple[str, int | None, int]]:
    out = []
    for case in filter(None, (c.strip() for c in text.split(","))):
        net, _, budgets = case.partition(":")
        name, _, res = net.partition("@")
        for trials in (budgets or "128").split("/"):
            out.append((name, int(res) if res else None, int(trials)))
    return out


def main(argv: list[str] | None = None) -> int:
    import _arms

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="smallcnn:128,smallres:128/256,smallmb:128/256,resnet18@56:200")
    p.add_argument("--held-out", default="smallres,smallmb,mobilenet_v2@96",
                   help="the cases named held out before the run (NAME, NAME@RES, or an .onnx file's stem)")
    p.add_argument("--hub", default="on", choices=["on", "off", "ab"],
                   help="the schedule hub: on (the default), off, or both arms timed in turns (ab)")
    p.add_argument("--other-hub", default=None, metavar="HUB.jsonl.gz", type=_arms.existing_file,
                   help="also tune with this hub file instead of the shipped one (e.g. the hub before a rebuild), "
                        "timed in turns with the peers")
    p.add_argument("--prior-ab", default=None, metavar="PRIOR.npz",
                   help="also tune with this cost-model prior file instead of the shipped one (bench_models.py)")
    p.add_argument("--prior-ab-alone", type=int, default=None, metavar="N",
                   help="with --prior-ab: that arm's StormConfig.prior_alone (bench_models.py)")
    _arms.add_config_arm_flags(p)
    _arms.add_lowering_switches(p)
    p.add_argument("--per-trial-ab", action="store_true",
                   help="also tune with the task scheduler's diminishing returns counted in trials (not rounds)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import bench_models
    from _peers import checkpoint, machine, publish, table
    from bench_kernels import pin_threads
    from small_networks import NETWORKS, write

    from stormdrop.target import canonical, host_target, physical_cores

    pin_threads(physical_cores())
    target = host_target()
    held = {h.strip() for h in args.held_out.split(",") if h.strip()}
    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="bench-small-") as tmp:
        for name, res, trials in parse_cases(args.cases):
            model = write(tmp, [name])[0] if name in NETWORKS else name
            label = name if res is None else f"{name}@{res}"
            print(f"[{label}, {trials} trials]", flush=True)
            margs = bench_models.parse_args(["--models", model, "--trials", str(trials), "--trials-per-task", "128",
                                             "--skip-ms", "--rounds", str(args.rounds), "--seed", str(args.seed),
                                             "--hub", args.hub]
                                            + (["--resolution", str(res)] if res else [])
                                            + (["--other-hub", args.other_hub] if args.other_hub else [])
                                            + (["--per-trial-ab"] if args.per_trial_ab else [])
                                            + (["--prior-ab", args.prior_ab] if args.prior_ab else [])
                                            + (["--prior-ab-alone", str(args.prior_ab_alone)]
                                               if args.prior_ab_alone is not None else [])
                                            + _arms.config_arm_argv(args) + _arms.lowering_switch_argv(args))
            r = bench_models.bench_one(model, margs, target)
            r = {k: ({kk: vv for kk, vv in v.items() if kk != "ex"} if isinstance(v, dict) else v) for k, v in r.items()}
            stem = os.path.splitext(os.path.basename(name))[0]  # an exported file's network
            r.update(network=name, resolution=res, trials_cap=trials, held_out=bool({label, name, stem} & held))
            raw.append(r)
            sd = r["stormdrop"]
            lat = sd.get("latency_s")

            def ms_(v):
                return f"{v * 1e3:.3f}" if v else "-"

            def ratio(v, lat=lat):
                return f"{v / lat:.2f}" if v and lat else "-"

            rows.append([name, str(res or "model's"), str(trials), str(sd.get("tasks", "-")), ms_(r["onnxruntime_s"]),
                         ms_(r.get("openvino_s")), ms_(lat) if lat else sd.get("status", "-"),
                         f"{sd.get('tuning_s', 0):.0f}", ratio(r["onnxruntime_s"]), ratio(r.get("openvino_s")),
                         "yes" if r["held_out"] else "no"]
                        + [cell for key, _ in _arms.columns(raw) if key in r
                           for cell in (ms_(r[key].get("latency_s")), ratio(r["onnxruntime_s"], r[key].get("latency_s")),
                                        ratio(r.get("openvino_s"), r[key].get("latency_s")))])
            checkpoint(rows[-1], args.json, canonical(target), "cases", raw)
    header = HEADER + [h for key, name in _arms.columns(raw)
                       for h in (f"{name} ms", f"ORT / {name}", f"OV / {name}")]
    lines = ["", f"## Small inputs and budgets, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{canonical(target)}`", f"- command: `{' '.join(sys.argv)}`",
             f"- stormdrop as `tune --model M --trials N` (per-task cap 128, defaults otherwise; schedule hub {args.hub}: "
             f"{bench_models._hub_name(target)}"
             + (f"; 'other hub': tuned with the hub file {os.path.basename(args.other_hub)} instead"
                if args.other_hub else "")
             + (f"; 'other prior': tuned with the cost-model prior {args.prior_ab}"
                + (f" ranking alone until {args.prior_ab_alone} own measurements" if args.prior_ab_alone is not None
                   else "") if args.prior_ab else "")
             + "); latencies in ms: "
             f"median of {args.rounds} rounds in which the peers take turns; ratios > 1: stormdrop faster", "",
             *table(header, rows),
             "", *bench_models.breakdown(raw)]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
