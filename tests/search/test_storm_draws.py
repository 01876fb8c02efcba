"""The storm's draws: an empty draw is drawn again before the storm ends; on a GPU the search asks
for a batch's worth of valid random schedules, not half its population."""

from __future__ import annotations

import pytest

from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import host_target, parse_target
from stormdrop.workloads import parse_kernel

CFG = StormConfig(batch_size=4, population_size=16, genetic_num_iters=1, init_min_unmeasured=8, prior=False)


class _Flaky:
    """A search whose first ``empty`` draws come back empty (too few valid samples that time)."""

    def __init__(self, search, empty: int) -> None:
        self.search, self.empty, self.calls = search, empty, 0

    def generate_measure_candidates(self):
        self.calls += 1
        return None if self.calls <= self.empty else self.search.generate_measure_candidates()


def test_an_empty_draw_is_drawn_again_and_three_in_a_row_end_the_storm(monkeypatch):
    kernel = parse_kernel("matmul:M=64,N=64,K=64")
    storm = Storm(kernel.mod, host_target(), trials=8, seed=0, config=CFG)
    real = storm._search()
    flaky = _Flaky(real, empty=2)
    monkeypatch.setattr(storm, "_search", lambda: flaky)
    batch = storm.propose()
    assert batch and len(batch) == 4 and flaky.calls == 3  # two empty draws, then a full one
    never = _Flaky(real, empty=10**6)
    monkeypatch.setattr(storm, "_search", lambda: never)
    assert storm.propose() is None and never.calls == 3 and storm.remaining == 0
    storm.close()


@pytest.mark.slow
def test_a_gpu_storm_asks_for_a_batch_of_valid_samples_a_cpu_storm_for_its_setting():
    kernel = parse_kernel("matmul:M=64,N=64,K=64")
    cfg = StormConfig(init_min_unmeasured=64, batch_size=16)
    gpu = Storm(kernel.mod, parse_target({"kind": "cuda", "arch": "sm_90"}), trials=0, seed=0, config=cfg)
    cpu = Storm(kernel.mod, host_target(), trials=0, seed=0, config=cfg)
    assert int(gpu.ctx.search_strategy.init_min_unmeasured) == 16
    assert int(cpu.ctx.search_strategy.init_min_unmeasured) == 64
