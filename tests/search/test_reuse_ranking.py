"""Which transfers reuse measures when the cost model's prior ranks them (``StormConfig.transfer_pool``,
``transfer_ranked``); the prior is replaced by one that scores the last candidate it is shown fastest."""

from __future__ import annotations

import shutil

import pytest

from stormdrop.records import MeasureResult, Phase, Record
from stormdrop.search.cost_model import CostModel
from stormdrop.search.options import SearchOptions
from stormdrop.search.sketches import make_context
from stormdrop.search.space import Candidate
from stormdrop.search.storm import StormConfig
from stormdrop.storage.database import Database
from stormdrop.target import canonical, host_target
from stormdrop.tuning.kernel_tune import tune_kernel
from stormdrop.tuning.options import KernelOptions
from stormdrop.workloads import parse_kernel

KERNEL = "matmul:M=48,N=80,K=64"


@pytest.fixture
def ranked(monkeypatch):
    """The candidates' keys of every ranking, in the order shown; the last one shown scores fastest."""
    shown = []

    def predict(self, cands, learn=True):
        shown.append([c.key for c in cands])
        return [float(i) for i in range(len(cands))]

    monkeypatch.setattr(CostModel, "predict", predict)
    return shown


def _three_matmul_donors(db, seeds):
    """A database of three matmul workloads, each with a record per seed (a design-space sample; the
    seed-th one timed (1 + seed) x 0.1 ms)."""
    with Database(db) as d:
        for shape in ("M=64,N=64,K=64", "M=32,N=64,K=96", "M=96,N=48,K=64"):
            k = parse_kernel(f"matmul:{shape}")
            entry = d.commit_workload(k.mod, name=k.name, op_class=k.op_class, flops=k.flops)
            for seed in seeds:
                sch = make_context(k.mod, host_target(), seed=seed).generate_design_space()[0]
                cand = Candidate.from_schedule(sch, Phase.STORM)
                d.commit_record(Record(entry.workload_id, canonical(host_target()), cand.key, cand.trace_json, "[]",
                                       MeasureResult(run_secs=(1e-4 * (1 + seed),) * 3), Phase.STORM, 0.0))
    return db


def _reused(donors, path, storm=None):
    """The keys of the transfers a reuse-only tune of KERNEL (--reuse 2, 2 trials) measures, in order,
    on a copy of ``donors`` at ``path``."""
    shutil.copy(donors, path)
    search = SearchOptions(reuse=2, phases=(Phase.REUSE,), storm=storm or StormConfig())
    tune_kernel(KERNEL, KernelOptions(trials=2, exploit_trials=0, seed=0, search=search), db=path)
    with Database(path) as d:
        entry = d.find_workload(parse_kernel(KERNEL).mod)
        return [r.candidate_key for r in d.records(entry.workload_id) if r.phase is Phase.REUSE]


@pytest.mark.slow
def test_with_a_prior_reuse_measures_the_nearest_donors_best_then_what_the_prior_ranks_fastest(tmp_path, ranked):
    """--reuse N with a prior and transfer_pool=2: the two best records of more donors are
    transferred; the nearest donor's best and the N - 1 transfers the prior ranks fastest are
    measured (no more than there are donors). The default, transfer_pool=1: the nearest donors'
    best records, in donor order, no ranking."""
    db = _three_matmul_donors(tmp_path / "d.db", seeds=(0, 1))
    # the vector veto off: a design-space sample runs without vectors, and the veto ranks a larger pool again
    keys = _reused(db, tmp_path / "ranked.db", storm=StormConfig(transfer_pool=2, vector_veto=False))
    assert len(ranked) == 1 and len(ranked[0]) >= 2  # more transfers (1 + 2) than measured (2)
    assert len(keys) == 2 and ranked[0][-1] in keys  # the prior's fastest ...
    nearest = next(k for k in keys if k != ranked[0][-1])
    assert nearest not in ranked[0]  # ... and the nearest donor's best, never ranked out
    ranked.clear()
    plain = _reused(db, tmp_path / "plain.db", storm=StormConfig(vector_veto=False))  # donor order, no ranking
    assert ranked == [] and len(plain) == 2 and nearest in plain


@pytest.mark.slow
def test_with_a_prior_reuse_measures_the_transfers_the_prior_scores_fastest(tmp_path, ranked):
    """transfer_ranked=8: reuse transfers from the nearest donors, their best records
    and their decisions in each sketch, until it holds 8 candidates, and measures the ones the prior
    scores fastest, not the nearest donor's first (off by default: docs/guide.md)."""
    db = _three_matmul_donors(tmp_path / "d.db", seeds=(0,))
    keys = _reused(db, tmp_path / "ranked.db", storm=StormConfig(transfer_ranked=8))
    assert len(ranked) == 1 and len(ranked[0]) > 2  # more transfers than the two measured
    assert keys == ranked[0][-1:-3:-1]  # the two it scores fastest, fastest first


@pytest.mark.slow
def test_reuse_takes_the_fastest_of_the_nearest_donors_first_by_default(tmp_path, monkeypatch):
    """StormConfig.fastest_donors (4 by default) reaches the donor listing (search.donors' rule:
    tests/search/test_donor_order.py) and changes which transfer a reuse of one trial measures: of
    three donors timed alike, the nearest (fastest_donors=1's pick) is not the fastest in FLOPs a second."""
    import stormdrop.search.reuse as reuse

    asked = []
    listing = reuse.donors
    monkeypatch.setattr(reuse, "donors", lambda *a, **k: asked.append(k["fastest_of"]) or listing(*a, **k))
    db = _three_matmul_donors(tmp_path / "d.db", seeds=(0,))
    # the vector veto off: these design-space samples run without vectors, and the veto lists the donors again
    nearest = _reused(db, tmp_path / "nearest.db", storm=StormConfig(fastest_donors=1, vector_veto=False))
    fastest = _reused(db, tmp_path / "fastest.db", storm=StormConfig(vector_veto=False))
    assert asked == [1, 4]
    assert nearest[0] != fastest[0]
