"""What measuring has cost so far (``MeasureCosts``): the builds' and runs' seconds and counts a
gateway tells as they end, and the estimates the budget reads from them (a candidate's build and
run, a model's compile). The warm-up (each builder's first build, the first batch's runs: the
processes start, import TVM and make the references) is kept apart and counted only until
other builds and runs are known. It measures nothing itself."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Tally:
    """Seconds spent on ``count`` pieces of one kind of work."""

    seconds: float = 0.0
    count: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.seconds += seconds
        self.count += count


@dataclass
class MeasureCosts:
    """Builds (a builder's whole build: compile, load, check, link), codegen (``tvm.build``'s own
    part of them) and runs, each with its warm-up twin (``first_*``); ``runner_restarts``: local
    runners restarted for their memory."""

    builds: Tally = field(default_factory=Tally)
    codegen: Tally = field(default_factory=Tally)
    runs: Tally = field(default_factory=Tally)
    first_builds: Tally = field(default_factory=Tally)
    first_codegen: Tally = field(default_factory=Tally)
    first_runs: Tally = field(default_factory=Tally)
    runner_restarts: int = 0

    def built(self, build_s: float, codegen_s: float, *, first: bool) -> None:
        """A build ended after ``build_s`` (``codegen_s`` of it in ``tvm.build``); ``first``: its
        builder's first."""
        (self.first_builds if first else self.builds).add(build_s)
        (self.first_codegen if first else self.codegen).add(codegen_s)

    def ran(self, seconds: float, count: int) -> None:
        """A batch's ``count`` runs took ``seconds``; the warm-up's while nothing was run before."""
        first = not (self.runs.count or self.first_runs.count)
        (self.first_runs if first else self.runs).add(seconds, count)

    def candidate_s(self) -> tuple[float, float]:
        """Wall seconds to build, and to run, one candidate: the means of the builds and runs, the
        warm-up's only while no others are known ((0, 0) before anything)."""
        return _mean(self.builds, self.first_builds), _mean(self.runs, self.first_runs)

    def mean_build_s(self, known: int) -> float | None:
        """The mean of the builds past their builders' warm-up, once at least ``known`` are known."""
        return self.builds.seconds / self.builds.count if self.builds.count >= max(1, known) else None

    def compile_s(self, kernels: int) -> float:
        """Seconds ``tvm.build`` takes for ``kernels`` kernels, from the builds' codegen."""
        return kernels * _mean(self.codegen, self.first_codegen)


def batch_s(n: int, builders: int, build_s: float, run_s: float) -> float:
    """Wall seconds to measure ``n`` candidates in one batch: ``builders`` build them side by side
    (``build_s`` each), then each is run alone (``run_s``)."""
    return -(-n // max(1, builders)) * build_s + n * run_s


def _mean(tally: Tally, warm_up: Tally) -> float:
    if tally.count:
        return tally.seconds / tally.count
    return warm_up.seconds / max(warm_up.count, 1)
