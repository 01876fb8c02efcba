"""Build the schedule hub of this machine's ISA class: tune each network of a set into one build
database (in the order given, so that each reuses the schedules of those before it), then write
the best few records of every workload as the hub file that ships with the package.

    python tools/build_hub.py --db hub-build.db --networks resnet18@56,mobilenet_v2,resnet18 \\
        --time-budget 600
    python tools/build_hub.py --db hub-build.db --write-only   # the hub from what is stored
    python tools/build_hub.py --db hub-build.db --write-only --also keep/convnext_tiny.db  # and another's

A hub grows: the workloads of the hub file already at the output path are kept (``--replace``:
written from the databases alone), so another set of networks can be tuned into a new build
database and added later.

Resumable: the build database is stormdrop's own (a killed build loses nothing; running it again
tunes each network for its time budget once more, from where it stood). The hub is written to
``src/stormdrop/storage/hubs/<isa>.jsonl.gz`` unless ``--out`` says otherwise; check it with
``stormdrop hub info``. Networks are zoo names with an optional ``@RESOLUTION`` (image models) or
ONNX paths, and ``+direct`` for the lowering a small trial cap gives (every convolution direct),
``+winograd`` for the default lowering whatever the time budget (Winograd where it pays: a short
tune keeps Winograd where the hub holds every Winograd kernel of its network). Run nothing else
that measures meanwhile.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stormdrop import Lowering, ModelOptions, SearchOptions, load_model, open_database, tune_model
from stormdrop.storage.hub import SHIPPED_DIR, SUFFIX, isa_class
from stormdrop.storage.hub_writer import write_hub
from stormdrop.target import describe, host_target


def network(spec: str):
    """``NAME[@RESOLUTION][+direct|+winograd]``: a zoo model (or ONNX path) at that input size and
    its lowering; ``+direct``: every convolution direct, as a tune under a small trial cap lowers it
    (``Lowering.for_budget``), so that such a tune finds its own kernels in the hub too;
    ``+winograd``: the default lowering even where the build's time budget would turn Winograd off.
    Returns (model, lowering or None for the default, whether the budget may change the lowering)."""
    base, _, variant = spec.partition("+")
    name, _, res = base.partition("@")
    if variant not in ("", "direct", "winograd"):
        raise SystemExit(f"build_hub: unknown variant {variant!r} in {spec!r} (+direct, +winograd)")
    lowering = Lowering(winograd="off") if variant == "direct" else None
    return load_model(name, resolution=int(res) if res else None), lowering, variant != "winograd"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True, help="the build database (resumable)")
    p.add_argument("--networks", default="resnet18@56,mobilenet_v2,resnet18")
    p.add_argument("--time-budget", type=float, default=600.0, help="seconds of tuning a network")
    p.add_argument("--write-only", action="store_true", help="write the hub from the database, tune nothing")
    p.add_argument("--out", default=None, help="the hub file (default: the shipped one of this ISA class)")
    p.add_argument("--also", action="append", default=[], metavar="DB",
                   help="another stormdrop database whose records of this ISA class go into the hub too (e.g. "
                        "a benchmark's --keep-db databases); repeatable")
    p.add_argument("--models", default=None,
                   help="write only the tasks of these models' last tunes (comma list of the names the "
                        "databases note them by; default: every workload)")
    p.add_argument("--replace", action="store_true",
                   help="write the hub from the databases alone (default: the workloads of the hub file already "
                        "at the output path are kept, those the databases hold too once, where fastest)")
    p.add_argument("--isa", default=None,
                   help="with --write-only: the ISA class to write (e.g. cuda-sm_90 from a database a GPU's tune "
                        "filled; default: this machine's)")
    args = p.parse_args(argv)
    target = host_target()
    isa = args.isa if args.isa and args.write_only else isa_class(target)
    if args.isa and not args.write_only:
        print("build_hub: --isa goes with --write-only (this machine tunes for its own ISA class)", file=sys.stderr)
        return 2
    if isa is None:
        print(f"build_hub: no ISA class for {describe(target)}", file=sys.stderr)
        return 2
    if not args.write_only:
        for spec in filter(None, (s.strip() for s in args.networks.split(","))):
            t0 = time.monotonic()
            # the hub is built from this machine's own measurements: no hub as a donor
            model, lowering, for_budget = network(spec)
            options = ModelOptions(trials=None, time_budget=args.time_budget, search=SearchOptions(hub=False),
                                   lowering=lowering, lowering_for_budget=for_budget)
            result = tune_model(model, options, target=target, db=args.db)
            tuned = result.latency_s.get("tuned")
            shown = f"{tuned * 1e3:.3f} ms" if tuned else "not timed"
            print(f"{spec}: {shown} tuned, {time.monotonic() - t0:.0f} s", flush=True)
    out = args.out or str(SHIPPED_DIR / f"{isa}{SUFFIX}")
    base = None if args.replace or not Path(out).is_file() else Path(out)
    dbs = [open_database(path, read_only=True) for path in [args.db, *args.also]]
    try:
        got = write_hub(dbs, out, isa, base=base, models=None if args.models is None else
                        {m.strip() for m in args.models.split(",") if m.strip()})
    finally:
        for db in dbs:
            db.close()
    print(f"wrote {out}: {got.workloads} workloads, {got.records} records, measured on "
          f"{', '.join(got.machines)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
