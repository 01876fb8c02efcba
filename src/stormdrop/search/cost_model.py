"""A task's cost model: told the task's measurements, asked to score its candidates.

One ``CostModel`` serves one workload for the whole of its tuning: its tuner builds it once
and hands it to every phase, so reuse ranks and vets its transfers with it, the storm evolves
against it and tells it each batch, and the raindrop ranks its neighbours with it. It is
MetaSchedule's XGBoost model over per-store features (``StormConfig.cost_model``), started from
the shipped prior where one applies (``search.prior``), and it owns the rules of its training:

- what it is told is queued and learnt when the model is next used (``trained``), so reuse's
  transfers and a first storm batch are one training, and a reuse-only run trains nothing;
- with a prior it ranks as the prior alone until the workload has ``prior_alone``
  measurements of its own;
- a measurement is learnt once: telling it again (a restarted storm re-reading the stored
  history, a stored transfer proposed again after a resume) changes nothing.

It measures and stores nothing, and proposes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from stormdrop.records import MeasureResult
from stormdrop.search import prior, prior_cache

if TYPE_CHECKING:
    from stormdrop.search.space import Candidate
    from stormdrop.search.storm import StormConfig

_PRIOR_CACHE: dict[str, tuple[list, object]] = {}


def new_xgb_model(target: Target, groups: Sequence[prior.PriorGroup] = (), *,
                  warmup: int = 16) -> ms.cost_model.XGBModel:
    """An XGBoost cost model; trained on ``groups`` (a prior) when given, else cold.

    With a prior the model predicts from the first batch, trained on every group; when it
    retrains (``CostModel.trained``) it learns the groups marked ``retrain`` with the workload's
    own measurements, so a large prior ranks the cold start without drowning the workload's
    own data or slowing every update. MetaSchedule's adaptive training is off: it would skip
    every update smaller than a fifth of the data, i.e. every update of this workload. The
    training on the prior is done once a process, and kept between runs (``prior_cache``).
    """
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import FeatureGroup

    cores = int(target.attrs.get("num-cores", 1)) if target.kind.name == "llvm" else None
    model = ms.cost_model.XGBModel(num_warmup_samples=0 if groups else warmup, num_tuning_cores=cores,
                                   adaptive_training=not groups, verbose_eval=10**9)
    if not groups:
        return model
    key = ",".join(g.name for g in groups)
    if key not in _PRIOR_CACHE:
        data = [FeatureGroup("prior:" + g.name, list(g.features), g.costs) for g in groups]
        xs = [f for g in data for f in g.features]
        ys = np.concatenate([np.divide(g.min_cost, g.costs, out=np.zeros_like(g.costs), where=g.costs != 0)
                             for g in data])

        def train():
            model._train(xs=xs, ys=ys)  # noqa: SLF001 - MetaSchedule's training on our data groups
            return model.booster

        _PRIOR_CACHE[key] = (data, prior_cache.trained_booster(model, xs, ys, train))
    data, booster = _PRIOR_CACHE[key]
    for g, group in zip(data, groups):  # shared read-only: updates only append to this workload's group
        if group.retrain:
            model.data[g.group_hash] = g
            model.data_size += len(g.costs)
    model.booster = booster
    return model


def to_runner_result(result: MeasureResult) -> ms.runner.RunnerResult:
    if result.ok:
        return ms.runner.RunnerResult(run_secs=list(result.run_secs), error_msg=None)
    return ms.runner.RunnerResult(run_secs=None, error_msg=f"{result.error.value}: {result.error_msg}")


class CostModel:
    """The cost model of the workload of ``context`` (a ``TuneContext``: its module names the
    workload's data, its target and threads make the features), as ``config`` says: its kind,
    the prior (``prior``, ``prior_file``, ``prior_alone``), a cold model's warm-up (``batch_size``)."""

    def __init__(self, context: ms.TuneContext, config: StormConfig) -> None:
        self.context, self.config = context, config
        target = context.target
        if config.cost_model == "xgb":
            groups = prior.for_target(target, config.prior_file) if config.prior else []
            self.ms_model = new_xgb_model(target, groups, warmup=config.batch_size)
        else:
            self.ms_model = ms.cost_model.CostModel.create(config.cost_model)
        self.measured = 0  # measurements of this workload it has been told
        self._known: set[str] = set()  # their candidates' keys
        self._untrained: tuple[list, list] = ([], [])  # told, not yet learnt (see ``trained``)

    @property
    def ranks(self) -> bool:
        """Whether it ranks with knowledge before any measurement of the workload (a prior)."""
        return self.config.prior and isinstance(self.ms_model, ms.cost_model.XGBModel) \
            and self.ms_model.num_warmup_samples == 0

    @property
    def warming_up(self) -> bool:
        """A model without a prior that still answers at random (before its warm-up samples)."""
        model = self.ms_model
        return isinstance(model, ms.cost_model.XGBModel) and model.data_size < model.num_warmup_samples

    def tell(self, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        """Measurements of the workload, learnt when the model is next used; one told before is
        left out."""
        for cand, result in zip(candidates, results):
            if cand.key in self._known:
                continue
            self._known.add(cand.key)
            self._untrained[0].append(cand.measure_candidate)
            self._untrained[1].append(to_runner_result(result))
            self.measured += 1

    def trained(self) -> ms.cost_model.CostModel:
        """MetaSchedule's model, trained on all it was told, when it is about to be used (with a
        prior: once the workload has ``prior_alone`` measurements of its own). XGBoost retrains on
        the prior's ``retrain`` groups and every measurement at each update (seconds on 2 cores)."""
        cands, results = self._untrained
        if cands and not (self.ranks and self.measured < self.config.prior_alone):
            self._untrained = ([], [])
            self.ms_model.update(self.context, cands, results)
        return self.ms_model

    def predict(self, candidates: Sequence[Candidate], learn: bool = True) -> list[float]:
        """Scores (higher is faster) of candidates of the workload; ``learn=False``: as the model
        stands, without training first on what it was told since."""
        if not candidates:
            return []
        model = self.trained() if learn else self.ms_model
        return [float(s) for s in model.predict(self.context, [c.measure_candidate for c in candidates])]

    def ranked(self, pool: list[ms.MeasureCandidate]) -> list[ms.MeasureCandidate]:
        """A pool of MetaSchedule candidates ordered by the (trained) model, best first."""
        if not pool:
            return pool
        scores = np.asarray(self.trained().predict(self.context, pool), dtype=float)
        return [pool[i] for i in np.argsort(-scores, kind="stable")]
