"""The measurement gateway: the one place where candidates are built and run.

Builder workers (one per physical core) compile candidates in parallel; one
runner worker times them, alone on the machine, after checking each output
against the reference computed once per workload by the untuned build. Workers
are persistent processes (TVM imported once); a crash or hang of a candidate
kills only its worker, which is restarted, and becomes a typed failure.

Builds and runs are not overlapped: on a machine with few cores a compilation
running beside a timing distorts the timing. On RPC devices (``MeasureConfig.rpc``)
one runner a free device times candidates at once; a device lost for good hands its
candidate to the others, and the run stops with one error line when none is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any

import tvm
from tvm.target import Target

from stormdrop import stop
from stormdrop.errors import MeasureError, one_line
from stormdrop.measure.config import SLOW_BUILD_AFTER, MeasureConfig
from stormdrop.measure.costs import MeasureCosts, batch_s
from stormdrop.measure.memory import process_rss_mb, runner_memory_limit_mb
from stormdrop.measure.reference import reference_function, reference_groups
from stormdrop.measure.streaming import streams_weights
from stormdrop.measure.timing_lock import timing
from stormdrop.measure.tracker import devices_to_start, free_devices
from stormdrop.measure.workers import DeviceGone, Runner, Worker
from stormdrop.records import ErrorKind, MeasureResult
from stormdrop.target import canonical, physical_cores

log = logging.getLogger("stormdrop")

class Gateway:
    """Builds and runs candidates for one target; see the module docstring."""

    def __init__(self, target: Target, config: MeasureConfig | None = None) -> None:
        self.target = target
        self.config = config or MeasureConfig()
        tjson = canonical(target)
        n = self.config.builders or physical_cores()
        self._builders = [Worker("builder", tjson, None) for _ in range(max(1, n))]
        devices = 1 if self.config.rpc is None else devices_to_start(self.config.rpc, self.config.rpc_devices)
        self._runners = [Runner(Worker("runner", tjson, self.config.rpc)) for _ in range(devices)]
        self._looked = time.monotonic()  # when the tracker was last asked for free devices
        self._workdir = tempfile.mkdtemp(prefix="stormdrop-")
        self._workloads: dict[str, tuple[str, int]] = {}
        self._warm: set[str] = set()  # keys timed warm under cache_flush: they stream their weights
        self._counter = 0
        self.costs = MeasureCosts()  # the builds' own seconds (no start-up, no queue), the runs'
        for w in (*self._builders, *(r.worker for r in self._runners)):
            w.start()  # start importing TVM in the background right away

    def prepare(self, key: str, workload: tvm.IRModule, seed: int = 0) -> None:
        """Take a workload (once per key): its inputs and reference outputs are made before its
        first candidate is timed, or by ``make_references``. One that streams its weights is timed
        warm even where the config flushes the caches (``streaming``)."""
        if key not in self._workloads and self.config.cache_flush and self.config.warm_streams \
                and streams_weights(workload, self.config.stream_flops_per_weight):
            self._warm.add(key)
        self._workloads.setdefault(key, (tvm.ir.save_json(workload), seed))

    def make_references(self, keys: Sequence[str] | None = None) -> None:
        """Inputs and reference outputs of these prepared workloads (default: every one) on the
        first runner, where it holds none yet. On a CPU the builders compile the untuned builds
        side by side and the runner loads and runs each (compiling them one after another in the
        runner was most of a many-task model's set-up); one that fails there is compiled by the
        runner itself, which then says why it cannot (``MeasureError``)."""
        runner, timeout = self._runners[0], self.config.device_timeout_s
        todo = [k for k in dict.fromkeys(self._workloads if keys is None else keys) if not runner.holds(k)]
        libs: dict[str, tuple[str, str]] = {}  # key -> (its group's library, its function there)
        if self.target.kind.name == "llvm" and len(todo) > 1:
            groups = [[todo[i] for i in g] for g in reference_groups(len(todo), len(self._builders))]

            def request(job: int) -> tuple[str, tuple]:
                self._counter += 1
                return "reference_build", ([self._workloads[k][0] for k in groups[job]],
                                           os.path.join(self._workdir, f"reference{self._counter}.so"))

            def done(job: int, status: str, value: Any, worker: Worker) -> None:
                worker.jobs += 1  # (its first job paid the process's warm-up)
                if status == "ok":
                    libs.update((k, (value, reference_function(i))) for i, k in enumerate(groups[job]))

            self._on_builders(len(groups), request, done, lambda worker: self.config.build_timeout_s)
        try:
            for key in todo:
                lib = libs.get(key)
                try:
                    runner.ensure_reference(key, self._workloads[key], timeout, lib)
                except DeviceGone:
                    raise
                except MeasureError:
                    if lib is None:
                        raise
                    runner.ensure_reference(key, self._workloads[key], timeout)
        finally:
            for path in {path for path, _ in libs.values()}:
                with contextlib.suppress(OSError):
                    os.remove(path)

    def measure(self, key: str | Sequence[str], mods: list[tvm.IRModule],
                on_result: Callable[[int, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Build all ``mods`` (scheduled versions of workload ``key``, or of one key each: several
        tasks' candidates share the builders), then time each.

        ``on_result(i, result)`` hears each result as soon as it is known (a build failure as
        its build ends, each run as it ends), so a caller can commit it at once: a kill then
        loses only the candidates still in flight, not the whole batch.
        """
        keys = [key] * len(mods) if isinstance(key, str) else list(key)
        self._join_free_devices()  # before the builds: a new runner starts up meanwhile
        self.make_references(keys)
        built = self._build_all(mods, on_result)
        t1 = time.monotonic()
        results: list[MeasureResult | None] = [b if isinstance(b, MeasureResult) else None for b in built]
        try:
            if len(self._runners) == 1:
                for i, b in enumerate(built):
                    if results[i] is None:
                        stop.check()
                        results[i] = self._run(keys[i], b)
                        if on_result is not None:
                            on_result(i, results[i])
            else:
                self._run_parallel(keys, built, results, on_result)
        finally:
            self.costs.ran(time.monotonic() - t1, sum(r is not None for r in results))
        return results  # type: ignore[return-value]

    def _join_free_devices(self) -> None:
        """RPC: devices free under the key since the last look (a server started, or back) join the
        run, one runner each, up to ``rpc_devices``; the tracker is asked at most every
        ``rpc.join_every_s`` seconds."""
        rpc, cap = self.config.rpc, self.config.rpc_devices
        if rpc is None or time.monotonic() - self._looked < rpc.join_every_s:
            return
        self._looked = time.monotonic()
        room = free_devices(rpc) or 0
        if cap > 0:
            room = min(room, cap - len(self._runners))
        for _ in range(max(0, room)):
            runner = Runner(Worker("runner", canonical(self.target), dataclasses.replace(rpc, join=True)), joined=True)
            runner.worker.start()
            self._runners.append(runner)
        if room > 0:
            log.info("%d more RPC device(s) under %s joined: %d timing", room, rpc.key, len(self._runners))

    @property
    def builders(self) -> int:
        """Candidates built side by side (a batch of fewer leaves builders idle)."""
        return len(self._builders)

    def candidate_s(self) -> tuple[float, float]:
        """Wall seconds to build, and to run, one candidate measured alone, from what this gateway
        measured so far ((0, 0) before anything): a build as its builder timed it (a batch's wall
        time counts the builders' start-up, many times a small kernel's build), each builder's first
        build and the first batch's runs only until others are measured (they pay the processes'
        warm-up: counted as a typical candidate, a short budget kept more for verifying and compiling
        than it had)."""
        return self.costs.candidate_s()

    def batch_s(self, n: int) -> float:
        """Wall seconds to measure ``n`` candidates in one batch (``candidate_s``): the builders
        build them side by side, then each is timed alone."""
        return batch_s(n, len(self._builders), *self.candidate_s())

    def compile_s(self, kernels: int) -> float:
        """Seconds to compile ``kernels`` kernels into a model: ``tvm.build``'s own time of a
        candidate, as the builders timed it (a builder's build also loads, checks and links
        its candidate: about twice the time a model's compile spends on it)."""
        return self.costs.compile_s(kernels)

    def _build_all(self, mods: list[tvm.IRModule],
                   on_failure: Callable[[int, MeasureResult], None] | None = None) -> list[dict | MeasureResult]:
        """Every module built (a library's paths) or its failure, told to ``on_failure`` as it ends."""
        out: list[dict | MeasureResult] = [MeasureResult.failure(ErrorKind.BUILD_ERROR, "not built")] * len(mods)

        def request(job: int) -> tuple[str, tuple]:
            self._counter += 1
            return "build", (tvm.ir.save_json(mods[job]), os.path.join(self._workdir, f"cand{self._counter}.so"))

        def done(job: int, status: str, value: Any, worker: Worker) -> None:
            if status == "ok":
                out[job] = value
                self.costs.built(float(value.get("build_s", 0.0)), float(value.get("codegen_s", 0.0)),
                                 first=not worker.jobs)
                worker.jobs += 1
                return
            kinds = {"crash": ErrorKind.BUILDER_CRASH, "timeout": ErrorKind.BUILD_TIMEOUT}
            out[job] = MeasureResult.failure(kinds.get(status, ErrorKind.BUILD_ERROR), str(value))
            if on_failure is not None:
                on_failure(job, out[job])

        def limit(worker: Worker) -> float:  # a builder's first build also imports TVM: never cut short
            mean = self.costs.mean_build_s(SLOW_BUILD_AFTER)
            return self.config.build_limit_s(mean if worker.jobs else None)

        self._on_builders(len(mods), request, done, limit)
        return out

    def _on_builders(self, jobs: int, request: Callable[[int], tuple[str, tuple]],
                     done: Callable[[int, str, Any, Worker], None], limit: Callable[[Worker], float]) -> None:
        """Jobs ``0 .. jobs - 1`` side by side on the builders: each free builder is sent the next
        job's ``request(job)`` (a command and its payload), and ``done(job, status, value, worker)``
        hears each answer as it comes (status "timeout": the builder killed, its job past
        ``limit(worker)`` seconds, as the job was sent)."""
        pending = list(range(jobs))
        busy: dict[int, tuple[Worker, int, float]] = {}  # id(conn) -> (worker, job, its limit)
        idle = list(self._builders)
        while pending or busy:
            stop.check()  # a stop asked for while TVM ran Python code may have been swallowed there
            while pending and idle:
                job = pending.pop(0)
                worker = idle.pop()
                worker.ensure()  # (a builder killed before starts again here: its next job is its first)
                seconds = limit(worker)
                worker.send(*request(job))
                busy[id(worker.conn)] = (worker, job, seconds)
            ready = wait([w.conn for w, _, _ in busy.values()], timeout=0.5)
            now = time.monotonic()
            for conn in ready:
                worker, job, _ = busy.pop(id(conn))
                status, value = worker.receive()
                idle.append(worker)
                done(job, status, value, worker)
            for cid, (worker, job, seconds) in list(busy.items()):
                if now - worker.started_at > seconds:
                    worker.kill()
                    busy.pop(cid)
                    idle.append(worker)
                    done(job, "timeout", f"build exceeded {seconds:.3g} s", worker)

    def _run_payload(self, key: str, built: dict) -> tuple:
        cfg = self.config
        cold = bool(cfg.cache_flush) and key not in self._warm
        return (key, built, cfg.number, cfg.repeat, cfg.min_repeat_ms, cold, cfg.check_correctness, cfg.warmup_ms)

    def _run(self, key: str, built: dict) -> MeasureResult:
        cfg, runner = self.config, self._runners[0]
        runner.ensure_reference(key, self._workloads[key], cfg.device_timeout_s)
        # a local device is shared with every other stormdrop process on this machine: one timing at a time
        with timing() if cfg.rpc is None else contextlib.nullcontext():
            status, value = runner.worker.call("run", self._run_payload(key, built), timeout=cfg.device_timeout_s)
        if status == "lost":  # no device left to time on: stop here, everything measured is committed
            raise MeasureError(one_line(value))
        self._recycle_if_grown(runner)
        return self._result(status, value, built)

    def _recycle_if_grown(self, runner: Runner) -> None:
        """Restart a local runner that has grown past its memory limit (candidate libraries leak
        memory in TVM, see ``tvm_compat.runtime``); its inputs and references are made again on the next run."""
        proc = runner.worker.proc
        if self.config.rpc is not None or proc is None:
            return
        limit = self.config.runner_memory_mb or runner_memory_limit_mb()
        rss = process_rss_mb(proc.pid)
        if rss > limit:
            log.info("runner process at %.0f MB (limit %.0f MB): restarting it", rss, limit)
            runner.worker.stop()
            self.costs.runner_restarts += 1

    def _run_parallel(self, keys: list[str], built: list, results: list,
                      on_result: Callable[[int, MeasureResult], None] | None) -> None:
        """Time on every RPC device at once: each idle device takes the next candidate."""
        pending = [i for i, r in enumerate(results) if r is None]
        idle, busy = list(self._runners), {}  # id(conn) -> (runner, job)
        timeout = self.config.device_timeout_s
        while pending or busy:
            stop.check()
            done = []
            while pending and idle:
                runner, job = idle.pop(), pending.pop(0)
                try:
                    runner.ensure_reference(keys[job], self._workloads[keys[job]], timeout)
                except DeviceGone as err:
                    done.append((runner, job, "lost", str(err)))
                    continue
                runner.worker.send("run", self._run_payload(keys[job], built[job]))
                busy[id(runner.worker.conn)] = (runner, job)
            for conn in wait([r.worker.conn for r, _ in busy.values()], timeout=0.5):
                runner, job = busy.pop(id(conn))
                done.append((runner, job, *runner.worker.receive()))
            now = time.monotonic()
            for cid, (runner, job) in list(busy.items()):
                if now - runner.worker.started_at > timeout:
                    runner.worker.kill()
                    busy.pop(cid)
                    done.append((runner, job, "timeout", f"no answer within {timeout:.0f} s"))
            for runner, job, status, value in done:
                if status == "lost":  # that device is gone: its candidate goes to the others
                    self._runners.remove(runner)
                    runner.worker.kill()
                    pending.insert(0, job)
                    if not self._runners:  # the run stops with this one line; everything measured is committed
                        raise MeasureError(one_line(value))
                    log.warning("%s; %d device(s) left", one_line(value), len(self._runners))
                    continue
                results[job] = self._result(status, value, built[job])
                idle.append(runner)
                if on_result is not None:
                    on_result(job, results[job])

    def _result(self, status: str, value: Any, built: dict) -> MeasureResult:
        try:
            os.remove(built["timed"])
        except OSError:
            pass
        if status == "timeout":
            return MeasureResult.failure(ErrorKind.RUN_TIMEOUT, str(value))
        if status == "crash":  # the timing process died
            return MeasureResult.failure(ErrorKind.RUNNER_CRASH, str(value))
        if status != "ok":
            return MeasureResult.failure(ErrorKind.RUN_ERROR, str(value))
        if "wrong" in value:
            return MeasureResult.failure(ErrorKind.WRONG_RESULT, value["wrong"])
        return MeasureResult(run_secs=tuple(value["run_secs"]))

    def close(self) -> None:
        workers = (*self._builders, *(r.worker for r in self._runners))
        for w in workers:  # all exit at once, then each is waited for (or killed)
            w.ask_to_stop()
        for w in workers:
            w.stop()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
