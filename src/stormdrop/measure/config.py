"""How the measurement gateway times candidates (``MeasureConfig``): samples, timeouts, cache
flushing, builders and RPC devices, and when a slow build is given up."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tvm.target import Target

from stormdrop.measure.tracker import RpcConfig

SLOW_BUILD_AFTER = 4  # warm builds known before a build is cut short at a multiple of their mean


@dataclass(frozen=True)
class MeasureConfig:
    """How candidates are timed. ``repeat`` samples feed the raindrop's t-test.

    ``cache_flush``: every sample one run after the CPU caches were flushed of the kernel's
    weights and output (its input stays: a model's previous kernel just wrote it), as a kernel
    runs inside a model, where the other kernels' weights have evicted its own; None: on for a
    model's tasks on a CPU, off for a kernel tuned alone (``for_models``). ``warm_streams``: a kernel
    that streams its weights (``streaming``, a classifier's product for one row) is timed warm
    all the same (RESULTS, "Weight-streaming kernels timed warm, with one-row register tiles"):
    one of at most ``stream_flops_per_weight`` FLOPs per weight element.

    ``warmup_ms``: each candidate first runs back to back for this long, untimed, so that its
    samples are taken with the cores busy, as inside a model that runs its kernels back to back,
    not from idle (0: off, the default: in RESULTS' A/B the candidates it cost outweighed the
    steadier timing, "Warm-up runs").

    ``build_timeout_s``: no build runs longer. A warm builder's candidate build is given up sooner,
    after ``slow_build_factor`` times this gateway's mean build, at least ``slow_build_floor_s``,
    once ``SLOW_BUILD_AFTER`` builds are known (``build_limit_s``): LLVM's backend takes a hundred
    times a typical build on some nests (a reduction unrolled over wide vectors of an odd width,
    which the same workload at other tiles builds in a tenth of a second), and a batch waits for
    its slowest build before anything is timed. Such a candidate is a ``BUILD_TIMEOUT``; a model
    compiled from it would pay that build too."""

    number: int = 1
    repeat: int = 5
    min_repeat_ms: float = 20.0
    cache_flush: bool | None = None
    warm_streams: bool = True
    stream_flops_per_weight: float = 4.0  # each weight feeds at most two output rows' multiply-adds
    warmup_ms: float = 0.0
    build_timeout_s: float = 60.0
    slow_build_factor: float = 10.0
    slow_build_floor_s: float = 5.0
    run_timeout_s: float = 30.0
    check_correctness: bool = True
    builders: int = 0  # 0: one per physical core
    rpc: RpcConfig | None = None  # time on the devices under an RPC tracker's key
    rpc_devices: int = 0  # RPC: time on this many devices at once (0: every device free under the key)
    runner_memory_mb: float = 0.0  # a local runner grown past this is restarted (0: memory.runner_memory_limit_mb)

    @property
    def device_timeout_s(self) -> float:
        """How long one timing may go unanswered before it counts as hung: ``run_timeout_s``, and on
        an RPC device the time a lost session is tried again (``rpc.retry_s``) more, so that a
        restarted tracker or server costs a wait, not a stored timeout."""
        return self.run_timeout_s + (self.rpc.retry_s + 30.0 if self.rpc else 0.0)

    def build_limit_s(self, mean_build_s: float | None) -> float:
        """How long a candidate's build on a warm builder may take, given the mean of the builds
        known so far (None: too few known: ``build_timeout_s``)."""
        if mean_build_s is None:
            return self.build_timeout_s
        return min(self.build_timeout_s, max(self.slow_build_floor_s, self.slow_build_factor * mean_build_s))

    def for_models(self, target: Target) -> MeasureConfig:
        """This config for a model's tasks: caches flushed on a CPU unless said otherwise. Timed warm,
        a kernel finds its weights in cache and the search prefers schedules that lose inside the
        model (RESULTS "Cache flush": A/Bs of whole models tuned warm and cold)."""
        on = target.kind.name != "cuda" if self.cache_flush is None else self.cache_flush
        return dataclasses.replace(self, cache_flush=on)

    def for_kernels(self) -> MeasureConfig:
        """This config for a kernel tuned alone: warm unless said otherwise."""
        return dataclasses.replace(self, cache_flush=bool(self.cache_flush))
