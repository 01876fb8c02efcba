"""Kernels timed inside the model (``model.run.kernel_times``): the model runs uninstrumented first."""

from __future__ import annotations

import time

from stormdrop.model import run as model_run


class FakeVM:
    """A model of two kernels: each run calls them through the instrument once it is set."""

    def __init__(self):
        self.instrument = None
        self.plain_runs: list[float] = []  # when each run without the instrument started
        self.timed_runs = 0
        self.instrument_set_at: float | None = None

    def set_instrument(self, fn):
        self.instrument = fn
        self.instrument_set_at = time.perf_counter()

    def __getitem__(self, name):
        assert name == "main"
        return self.run

    def run(self, *args):
        if self.instrument is None:
            self.plain_runs.append(time.perf_counter())
            return
        self.timed_runs += 1
        for symbol, secs in (("fused_conv2d", 0.002), ("vm.builtin.alloc", 0.0), ("dense_prepacked", 0.001)):
            self.instrument(None, symbol, True, None)
            time.sleep(secs)
            self.instrument(None, symbol, False, None)


def test_kernels_are_timed_after_the_model_ran_uninstrumented_for_the_warm_up(monkeypatch):
    vm = FakeVM()
    monkeypatch.setattr(model_run, "_vm", lambda ex, inputs, target: (vm, None, []))
    monkeypatch.setattr(model_run, "WARM_UP_S", 0.05)
    started = time.perf_counter()
    times = model_run.kernel_times(None, {}, None, runs=4)
    # the warm-up: plain runs until WARM_UP_S had passed, all of them before the instrument
    assert vm.plain_runs and vm.instrument_set_at is not None
    assert vm.instrument_set_at - started >= 0.05
    assert max(vm.plain_runs) < vm.instrument_set_at
    # then the counted runs (and one more, not counted), each kernel's median of its calls
    assert vm.timed_runs == 5
    assert set(times) == {"fused_conv2d", "dense_prepacked"}  # VM builtins are not kernels
    assert 0.002 <= times["fused_conv2d"] < 0.02 and 0.001 <= times["dense_prepacked"] < 0.02
