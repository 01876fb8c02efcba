"""The cost model's prior: what the storm knows before a workload's first measurement.

A cold XGBoost model ranks candidates at random until it has seen a batch, so
at small budgets the first measurements are spent on random schedules. The
prior is a dataset of measured schedules of *other* workloads (features from
MetaSchedule's per-store extractor, costs normalised per workload, as the
XGBoost model itself trains), shipped with stormdrop for x86 CPUs and built by
``tools/train_prior.py``: training kernels that are not in the benchmarks
(``tools/collect_prior.py``) and the tasks of networks tuned into databases,
each workload's schedules spanning its speeds (the file's meta names its
sources). The storm's model starts trained on all of it; once the workload has
measurements of its own (``StormConfig.prior_alone``) it retrains on them and
the groups marked ``retrain`` (the training kernels): transfer learning, as
AutoTVM's and TenSet's pretrained models do, where the large part ranks the
cold start and the small part keeps retraining cheap and the workload's own
data weighty.

The dataset only describes how loop structure maps to speed on an x86 CPU
with AVX2-class SIMD; it is used for LLVM targets on x86 and nothing else.
"""

from __future__ import annotations

import functools
import json
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tvm.target import Target

log = logging.getLogger("stormdrop")

DATA_DIR = Path(__file__).parent / "data"
X86_PRIOR = DATA_DIR / "prior_llvm_x86.npz"


@dataclass
class PriorGroup:
    """Measured schedules of one workload: per-store feature matrices and costs (seconds).
    ``retrain``: the model trains on the group again with the workload's own measurements
    (``cost_model.new_xgb_model``), or the group only shapes the prior's ranking before them."""

    name: str
    features: list[np.ndarray]
    costs: np.ndarray
    retrain: bool = True


def applies_to(target: Target) -> bool:
    """True when the shipped prior describes ``target`` (LLVM on an x86-64 CPU)."""
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple:
        return triple.startswith(("x86_64", "i686", "i386"))
    return platform.machine().lower() in ("x86_64", "amd64")


def save(path: str | Path, groups: list[PriorGroup], meta: dict) -> None:
    """Write groups as one compressed file (float16 features: ranks, not values, matter)."""
    counts = np.array([len(f) for g in groups for f in g.features], dtype=np.int32)
    feats = np.concatenate([f for g in groups for f in g.features], axis=0).astype(np.float16)
    np.savez_compressed(
        path,
        names=np.array([g.name for g in groups]),
        group_sizes=np.array([len(g.costs) for g in groups], dtype=np.int32),
        retrain=np.array([g.retrain for g in groups], dtype=bool),
        store_counts=counts,
        features=feats,
        costs=np.concatenate([g.costs for g in groups]).astype(np.float32),
        meta=np.array(json.dumps(meta)),
    )


def load(path: str | Path = X86_PRIOR) -> list[PriorGroup]:
    """The groups of a prior file ([] when there is none)."""
    path = Path(path)
    if not path.exists():
        return []
    with np.load(path, allow_pickle=False) as z:
        names, sizes, counts = z["names"], z["group_sizes"], z["store_counts"]
        feats, costs = z["features"].astype(np.float32), z["costs"]
        retrain = z["retrain"] if "retrain" in z.files else np.ones(len(names), dtype=bool)
    groups, row, sample = [], 0, 0
    for name, size, again in zip(names, sizes, retrain):
        fs = []
        for c in counts[sample:sample + size]:
            fs.append(feats[row:row + c])
            row += c
        groups.append(PriorGroup(str(name), fs, costs[sample:sample + size].astype(np.float32), bool(again)))
        sample += size
    return groups


@functools.lru_cache(maxsize=2)
def _read(path: str) -> list[PriorGroup]:
    """A prior file, read once per process (a model has one storm per task)."""
    return load(path)


def for_target(target: Target, path: str | Path | None = None) -> list[PriorGroup]:
    """The prior for ``target`` (the shipped one, or the file at ``path``), or [] when none applies."""
    if not applies_to(target):
        return []
    groups = _read(str(path or X86_PRIOR))
    log.debug("cost-model prior: %d workloads, %d schedules", len(groups), sum(len(g.costs) for g in groups))
    return groups
