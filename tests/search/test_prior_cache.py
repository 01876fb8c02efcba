"""The prior's trained booster kept between runs (``search.prior_cache``): a later run loads what an
earlier one trained, with the same predictions and no training; a damaged file is trained over; with
the cache off nothing is written."""

from __future__ import annotations

import numpy as np
import pytest
from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum

from stormdrop.search import cost_model, prior, prior_cache
from stormdrop.target import parse_target

TARGET = parse_target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


@pytest.fixture
def groups(monkeypatch, tmp_path):
    """A small prior (20 of the shipped one's groups), no model trained on it in this process yet."""
    monkeypatch.setattr(cost_model, "_PRIOR_CACHE", {})
    monkeypatch.setenv("STORMDROP_CACHE", str(tmp_path / "cache"))
    return prior.for_target(TARGET)[:20]


def _scores(model, groups) -> np.ndarray:
    return model.booster.predict(PackSum(xs=[f for g in groups[:5] for f in g.features], ys=None).dmatrix)


def _trainings(monkeypatch) -> list[int]:
    """The trainings on the prior from now on (the sizes of their data)."""
    calls = []
    real = prior_cache.trained_booster

    def counted(model, xs, ys, train):
        def train_counted():
            calls.append(len(xs))
            return train()

        return real(model, xs, ys, train_counted)

    monkeypatch.setattr(prior_cache, "trained_booster", counted)
    return calls


def test_a_later_run_loads_the_booster_an_earlier_one_trained(monkeypatch, tmp_path, groups):
    calls = _trainings(monkeypatch)
    first = _scores(cost_model.new_xgb_model(TARGET, groups), groups)
    (kept,) = (tmp_path / "cache").glob("prior-booster-*.ubj")
    assert calls == [sum(len(g.features) for g in groups)]
    monkeypatch.setattr(cost_model, "_PRIOR_CACHE", {})  # a new process
    again = _scores(cost_model.new_xgb_model(TARGET, groups), groups)
    assert len(calls) == 1 and np.array_equal(first, again)
    monkeypatch.setattr(cost_model, "_PRIOR_CACHE", {})
    cost_model.new_xgb_model(TARGET, groups[:19])  # other data: another booster
    assert len(calls) == 2 and len(list((tmp_path / "cache").glob("prior-booster-*.ubj"))) == 2
    kept.write_bytes(b"not a booster")  # damaged: trained over, not a crash
    monkeypatch.setattr(cost_model, "_PRIOR_CACHE", {})
    assert np.array_equal(_scores(cost_model.new_xgb_model(TARGET, groups), groups), first)
    assert len(calls) == 3 and kept.read_bytes() != b"not a booster"


def test_with_the_cache_off_nothing_is_written(monkeypatch, tmp_path, groups):
    monkeypatch.setenv("STORMDROP_CACHE", "off")
    cost_model.new_xgb_model(TARGET, groups)
    assert not (tmp_path / "cache").exists()


def test_a_cache_that_cannot_be_written_costs_the_training_not_the_run(monkeypatch, tmp_path, groups):
    blocked = tmp_path / "a file"
    blocked.write_text("")
    monkeypatch.setenv("STORMDROP_CACHE", str(blocked / "cache"))  # a directory under a file: never made
    calls = _trainings(monkeypatch)
    first = _scores(cost_model.new_xgb_model(TARGET, groups), groups)
    monkeypatch.setattr(cost_model, "_PRIOR_CACHE", {})
    assert np.array_equal(_scores(cost_model.new_xgb_model(TARGET, groups), groups), first)
    assert len(calls) == 2 and blocked.read_text() == ""
