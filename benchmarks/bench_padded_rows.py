"""A transformer's linear layer over a row count that tiles badly: the product at its own rows
against ``padded_rows`` (computed over P rows, the extra rows reading the last one again, cropped
in the epilogue), each tuned with the same seeds and trials, then the bests re-timed in turns.

Each kernel is ``x (1, M, K) @ w (K, N) + bias``, as a model's fused task computes it, tuned and
re-timed with the caches flushed of its weights (as inside a model, and as a model's tasks are
tuned). ``--pads`` lists the padded counts to compare (0: ``padded_rows.padded(M)``).

The shapes that chose the rule are timm ViT-S/16's (197 tokens, 384 <-> 1536):

    PYTHONPATH=src python benchmarks/bench_padded_rows.py --pads 0,200,208 --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

SHAPES = ["197x1536x384", "197x384x1536"]  # M x K x N: ViT-S/16's second and first MLP products


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated MxKxN")
    p.add_argument("--pads", default="0", help="comma-separated padded row counts (0: padded_rows.padded(M))")
    p.add_argument("--trials", type=int, default=64, help="storm trials; the raindrop gets as many")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def kernel(m: int, k: int, n: int, rows: int):
    """``x @ w + bias`` over ``rows`` rows (``m``: the product at its own rows)."""
    import tvm
    from tvm import te

    from stormdrop.lowering.padded_rows import crop_rows, matmul_rows
    from stormdrop.workloads import Kernel

    x = te.placeholder((1, m, k), "float32", name="x")
    w = te.placeholder((k, n), "float32", name="w")
    b = te.placeholder((n,), "float32", name="b")
    y = crop_rows(matmul_rows(x, w, 1, rows), 1, m) if rows != m else matmul_rows(x, w, 1, m)
    out = te.compute(y.shape, lambda a, i, j: y[a, i, j] + b[j], name="T_add")
    func = te.create_prim_func([x, w, b, out]).with_attr({"layout_free_buffers": [1, 2]})
    name = f"dense_{m}x{k}x{n}_rows{rows}"
    return Kernel(name, name, "dense", tvm.IRModule({"main": func}), 2 * m * k * n)


def main(argv: list[str] | None = None) -> int:
    # searches measured from nothing, arms alike: no schedule hub (bench_models/bench_small: --hub)
    os.environ.setdefault("STORMDROP_HUB", "off")
    args = parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, pinned_host, publish, save_json, tuned_and_retimed

    from stormdrop import MeasureConfig
    from stormdrop.lowering.padded_rows import padded

    target, key = pinned_host()
    cold = MeasureConfig(cache_flush=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    raw = []
    with tempfile.TemporaryDirectory(prefix="bench-rows-") as tmp:
        for shape in args.shapes.split(","):
            m, k, n = (int(v) for v in shape.lower().split("x"))
            counts = [m, *dict.fromkeys(int(p) or padded(m) for p in args.pads.split(","))]
            for seed in seeds:
                kernels = {str(rows): kernel(m, k, n, rows) for rows in counts}
                entry = {"m": m, "k": k, "n": n, "seed": seed,
                         "variants": tuned_and_retimed(target, kernels, args.trials, args.rounds, seed,
                                                       os.path.join(tmp, f"{shape}_{seed}"), cold)}
                raw.append(entry)
                print(json.dumps(entry), flush=True)
    save_json(args.json, key, "rows", raw)
    lines = ["", f"## Padded rows, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- machine: {machine()}; target: `{key}`", f"- command: `{' '.join(sys.argv)}`",
             f"- `x (1, M, K) @ w (K, N) + bias` at its own M rows and over padded rows (`padded_rows`), each tuned "
             f"{args.trials} storm + {args.trials} raindrop trials per seed, the bests of a seed re-timed in turns "
             f"({args.rounds} rounds, median), caches flushed of the weights; GFLOPS count the M rows' work only", ""]
    header = ["M x K x N", "rows", *(f"seed {s} us" for s in seeds),
              "median us", "GFLOPS", "own rows / this (speed)"]
    lines += ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for shape in dict.fromkeys((e["m"], e["k"], e["n"]) for e in raw):
        runs = [e for e in raw if (e["m"], e["k"], e["n"]) == shape]
        own = statistics.median(e["variants"][str(shape[0])]["retimed_s"] or float("inf") for e in runs)
        for rows in runs[0]["variants"]:
            times = [e["variants"][rows]["retimed_s"] for e in runs]
            med = statistics.median(t or float("inf") for t in times)
            lines.append(f"| {'x'.join(map(str, shape))} | {rows} | "
                         + " | ".join(f"{t * 1e6:.0f}" if t else "-" for t in times)
                         + f" | {med * 1e6:.0f} | {2 * shape[0] * shape[1] * shape[2] / med / 1e9:.0f} | "
                         f"{own / med:.2f} |")
    publish(lines + [""], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
