"""The cost-model prior: its file format, when it applies, and that it ranks unseen kernels."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from stormdrop.search import prior
from stormdrop.search.cost_model import new_xgb_model
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import host_target
from stormdrop.workloads import parse_kernel


def test_save_load_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    groups = [prior.PriorGroup(f"w{i}", [rng.random((int(rng.integers(1, 4)), 164)).astype("float32")
                                         for _ in range(5 + i)], rng.random(5 + i).astype("float32"))
              for i in range(3)]
    path = tmp_path / "p.npz"
    prior.save(path, groups, {"why": "test"})
    back = prior.load(path)
    assert [g.name for g in back] == ["w0", "w1", "w2"]
    for g, b in zip(groups, back):
        assert [f.shape for f in g.features] == [f.shape for f in b.features]
        np.testing.assert_allclose(np.concatenate(g.features), np.concatenate(b.features), rtol=1e-3)
        np.testing.assert_allclose(g.costs, b.costs)
    assert prior.load(tmp_path / "none.npz") == []


def test_applies_only_to_x86_llvm():
    host = host_target()
    assert prior.applies_to(tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu"}))
    assert not prior.applies_to(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}))
    assert not prior.applies_to(tvm.target.Target({"kind": "cuda", "arch": "sm_80"}))
    import platform

    assert prior.applies_to(host) == (platform.machine().lower() in ("x86_64", "amd64"))


def test_shipped_prior_is_present_and_sizable():
    groups = prior.load()
    assert len(groups) >= 15
    assert sum(len(g.costs) for g in groups) >= 800
    assert all(g.costs.min() < 1e9 for g in groups)  # every workload has valid measurements


@pytest.mark.slow
def test_prior_ranks_held_out_kernels_better_than_chance():
    """The training kernels held out: a model trained on the networks' tasks alone orders each
    kernel's schedules by speed better than chance (Spearman 0) on average (measured 0.20 with
    leave-one-kernel-out when the prior held the kernels only, which is what this does then)."""
    from scipy.stats import spearmanr

    import stormdrop.search.cost_model as cost_model

    groups = prior.load()
    kernels = [g for g in groups if "/" not in g.name]
    tasks = [g for g in groups if "/" in g.name]
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    cost_model._PRIOR_CACHE.clear()
    shared = new_xgb_model(target, tasks) if tasks else None
    rhos = []
    for held in kernels:
        cost_model._PRIOR_CACHE.clear()
        model = shared or new_xgb_model(target, [g for g in kernels if g is not held])
        pred = model._predict(xs=held.features)
        ok = held.costs < 1e9
        rhos.append(spearmanr(pred[ok], -held.costs[ok]).statistic)
    cost_model._PRIOR_CACHE.clear()
    assert np.mean(rhos) > 0.1, rhos


@pytest.mark.skipif(not prior.applies_to(host_target()), reason="the shipped prior is for x86 hosts")
def test_storm_with_prior_predicts_before_any_measurement():
    kernel = parse_kernel("matmul:M=32,N=32,K=32")
    storm = Storm(kernel.mod, host_target(), trials=16, seed=0, config=StormConfig(population_size=32, prior=True))
    cands = storm.propose()
    assert cands
    a, b = storm.model.predict(cands), storm.model.predict(cands)
    assert a == b  # a trained model, not MetaSchedule's random scores of a cold one
    cold = Storm(kernel.mod, host_target(), trials=16, seed=0, config=StormConfig(population_size=32, prior=False))
    assert cold.model.predict(cands) != cold.model.predict(cands)
    storm.close()
    cold.close()


@pytest.mark.slow
def test_the_cost_model_trains_only_when_it_is_used():
    """Retraining on the prior takes seconds a task: transfers told to the storm are learnt when
    the model ranks something (a storm batch, the raindrop), so a reuse-only run trains nothing."""
    from stormdrop.records import MeasureResult

    kernel = parse_kernel("matmul:M=32,N=32,K=32")
    source = Storm(kernel.mod, host_target(), trials=8, seed=0, config=StormConfig(population_size=16))
    cands = source.propose()
    source.close()
    storm = Storm(kernel.mod, host_target(), trials=8, seed=0, config=StormConfig(population_size=16, prior_alone=0))
    model = storm.model.ms_model
    start = model.data_size  # the prior's samples, when there is one

    def trained() -> int:  # what the model was trained on of this workload
        return model.data_size - start

    storm.absorb(cands[:3], [MeasureResult(run_secs=(1e-5 * (i + 1),) * 2) for i in range(3)])
    storm.absorb(cands[3:5], [MeasureResult(run_secs=(2e-5,) * 2)] * 2)
    assert trained() == 0 and storm.model.measured == 5 and storm.remaining == 3
    storm.model.predict(cands[:2])
    assert trained() == 5  # both transfers at once, when first used
    batch = storm.propose(limit=2)
    assert len(batch) == 2 and trained() == 5
    storm.tell(batch, [MeasureResult(run_secs=(3e-5,) * 2)] * len(batch))
    assert trained() == 5
    storm.propose()
    assert trained() == 7  # the next batch is ranked by a model that saw the last
    storm.close()


@pytest.mark.skipif(not prior.applies_to(host_target()), reason="the shipped prior is for x86 hosts")
def test_a_large_prior_ranks_alone_until_the_workload_has_its_own_measurements(tmp_path):
    """The prior's model ranks a workload's first candidates; it retrains (on the prior's ``retrain``
    groups and the workload's measurements) once the workload has ``prior_alone`` of its own: a few
    measurements barely move a model trained on thousands of schedules, and each retraining costs
    seconds."""
    from stormdrop.records import MeasureResult

    rng = np.random.default_rng(1)
    groups = [prior.PriorGroup(f"w{i}", [rng.random((2, 164)).astype("float32") for _ in range(20)],
                               rng.random(20).astype("float32") + 0.1, retrain=i == 0) for i in range(3)]
    path = tmp_path / "p.npz"
    prior.save(path, groups, {})
    assert [g.retrain for g in prior.load(path)] == [True, False, False]

    kernel = parse_kernel("matmul:M=32,N=32,K=32")
    source = Storm(kernel.mod, host_target(), trials=8, seed=0, config=StormConfig(population_size=16))
    cands = source.propose()
    source.close()
    storm = Storm(kernel.mod, host_target(), trials=8, seed=0,
                  config=StormConfig(population_size=16, prior_file=str(path), prior_alone=4))
    model = storm.model.ms_model
    assert model.data_size == 20  # the booster learnt all 60 schedules; retraining keeps the first group's
    first = storm.model.predict(cands[:4])
    storm.absorb(cands[:3], [MeasureResult(run_secs=(1e-5 * (i + 1),) * 2) for i in range(3)])
    assert storm.model.predict(cands[:4]) == first and model.data_size == 20  # 3 of its own: the prior alone
    storm.absorb(cands[3:5], [MeasureResult(run_secs=(2e-5,) * 2)] * 2)
    storm.model.predict(cands[:4])
    assert model.data_size == 25  # 5 >= 4: retrained on the retrain group and all five
    storm.close()


def _load_script(rel: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / rel
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_prior_never_saw_a_benchmark_kernel():
    """The benchmark's kernels are held out: no training kernel of the prior is one of them."""
    train = {parse_kernel(s).name for s in _load_script("tools/prior_kernels.py").TRAIN_KERNELS}
    bench = {parse_kernel(s).name for s in _load_script("benchmarks/bench_kernels.py").KERNELS.values()}
    assert not train & bench
    shipped = {g.name for g in prior.load()}
    kernels = {n for n in shipped if "/" not in n}  # the others are tasks of tuned networks: "source/task"
    assert kernels <= train and not kernels & bench  # the training kernels, none a benchmark kernel


@pytest.mark.skipif(not prior.applies_to(host_target()), reason="the shipped prior is for x86 hosts")
def test_prior_picks_the_first_batch_from_a_larger_random_pool():
    """The first batch is the prior's top picks of prior_pool x batch_size random samples, best first."""
    kernel = parse_kernel("matmul:M=64,N=64,K=64")
    cfg = dict(population_size=32, batch_size=6)
    ranked = Storm(kernel.mod, host_target(), trials=12, seed=3, config=StormConfig(prior=True, prior_pool=4, **cfg))
    plain = Storm(kernel.mod, host_target(), trials=12, seed=3, config=StormConfig(prior=True, prior_pool=1, **cfg))
    top, first = ranked.propose(), plain.propose()
    assert len(top) == len(first) == 6
    scores = ranked.model.predict(top)
    assert scores == sorted(scores, reverse=True)
    assert np.mean(scores) > np.mean(ranked.model.predict(first))  # a pool of 24 beats its first 6 at random
    ranked.close()
    plain.close()


@pytest.mark.parametrize("with_prior", [True, False])
def test_first_batch_is_reproducible_from_the_seed(with_prior):
    """Same seed, same first batch (random samples, ranked by the prior or not); another seed differs."""
    kernel = parse_kernel("conv2d:N=1,C=16,H=14,W=14,K=16,R=3,S=3,stride=1,pad=1")
    cfg = StormConfig(prior=with_prior, prior_pool=4, population_size=32, batch_size=8)

    def first(seed):
        storm = Storm(kernel.mod, host_target(), trials=8, seed=seed, config=cfg)
        try:
            return [c.key for c in storm.propose()]
        finally:
            storm.close()

    a, b = first(5), first(5)
    assert len(a) == 8
    assert a == b
    assert first(6) != a


def test_transfers_leave_the_storms_first_batch_to_the_prior():
    """Reuse's transfers are learnt, but the storm's first batch is still the prior's picks among
    random samples (the batch a storm without transfers draws), not an evolution from the
    transfers alone, which can keep a storm in the donor's basin."""
    import dataclasses

    from stormdrop.records import MeasureResult, Phase

    kernel = parse_kernel("matmul:M=32,N=32,K=32")
    cfg = StormConfig(population_size=16, batch_size=8, prior_pool=1)
    donor = Storm(kernel.mod, host_target(), trials=8, seed=1, config=cfg)
    transfers = [dataclasses.replace(c, phase=Phase.REUSE) for c in donor.propose()[:4]]
    donor.close()
    storm = Storm(kernel.mod, host_target(), trials=16, seed=0, config=cfg)
    storm.absorb(transfers, [MeasureResult(run_secs=(1e-6,) * 2)] * len(transfers))
    alone = Storm(kernel.mod, host_target(), trials=16, seed=0, config=cfg)
    first, drawn = storm.propose(), alone.propose()
    assert {c.key for c in first} == {c.key for c in drawn} - {c.key for c in transfers}
    storm.tell(first, [MeasureResult(run_secs=(1e-5,) * 2)] * len(first))
    assert storm.explored == len(first) and not storm._cold()  # evolution from the second batch on
    storm.close()
    alone.close()
