"""Leads: under a small budget's one-sample first rounds, a task that starts with no donor while
later tasks of related classes will take its schedule measures several storm samples first
(``budget.lead_batch``, ``donors.heirs``, ``TaskTuner``'s ``lead_batch``)."""

from __future__ import annotations

import pytest

from stormdrop.measure.replay import ReplayMeasurer, synthetic
from stormdrop.search.donors import heirs
from stormdrop.search.options import SearchOptions
from stormdrop.storage.database import Database
from stormdrop.target import host_target
from stormdrop.tuning.budget import Budget, lead_batch
from stormdrop.tuning.driver import drive
from stormdrop.tuning.task import TaskSession, TaskTuner
from stormdrop.workloads import parse_kernel

RELU6 = "T_add+T_maximum+T_minimum+conv2d_nhwc+pad_temp:float32"
BIAS = "T_add+conv2d_nhwc+pad_temp:float32"
DEPTHWISE = "T_add+T_maximum+T_minimum+group_conv2d_nhwc+pad_temp:float32"
DENSE = "T_add+matmul:float32"


def test_a_lead_measures_one_sample_per_heir_up_to_its_samples_and_a_batch():
    assert lead_batch(1, 7, 16, 8) == 8  # mobilenet_v2's depthwise class: 1 lead, 7 heirs
    assert lead_batch(1, 3, 16, 8) == 4  # one sample for itself and one per heir
    assert lead_batch(1, 20, 6, 8) == 6  # never more than a storm batch
    assert lead_batch(None, 7, 16, 8) is None  # full first batches: nothing changes
    assert lead_batch(1, 0, 16, 8) is None  # no heir: its one sample is only its own start
    assert lead_batch(1, 7, 16, 1) is None  # lead_samples=1: off
    assert lead_batch(8, 7, 16, 8) is None  # a first batch as large already


def test_heirs_are_the_other_tasks_whose_class_can_take_a_tasks_schedule():
    classes = [RELU6, DEPTHWISE, BIAS, DEPTHWISE, DENSE, RELU6]
    # a conv + bias + ReLU6 hands on to the other one and to conv + bias (its epilogues left out);
    # conv + bias to both conv + bias + ReLU6 (epilogues inlined first); depthwise to depthwise only
    assert heirs(classes) == [2, 1, 2, 1, 0, 2]


def _drive(db, lead):
    """Two same-class matmuls (the first a lead where ``lead``), a cap of one trial a task's first
    round: their tallies after a budget of 8 trials."""
    target = host_target()
    measurer = ReplayMeasurer(synthetic(seed=11))
    specs = ("matmul:M=32,N=48,K=64", "matmul:M=64,N=32,K=32")
    sessions = [TaskSession(db, measurer, parse_kernel(s), target, seed=0) for s in specs]
    tuners = [TaskTuner(s, trials=1, exploit_trials=7, search=SearchOptions(), first_batch=1, lead_batch=lead)
              for s in sessions]
    assert drive(tuners, sessions, [1, 1], Budget(trials=8), seed=0) == "the trial budget"
    return [s.tally() for s in sessions], tuners


@pytest.mark.parametrize("lead", [None, 4])
def test_a_lead_measures_its_samples_first_and_its_heir_starts_from_its_best(tmp_path, lead):
    with Database(tmp_path / "l.db") as db:
        (first, second), tuners = _drive(db, lead)
    assert first["storm"] == (4 if lead else 1), first  # no donor: the lead's storm samples
    assert (second["reuse"], second["storm"]) == (1, 0), second  # a donor: one transfer, no storm
    assert tuners[0].leading == bool(lead) and not tuners[1].leading
    assert first["storm"] + first["raindrop"] + second["reuse"] + second["raindrop"] == 8
