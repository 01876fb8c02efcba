"""The in-model choice: each task deploys the candidate fastest inside the compiled model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stormdrop.model import choice as model_choice
from stormdrop.model import run as model_run
from stormdrop.model.choice import Deployable, choose
from stormdrop.model.tune import ranked_candidates
from stormdrop.storage.database import candidate_key
from stormdrop.tuning.budget import model_compiles


def cands(n):
    return [Deployable(f"trace{i}", 1e-5 * (1 + i / 10), f"key{i}") for i in range(n)]


@pytest.fixture
def fake_timing(monkeypatch):
    """Kernel and model times looked up by build: a build is the tuple of its picks."""
    kernel = {}  # (picks, kernel name) -> secs
    model = {}  # picks -> secs
    calls = {"kernel": 0}

    def kernel_times(ex, inputs, target, runs=20):
        calls["kernel"] += 1
        return {name: secs for (picks, name), secs in kernel.items() if picks == ex}

    monkeypatch.setattr(model_run, "kernel_times", kernel_times)
    monkeypatch.setattr(model_choice, "model_timer", lambda ex, inputs, target: lambda: model[ex])
    return kernel, model, calls


def test_each_task_takes_its_fastest_candidate_in_place(fake_timing):
    kernel, model, calls = fake_timing
    names = ["conv", "dense", "mean"]
    ranked = [cands(3), cands(3), cands(1)]
    # rank 0 build (0,0,0), rank 1 (1,1,0), rank 2 (2,2,0): conv is fastest at rank 2, dense at rank 0;
    # the prepacked kernel's symbol counts for its task
    for picks, conv, dense in [((0, 0, 0), 30e-6, 10e-6), ((1, 1, 0), 25e-6, 12e-6), ((2, 2, 0), 20e-6, 11e-6)]:
        kernel[picks, "conv_prepacked"], kernel[picks, "dense"], kernel[picks, "mean"] = conv, dense, 1e-6
    model[(0, 0, 0)], model[(2, 0, 0)] = 50e-6, 40e-6
    built = []
    choice = choose(names, ranked, lambda picks: built.append(tuple(picks)) or tuple(picks), {}, None, rounds=2)
    assert choice.picks == [2, 0, 0] and choice.changed == 1
    assert choice.executable == (2, 0, 0) and choice.best_s == 50e-6 and choice.chosen_s == 40e-6
    assert built == [(0, 0, 0), (1, 1, 0), (2, 2, 0), (2, 0, 0)]  # one build per rank, one of the choice
    assert calls["kernel"] == 3 * 3  # every rank's build timed in a warm-up round and in each of the 2 rounds


def test_a_choice_slower_as_a_whole_model_is_not_deployed(fake_timing):
    kernel, model, _ = fake_timing
    kernel[(0,), "conv"], kernel[(1,), "conv"] = 30e-6, 20e-6
    model[(0,)], model[(1,)] = 50e-6, 55e-6  # the kernel alone looked faster, the model runs slower
    choice = choose(["conv"], [cands(2)], tuple, {}, None)
    assert choice.picks == [0] and choice.executable == (0,)
    assert choice.best_s == 50e-6 and choice.chosen_s == 55e-6


def test_one_candidate_each_compiles_once_and_times_nothing(fake_timing):
    _, _, calls = fake_timing
    built = []
    choice = choose(["a", "b"], [cands(1), []], lambda p: built.append(p) or "ex", {}, None)
    assert choice.picks == [0, 0] and choice.executable == "ex" and choice.chosen_s is None
    assert built == [[0, 0]] and calls["kernel"] == 0
    assert model_compiles(1) == 1 and model_compiles(3) == 4


def test_records_that_failed_verification_are_never_candidates():
    """verify_bests fell back past the two best records (they failed their check): the candidates
    are the verified record, then only records ranked after it."""
    records = [SimpleNamespace(trace_json=f"t{i}", mean=1e-5 * (i + 1), candidate_key=candidate_key(f"t{i}"),
                               record_id=i + 1) for i in range(6)]
    stored = list(records)
    db = SimpleNamespace(best=lambda wid, target, k: stored[:k],
                         lookup=lambda wid, target, key: next(r for r in records if r.candidate_key == key))
    session = SimpleNamespace(db=db, entry=SimpleNamespace(workload_id=1), target_key="llvm",
                              result=SimpleNamespace(trace_json="t2", latency_s=3.3e-5, fallbacks=2))
    got = ranked_candidates(session, 3)
    assert [c.trace_json for c in got] == ["t2", "t3", "t4"]
    stored[:] = records[2:]  # verify_bests stored the two as failed: no longer bests, the same candidates
    assert [c.trace_json for c in ranked_candidates(session, 3)] == ["t2", "t3", "t4"]
    assert got[0].latency_s == 3.3e-5  # the verified record's re-measured time
    assert [c.trace_json for c in ranked_candidates(session, 1)] == ["t2"]
    session.result.trace_json = None  # no valid schedule: nothing to deploy
    assert ranked_candidates(session, 3) == []
