"""Storm: exploration with MetaSchedule's evolutionary search and a learned cost model.

The storm proposes batches of candidates and is told their results; it never
builds or runs anything. Under the hood it is Ansor's method as MetaSchedule
implements it: sketches from the ``post-order-apply`` design space, random
annotation, evolution guided by the task's cost model (``cost_model.CostModel``,
an XGBoost model over per-store features, shared with reuse and the raindrop).
Its parameters are tuned for small budgets (the per-trial overhead of the
search is part of the user's wait): a smaller population, and, on x86, a cost
model that predicts from the first batch on (``prior.py``: it starts trained on
measured schedules of other kernels and retrains on them plus every measurement
of this workload; ``--no-prior`` turns it off); elsewhere the model starts cold
and predicts after the first (random) batch instead of after 100 samples.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from stormdrop.records import MeasureResult, Phase
from stormdrop.search.cost_model import CostModel, to_runner_result
from stormdrop.search.sketches import Sketches, make_context
from stormdrop.search.space import Candidate

log = logging.getLogger("stormdrop")


@dataclass(frozen=True)
class StormConfig:
    """Evolutionary search parameters (Ansor's names; defaults for small budgets)."""

    batch_size: int = 16
    # 128 x 2 instead of MetaSchedule's 512 x 4: a trained model scores every member of every
    # generation (feature extraction), about six times the work at 512 x 4 for second batches of
    # the same quality (a standalone A/B on a 3x3 convolution, 2 seeds).
    population_size: int = 128
    genetic_num_iters: int = 2
    genetic_mutate_prob: float = 0.85
    init_measured_ratio: float = 0.2
    init_min_unmeasured: int = 64
    eps_greedy: float = 0.05
    cost_model: str = "xgb"
    # Start the XGBoost model from the shipped prior (prior.py) where it applies (x86), and
    # take the first batch as the prior's top picks among prior_pool x batch_size random
    # samples of the design space (cheap to draw; only measuring costs): faster kernels in less
    # time in its A/B (README "Prior", RESULTS.md).
    prior: bool = True
    prior_pool: int = 8
    # Another prior file than the shipped one (tools/train_prior.py writes them; A/Bs compare them).
    prior_file: str | None = None
    # With a prior, the model ranks as the prior alone does until the workload has this many
    # measurements of its own: a retraining on a few of them barely moves a model trained on
    # thousands and costs seconds a time (once per raindrop step at small budgets).
    prior_alone: int = 16
    # Reuse (--reuse N): 1: the nearest N donors' best records, in donor order (transfer-tuning's
    # choice). k > 1, with a prior: the best two records of each of the nearest k x N donors are
    # transferred; the nearest donor's best and the N - 1 the prior ranks fastest are measured (no
    # more than there are donors). Not the default: where it was measured it was no better than donor
    # order within the runs' noise and took longer (README "Reuse", RESULTS.md).
    transfer_pool: int = 1
    # With a prior, reuse leaves this many of the storm's trials to the prior's picks among random
    # samples (reuse takes the rest, at least one): at a share of two trials a task, transfers
    # from sibling tasks tuned as briefly are otherwise a task's only schedules. Not the default: no
    # better on held out networks where it was measured, and slower to tune (docs/guide.md "Reuse").
    prior_picks: int = 0
    # Which donors reuse tries first (search.donors): "class" (the nearest relation of the fused
    # operators, then shapes) or "shape" (the nearest shapes, then the relation: no better where
    # it was measured, RESULTS.md).
    donor_order: str = "class"
    # k > 1: of the nearest k donors in that order (the task's very workload elsewhere, a hub's
    # exact hit, always first), the fastest (FLOPs a second of its best record) among those whose
    # shapes are near the nearest's is tried first (search.donors): the nearest is often a sibling
    # or hub entry tuned briefly, and its transfer inherits that. 4: faster where it was measured at
    # 128 trials, and never slower beyond the runs' spread (docs/guide.md "Reuse"); 1: nearest first.
    fastest_donors: int = 4
    # With fastest_donors k > 1: this very workload tuned elsewhere (the hub's exact hit) is one of the
    # nearest k too, at distance 0, and goes first only where it is the fastest of them (True), or
    # always first (False).
    fastest_exact: bool = False
    # Reuse also moves each donor's decisions into every sketch of the workload (reuse.in_sketches)
    # and measures each donor's transfers together, nearest donor first, up to the reuse budget
    # (False: one transfer a donor, the donor's own structure).
    transfer_sketches: bool = True
    # With transfer_sketches and a prior (and transfer_pool 1), k > 0: reuse transfers from the
    # nearest donors until it holds k candidates (each donor's best record as it transfers and its
    # decisions in each sketch) and measures the ones the prior scores fastest, the task's very
    # workload's first (the hub's, another database's); where the budget holds them all, all of
    # them. Not the default: at 128 trials the held out networks were no faster (one slower), and
    # building the extra transfers took more search time (docs/guide.md "Reuse").
    transfer_ranked: int = 0
    # With transfer_sketches: only the nearest k donors are moved into the sketches, the others
    # give their best as it transfers (0: every donor). On the pairs so far the sketches won where
    # the donors' structure was wrong (mobilenet_v2) and cost donor variety where near-exact
    # donors existed (the ResNets); k = 1 keeps both (not measured yet).
    sketch_donors: int = 0
    # With a prior and a storm phase, k > 0 vets reuse's transfers: the prior also ranks its own
    # picks among prior_pool random samples a transfer, and a pick takes the place of a transfer
    # that scores below k x the pick's score. Transfers from sibling tasks tuned as briefly can
    # pass on a flaw (a tile refitted to 1 loses the vector loop, the next sibling inherits it).
    # Not the default: no better on held out networks where it was measured (docs/guide.md "Reuse").
    transfer_vetting: float = 0.0
    # k > 0, on LLVM CPU targets: reuse compiles each transfer it would measure and passes over one whose
    # kernel moves more than k vector registers to or from the stack (a refitted tile that spills:
    # search.spills) for the next transfer that does not, from up to SPILL_SPARE more (the spilling
    # ones last, fewest spills first, where none is left). 0: off.
    spill_veto: int = 0
    # On LLVM CPU targets, reuse passes over a transfer in which a reduction block runs in no vector
    # loop along the last axis it writes (search.vectors: a refitted tile of 1 on the contiguous axis
    # leaves the product scalar) for the next transfer that has one, from up to SPILL_SPARE more
    # (kept in order where none has).
    vector_veto: bool = True
    # k > 0, on LLVM CPU targets: a transfer whose kernel spills more than k vector registers more than
    # at another unroll depth is taken at the deepest depth that spills at most k more than the least
    # (Reuse._unroll_fitted; each checked depth compiled once). 0: off.
    unroll_spills: int = 0
    # On a CPU a transfer's innermost tile factor above the vector's lane count is a multiple of it,
    # where the new extent allows (search.reuse.nearest_factorization): LLVM turns a vectorized loop
    # of 24 floats on AVX-512 into shuffles and spills, and a task that gets one measurement keeps
    # such a transfer. The default: much faster models under short time budgets, about level ones
    # under 128-trial caps on held-out networks (docs/guide.md "Reuse").
    whole_vectors: bool = True
    # A small budget's first rounds (a first batch smaller than batch_size) give each task a sample
    # or two, and a task that starts with no donor hands its one schedule on to every later task
    # of a related class (reuse): a lead with heirs measures up to this many storm samples first
    # (the prior's picks; one per heir at most, no more than batch_size), so that its heirs start
    # from the best of several, not from one draw (``tuning.budget.lead_batch``). 1: off, the default:
    # 8 against 1 on six networks at 128 trials was faster on two, slower on two, level on two: where
    # heirs only transfer, the lead's best of several on its own shape transfers no better than its
    # one draw (benchmarks/RESULTS.md, "A lead's several samples").
    lead_samples: int = 1
    # Reuse draws from the schedule hub its workloads related to the task's (transfers from the
    # hub's shapes, nearest first, with the run's own donors), not only the task's very workload.
    hub_transfers: bool = True
    # On CPUs the sketches include a copy-like kernel vectorized along its innermost loop
    # (search.rows: a channel shuffle's rows of 14), beside MetaSchedule's vectors across its rows.
    row_vectors: bool = True


class Storm:
    """Ask/tell wrapper around MetaSchedule's EvolutionarySearch for one workload."""

    def __init__(self, mod: tvm.IRModule, target: Target, *, trials: int, seed: int,
                 config: StormConfig | None = None,
                 history: list[tuple[Candidate, MeasureResult]] = (), sketches: Sketches | None = None,
                 model: CostModel | None = None) -> None:
        """``sketches`` and ``model``: the task's, shared with its other phases (default: the storm's
        own, as ``config`` says); ``history``: the stored measurements, learnt first."""
        self.config = cfg = config or StormConfig()
        # On a GPU most random schedules fail MetaSchedule's checks (threads, shared memory): asking
        # for 64 valid ones of 128 ended the storm of a conv on an H100 after 28 of its 64 trials
        # (benchmarks/history/RESULTS-2026-11.md, "Kernels on an NVIDIA H100"); a batch's worth is enough to evolve from
        min_unmeasured = cfg.init_min_unmeasured if target.kind.name != "cuda" else \
            min(cfg.init_min_unmeasured, cfg.batch_size)
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=cfg.population_size, init_measured_ratio=cfg.init_measured_ratio,
            init_min_unmeasured=min_unmeasured, genetic_num_iters=cfg.genetic_num_iters,
            genetic_mutate_prob=cfg.genetic_mutate_prob, eps_greedy=cfg.eps_greedy,
        )
        self.ctx = make_context(mod, target, seed=seed, strategy=strategy)
        self.mod, self.target, self.seed = mod, target, seed
        self.database = ms.database.MemoryDatabase()
        self.workload = self.database.commit_workload(mod)
        self.sketches = sketches if sketches is not None else Sketches(mod, target, seed, row_vectors=cfg.row_vectors)
        self.model = model if model is not None else CostModel(self.sketches.context, cfg)
        self._pending: list[ms.MeasureCandidate] = []
        self.remaining = trials
        self.explored = 0  # measurements of the storm's own (random or evolved), stored or told
        self._seen: set[str] = set()  # keys of candidates proposed or learnt
        self._learn(history)
        self._cold_ctx: ms.TuneContext | None = None
        if trials > 0:
            spaces = self.design_spaces()
            # MetaSchedule counts a full batch per round even when the evolution finds fewer new
            # candidates (duplicates): with max_trials = trials the storm lost 2-4 of 32 trials.
            # ``remaining`` ends the storm; the slack allows four short rounds.
            self.ctx.pre_tuning(max_trials=trials + 4 * cfg.batch_size, num_trials_per_iter=cfg.batch_size,
                                design_spaces=spaces,
                                database=self.database, cost_model=self.model.ms_model)
            if self._cold():
                # While the cost model still answers with random numbers (its warm-up), evolving a
                # population against it is wasted work (two orders of magnitude more than
                # sampling): sample the design space at random instead, as the
                # evolution's own initial population does. A prior ranks a larger random pool.
                # One thread: the same seed draws the same first batch (sampling 128 is cheap).
                pool = cfg.batch_size * (max(1, cfg.prior_pool) if self.model.ranks else 1)
                self._cold_ctx = self._sampler(pool, max(trials, pool), self.database)

    def _sampler(self, per_draw: int, max_trials: int, database: object) -> ms.TuneContext:
        """A one-thread context that draws ``per_draw`` random samples of the design spaces a call."""
        ctx = make_context(self.mod, self.target, seed=self.seed, strategy=ms.search_strategy.ReplayTrace(), threads=1)
        ctx.pre_tuning(max_trials=max_trials, num_trials_per_iter=per_draw, design_spaces=self.design_spaces(),
                       database=database, cost_model=None)
        return ctx

    def design_spaces(self) -> list:
        """The workload's sketches (``Sketches.spaces``), which the storm samples and evolves from."""
        return self.sketches.spaces()

    def _cold(self) -> bool:
        """True before the first batch is chosen by a model of this workload: while XGBoost predicts
        at random (before its warm-up samples), or, with a prior, before any own measurement."""
        if self.model.ranks:
            # Reuse's transfers do not end it: evolving from a few transferred schedules (the only
            # measured members of the population) can keep a storm in their basin (nearly every
            # candidate with the donor's column tile, README "Storm after reuse"); a first batch of
            # the prior's picks among random samples shows the model, and the population, the rest
            # of the space.
            return self.explored == 0
        return self.model.warming_up

    def _search(self) -> ms.TuneContext:
        """The context that proposes (and is told) the current batch: random while cold, else evolution."""
        return self._cold_ctx if self._cold_ctx is not None and self._cold() else self.ctx

    def _learn(self, history: list[tuple[Candidate, MeasureResult]]) -> None:
        """Warm start from stored measurements: seed the population and tell the model (trained when next used)."""
        if not history:
            return
        self._seen.update(c.key for c, _ in history)
        self.model.tell([c for c, _ in history], [r for _, r in history])
        self._commit([c.measure_candidate for c, _ in history], [r for _, r in history])
        self.explored += sum(c.phase == Phase.STORM for c, _ in history)

    def absorb(self, candidates: list[Candidate], results: list[MeasureResult],
               fresh: Sequence[bool] | None = None) -> None:
        """Measurements made outside the storm (reuse): learnt, seeded, and out of its budget (those
        ``fresh`` ones only: a stored result was charged when it was measured)."""
        self._learn(list(zip(candidates, results)))
        self.remaining -= len(candidates) if fresh is None else sum(map(bool, fresh))

    def _commit(self, cands: list[ms.MeasureCandidate], results: list[MeasureResult]) -> None:
        for cand, result in zip(cands, results):
            if result.ok:
                self.database.commit_tuning_record(ms.database.TuningRecord(
                    cand.sch.trace, self.workload, list(result.run_secs), self.target, cand.args_info))

    def propose(self, limit: int | None = None) -> list[Candidate] | None:
        """The next batch to measure (at most ``limit``), or None when the storm is over.

        Schedules already proposed or learnt are dropped: random pools (and the prior's top
        picks of one) hold duplicates, which the session would not measure again.
        """
        if self.remaining <= 0:
            return None
        self.model.trained()  # the evolution ranks its population with the model
        pool = self._draw()
        if self.model.ranks and self._cold():
            pool = self.model.ranked(pool)
        size = min(self.remaining, limit or self.remaining, self.config.batch_size)  # reuse came out of the budget
        self._pending, out = [], []
        for mc in pool:
            if len(out) >= size:  # a candidate's key costs its trace as JSON: the rest of a pool is left
                break
            cand = Candidate.from_schedule(mc.sch, Phase.STORM, mc.args_info)
            if cand.key not in self._seen:
                self._seen.add(cand.key)
                self._pending.append(mc)
                out.append(cand)
        if not out:
            self.remaining = 0
            return None
        return out

    def _draw(self, tries: int = 3) -> list[ms.MeasureCandidate]:
        """The search's next candidates; an empty draw (too few valid random schedules sampled this
        time) is drawn again, from new random samples, up to ``tries`` times before the storm ends."""
        for _ in range(tries):
            pool = list(self._search().generate_measure_candidates() or [])
            if pool:
                return pool
        return []

    def tell(self, candidates: list[Candidate], results: list[MeasureResult],
             fresh: Sequence[bool] | None = None) -> None:
        """Results of the last proposed batch, in the same order; ``fresh``: which of them were
        measured for it (the others were stored already and cost nothing; default: all)."""
        cands = self._pending
        self._search().notify_runner_results(cands, [to_runner_result(r) for r in results])
        self.model.tell(candidates, results)
        self._commit(cands, results)
        self.explored += len(cands)
        self.remaining -= len(cands) if fresh is None else sum(map(bool, fresh))
        self._pending = []

    def rivals(self, n: int) -> list[Candidate]:
        """The prior's top ``n`` picks among ``prior_pool`` x ``n`` new random samples, as storm
        candidates not proposed before (none without a prior): what reuse's transfers are vetted
        against. A pick measured in reuse's batch is the storm's own, learnt there (``absorb``)."""
        if not self.model.ranks or n <= 0:
            return []
        size = max(1, self.config.prior_pool) * n
        ctx = self._sampler(size, size, ms.database.MemoryDatabase())
        try:
            pool = self.model.ranked(list(ctx.generate_measure_candidates() or []))
        finally:
            ctx.post_tuning()
        out: list[Candidate] = []
        for mc in pool:
            cand = Candidate.from_schedule(mc.sch, Phase.STORM, mc.args_info)
            if cand.key not in self._seen and len(out) < n:
                out.append(cand)
        return out

    def close(self) -> None:
        if self.remaining >= 0 and self._pending == []:
            try:
                for ctx in (self.ctx, self._cold_ctx):
                    if ctx is not None:
                        ctx.post_tuning()
            except Exception:  # noqa: BLE001 - post_tuning before pre_tuning raises; nothing to clean
                pass
