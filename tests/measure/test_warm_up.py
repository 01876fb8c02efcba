"""Warm-up runs: each candidate runs untimed, back to back, before its timed samples."""

from __future__ import annotations

import time

from stormdrop.measure import _worker
from stormdrop.measure.gateway import Gateway, MeasureConfig
from stormdrop.target import host_target
from stormdrop.workloads import parse_kernel


class _Device:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def sync(self) -> None:
        self.calls.append("sync")


def test_the_warm_up_runs_back_to_back_for_its_time_each_run_waited_for():
    calls: list[str] = []
    t0 = time.perf_counter()
    _worker._warm_up(lambda *a: calls.append(f"run{a}"), [1, 2], _Device(calls), 30.0)
    assert time.perf_counter() - t0 >= 0.030
    assert len(calls) >= 2 and calls[0] == "run(1, 2)"
    assert calls == ["run(1, 2)", "sync"] * (len(calls) // 2)  # each run waited for before the next


def test_a_warm_up_shorter_than_one_run_is_one_run_and_none_is_none():
    calls: list[str] = []
    _worker._warm_up(lambda *a: time.sleep(0.01) or calls.append("run"), [], _Device(calls), 1.0)
    assert calls == ["run", "sync"]
    calls.clear()
    _worker._warm_up(lambda *a: calls.append("run"), [], _Device(calls), 0.0)
    assert calls == []


def test_the_gateway_runs_each_candidate_for_its_warm_up_before_timing_it():
    # A run's wall seconds include the runner's own overhead, which a loaded machine stretches
    # (more than half a second a candidate on a busy 2-core CI): the warm-up is long enough that
    # a bound holds whatever the load, and a batch of three tells once-a-candidate from once-a-batch.
    kernel = parse_kernel("matmul:M=64,N=64,K=64")
    run_s = {}
    for ms in (0.0, 1500.0):
        with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1, warmup_ms=ms)) as gw:
            gw.prepare("mm", kernel.mod)
            gw.measure("mm", [kernel.mod])  # the runner's start-up and reference: the costs' first batch
            results = gw.measure("mm", [kernel.mod] * 3)
            assert all(r.ok and len(r.run_secs) == 2 for r in results)
            run_s[ms] = gw.costs.runs.seconds / gw.costs.runs.count
    assert run_s[1500.0] >= 1.5  # every candidate, not once a batch (that would be 0.5 s each)
    assert run_s[0.0] < 1.0
    assert MeasureConfig().warmup_ms == 0  # off by default: RESULTS "Warm-up runs"
