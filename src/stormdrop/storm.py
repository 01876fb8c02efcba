"""Storm: exploration with MetaSchedule's evolutionary search and a learned cost model.

The storm proposes batches of candidates and is told their results; it never
builds or runs anything. Under the hood it is Ansor's method as MetaSchedule
implements it: sketches from the ``post-order-apply`` design space, random
annotation, evolution guided by an XGBoost model over per-store features.
Its parameters are tuned for small budgets (the per-trial overhead of the
search is part of the user's wait): a smaller population, and a cost model
that starts predicting after the first batch instead of after 100 samples, or,
with ``prior=True`` (``--prior``), from the first batch on (``prior.py``: the
model starts trained on measured schedules of other kernels and retrains on
them plus every measurement of this workload).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from . import _tvm, prior
from .records import MeasureResult, Phase
from .space import Candidate
from .target import physical_cores

log = logging.getLogger("stormdrop")


@dataclass(frozen=True)
class StormConfig:
    """Evolutionary search parameters (Ansor's names; defaults for small budgets)."""

    batch_size: int = 16
    population_size: int = 512
    genetic_num_iters: int = 4
    genetic_mutate_prob: float = 0.85
    init_measured_ratio: float = 0.2
    init_min_unmeasured: int = 64
    eps_greedy: float = 0.05
    cost_model: str = "xgb"
    # Start the XGBoost model from the shipped prior (prior.py) when it applies. Off by default:
    # measured on conv 128x28x28 3x3 (seed 0, 32+32 trials) it gives a better first batch
    # (median 5.5 ms vs ~20 ms cold) but the same final kernel (2292 vs 2303 us) in more time
    # (120 vs 98 s: the evolution now extracts features for every member it scores).
    prior: bool = False


def make_context(mod: tvm.IRModule, target: Target, *, seed: int, strategy: object = "evolutionary",
                 name: str = "main") -> ms.TuneContext:
    """A TuneContext for ``mod`` on ``target`` (design space + postprocessors initialised)."""
    _tvm.load_tensor_intrinsics(target.kind.name)
    return ms.TuneContext(mod, target=target, space_generator="post-order-apply",
                          search_strategy=strategy, task_name=name, rand_state=seed, num_threads=physical_cores())


_PRIOR_CACHE: dict[str, tuple[list, object]] = {}


def new_xgb_model(target: Target, groups: list[prior.PriorGroup] = (), *,
                  warmup: int = 16) -> ms.cost_model.XGBModel:
    """An XGBoost cost model; trained on ``groups`` (a prior) when given, else cold.

    With a prior the model predicts from the first batch and retrains on every
    update (MetaSchedule's adaptive training would skip all updates smaller than
    a fifth of the data, i.e. every update of this workload).
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
        model._train(xs=xs, ys=ys)  # noqa: SLF001 - MetaSchedule's training on our data groups
        _PRIOR_CACHE[key] = (data, model.booster)
    data, booster = _PRIOR_CACHE[key]
    for g in data:  # prior groups are shared read-only: updates only append to this workload's group
        model.data[g.group_hash] = g
        model.data_size += len(g.costs)
    model.booster = booster
    return model


def to_runner_result(result: MeasureResult) -> ms.runner.RunnerResult:
    if result.ok:
        return ms.runner.RunnerResult(run_secs=list(result.run_secs), error_msg=None)
    return ms.runner.RunnerResult(run_secs=None, error_msg=f"{result.error.value}: {result.error_msg}")


class Storm:
    """Ask/tell wrapper around MetaSchedule's EvolutionarySearch for one workload."""

    def __init__(self, mod: tvm.IRModule, target: Target, *, trials: int, seed: int,
                 config: StormConfig | None = None,
                 history: list[tuple[Candidate, MeasureResult]] = ()) -> None:
        self.config = cfg = config or StormConfig()
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=cfg.population_size, init_measured_ratio=cfg.init_measured_ratio,
            init_min_unmeasured=cfg.init_min_unmeasured, genetic_num_iters=cfg.genetic_num_iters,
            genetic_mutate_prob=cfg.genetic_mutate_prob, eps_greedy=cfg.eps_greedy,
        )
        self.ctx = make_context(mod, target, seed=seed, strategy=strategy)
        self.target = target
        self.database = ms.database.MemoryDatabase()
        self.workload = self.database.commit_workload(mod)
        if cfg.cost_model == "xgb":
            groups = prior.for_target(target) if cfg.prior else []
            self.cost_model = new_xgb_model(target, groups, warmup=cfg.batch_size)
        else:
            self.cost_model = ms.cost_model.CostModel.create(cfg.cost_model)
        self._pending: list[ms.MeasureCandidate] = []
        self.remaining = trials
        self._learn(history)
        self._cold_ctx: ms.TuneContext | None = None
        if trials > 0:
            spaces = self.ctx.generate_design_space()
            self.ctx.pre_tuning(max_trials=trials, num_trials_per_iter=cfg.batch_size, design_spaces=spaces,
                                database=self.database, cost_model=self.cost_model)
            if self._cold():
                # While the cost model still answers with random numbers (its warm-up), evolving a
                # population against it is wasted work (15.4 s of a 512 x 4 search on a 3x3 conv
                # here, against 0.1 s): sample the design space at random instead, as the
                # evolution's own initial population does.
                self._cold_ctx = make_context(mod, target, seed=seed, strategy=ms.search_strategy.ReplayTrace())
                self._cold_ctx.pre_tuning(max_trials=trials, num_trials_per_iter=cfg.batch_size,
                                          design_spaces=spaces, database=self.database, cost_model=None)

    def _cold(self) -> bool:
        """True while the cost model predicts at random (XGBoost before its warm-up samples)."""
        model = self.cost_model
        return isinstance(model, ms.cost_model.XGBModel) and model.data_size < model.num_warmup_samples

    def _search(self) -> ms.TuneContext:
        """The context that proposes (and is told) the current batch: random while cold, else evolution."""
        return self._cold_ctx if self._cold_ctx is not None and self._cold() else self.ctx

    def _learn(self, history: list[tuple[Candidate, MeasureResult]]) -> None:
        """Warm start from stored measurements: seed the population and train the model."""
        if not history:
            return
        cands = [c.measure_candidate for c, _ in history]
        results = [to_runner_result(r) for _, r in history]
        self.cost_model.update(self.ctx, cands, results)
        self._commit(cands, [r for _, r in history])

    def absorb(self, candidates: list[Candidate], results: list[MeasureResult]) -> None:
        """Measurements made outside the storm (reuse): learnt, seeded, and out of its budget."""
        self._learn(list(zip(candidates, results)))
        self.remaining -= len(candidates)

    def _commit(self, cands: list[ms.MeasureCandidate], results: list[MeasureResult]) -> None:
        for cand, result in zip(cands, results):
            if result.ok:
                self.database.commit_tuning_record(ms.database.TuningRecord(
                    cand.sch.trace, self.workload, list(result.run_secs), self.target, cand.args_info))

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        """The next batch to measure (at most ``limit``), or None when the storm is over."""
        if self.remaining <= 0:
            return None
        batch = self._search().generate_measure_candidates()
        if not batch:
            self.remaining = 0
            return None
        # absorbed (reused) trials came out of the budget
        self._pending = list(batch)[:min(self.remaining, limit or self.remaining)]
        return [Candidate.from_schedule(c.sch, Phase.STORM, c.args_info) for c in self._pending]

    def tell(self, candidates: list[Candidate], results: list[MeasureResult]) -> None:
        """Results of the last proposed batch, in the same order."""
        cands = self._pending
        runner_results = [to_runner_result(r) for r in results]
        self._search().notify_runner_results(cands, runner_results)  # before the update: same context
        self.cost_model.update(self.ctx, cands, runner_results)
        self._commit(cands, results)
        self.remaining -= len(cands)
        self._pending = []

    def predict(self, candidates: list[Candidate]) -> list[float]:
        """Cost-model scores (higher is faster) for candidates of this workload."""
        if not candidates:
            return []
        scores = self.cost_model.predict(self.ctx, [c.measure_candidate for c in candidates])
        return [float(s) for s in scores]

    def close(self) -> None:
        if self.remaining >= 0 and self._pending == []:
            try:
                for ctx in (self.ctx, self._cold_ctx):
                    if ctx is not None:
                        ctx.post_tuning()
            except Exception:  # noqa: BLE001 - post_tuning before pre_tuning raises; nothing to clean
                pass
