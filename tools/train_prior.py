"""Turn databases of measured schedules into the shipped cost-model prior.

    python tools/train_prior.py --db prior.db [--db model.db ...] [--per-workload 24] [--base OLD.npz] \
        --out src/stormdrop/search/data/prior_llvm_x86.npz [--validate | --validate-db HELD.db]

Features are MetaSchedule's per-store features of each stored schedule, costs the
median run time (failed candidates get MetaSchedule's 1e10). Sources: the training
kernels of ``tools/collect_prior.py`` and any tuning database (a model's tasks, a
hub build); ``--per-workload N`` keeps a workload's N schedules that span its
speeds (its fastest quarter and the rest evenly by rank), ``--base`` keeps the
groups of an existing prior file. ``--validate`` prints, for every workload, how
a model trained on all the *other* workloads ranks its schedules: the true speed
of the top-1 and best-of-top-16 predicted schedules relative to the best measured
one (1.0 = perfect); ``--validate-db`` the same for the workloads of a held-out
database under a model trained on all the groups (and on the ``--base`` file's
alone, for comparison).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import tvm

from stormdrop.search import prior
from stormdrop.search.cost_model import new_xgb_model
from stormdrop.search.sketches import make_context
from stormdrop.storage.database import Database
from stormdrop.target import from_canonical
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json


def spread(records: list, n: int | None) -> list:
    """At most ``n`` of ``records`` (all when None): the fastest quarter of ``n`` and the rest
    evenly by speed rank (failed ones rank last), so the prior sees a workload's whole range."""
    if n is None or len(records) <= n:
        return records
    ranked = sorted(records, key=lambda r: float(np.median(r.result.run_secs)) if r.result.ok else 1e10)
    best = max(1, n // 4)
    rest = ranked[best:]
    picks = np.linspace(0, len(rest) - 1, n - best).round().astype(int)
    return ranked[:best] + [rest[i] for i in sorted(set(picks))]


def extract(db: Database, per_workload: int | None = None, label: str = "") -> list[prior.PriorGroup]:
    """One group a workload and target of ``db`` (named ``label/workload`` when labelled: names are
    the cost model's group keys and must not repeat)."""
    import tvm.s_tir.meta_schedule as ms

    groups = []
    extractor = ms.feature_extractor.PerStoreFeature()
    for entry in db.workloads():
        for target_key in db.targets(entry.workload_id):
            target = from_canonical(target_key)
            ctx = make_context(entry.mod, target, seed=0, name=entry.name)
            cands, costs = [], []
            for rec in spread(db.records(entry.workload_id, target_key), per_workload):
                try:
                    sch = schedule_from_trace_json(entry.mod, rec.trace_json)
                except Exception:  # noqa: BLE001 - a trace that no longer replays is skipped
                    continue
                args = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
                cands.append(ms.MeasureCandidate(sch, args))
                costs.append(float(np.median(rec.result.run_secs)) if rec.result.ok else 1e10)
            feats = [f.numpy().astype("float32") for f in extractor.extract_from(ctx, cands)]
            keep = [i for i, f in enumerate(feats) if len(f)]
            if len(keep) < 2 or min(costs[i] for i in keep) >= 1e10:
                print(f"{entry.name}: no valid measurement, skipped", flush=True)
                continue  # all-failed groups would teach "every schedule is the best one"
            groups.append(prior.PriorGroup(f"{label}/{entry.name}" if label else entry.name, [feats[i] for i in keep],
                                           np.array([costs[i] for i in keep], dtype=np.float32)))
            print(f"{entry.name}: {len(keep)} schedules, best {min(costs) * 1e6:.1f} us", flush=True)
    return groups


def validate(groups: list[prior.PriorGroup], held_out: list[prior.PriorGroup] | None = None) -> None:
    """How a model trained on the other groups ranks each group's schedules (each of ``held_out``
    under one model trained on all of ``groups``, when given)."""
    top1, top16, rand16 = [], [], []
    shared = new_xgb_model(tvm.target.Target("llvm"), groups) if held_out is not None else None
    for held in (groups if held_out is None else held_out):
        model = shared or new_xgb_model(tvm.target.Target("llvm"), [g for g in groups if g is not held])
        pred = model._predict(xs=held.features)  # noqa: SLF001 - MetaSchedule's own scoring path
        order = np.argsort(-pred)
        best = held.costs.min()
        r1 = best / held.costs[order[0]]
        r16 = best / held.costs[order[:16]].min()
        rng = np.random.default_rng(0)
        chance = np.mean([best / held.costs[rng.permutation(len(held.costs))[:16]].min() for _ in range(200)])
        top1.append(r1)
        top16.append(r16)
        rand16.append(chance)
        print(f"  {held.name:48s} top-1 {r1:.2f}  best-of-top-16 {r16:.2f}  (random 16: {chance:.2f}, "
              f"n={len(held.costs)})")
    g = lambda v: np.exp(np.mean(np.log(v)))  # noqa: E731
    print(f"geomean: top-1 {g(top1):.3f}  best-of-top-16 {g(top16):.3f}  random 16 {g(rand16):.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, action="append", help="a database to learn from (repeatable)")
    p.add_argument("--per-workload", type=int, default=None, help="at most N schedules a workload (default: all)")
    p.add_argument("--base", default=None, help="a prior file whose groups are kept")
    p.add_argument("--retrain", default="base", choices=["base", "all"],
                   help="the groups the cost model trains on again with a workload's own measurements: the "
                        "--base file's (base: the --db groups shape only the ranking before them; without "
                        "--base, all) or all of them")
    p.add_argument("--out", default=str(prior.X86_PRIOR))
    p.add_argument("--validate", action="store_true")
    p.add_argument("--validate-db", default=None, help="a held-out database to rank under the trained model")
    args = p.parse_args()
    base = prior.load(args.base) if args.base else []
    groups = list(base)
    for path in args.db:
        with Database(path) as db:
            extra = extract(db, args.per_workload, label=Path(path).name)
        groups += [dataclasses.replace(g, retrain=args.retrain == "all" or not base) for g in extra]
    if args.validate:
        validate(groups)
    if args.validate_db:
        with Database(args.validate_db) as db:
            held = extract(db)
        if base:
            print("the base prior alone:")
            validate(base, held)
        print("all groups:")
        validate(groups, held)
    meta = {"tvm": tvm.__version__, "extractor": "per-store-feature", "source": args.db, "base": args.base,
            "per_workload": args.per_workload, "retrain": args.retrain,
            "workloads": [g.name for g in groups], "schedules": int(sum(len(g.costs) for g in groups))}
    prior.save(args.out, groups, meta)
    print(f"wrote {args.out}: {json.dumps(meta)[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
