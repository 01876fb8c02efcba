"""Code that runs inside stormdrop's persistent measurement worker processes.

A worker imports TVM once and then serves requests over a pipe until told to
stop, so no per-batch process start or re-import is paid (MetaSchedule's
``LocalBuilder`` pays both on every ``build()`` call). Requests are tuples
``(command, payload)``; replies are ``("ok", value)`` or ``("error", message)``.
Builder workers answer ``build`` and ``reference_build``; runner workers answer ``reference``
and ``run``.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

from stormdrop.measure.reference import (
    build_reference,
    build_references,
    changed_arguments,
    packed_calls,
    reference_inputs,
)
from stormdrop.measure.tracker import RpcConfig, connect_tracker, free_devices, knock, renewal_due


def serve(conn: Any, role: str, target_json: str, rpc: RpcConfig | None) -> None:
    """Worker main loop (entry point of the child process)."""
    import logging

    import tvm  # noqa: F401  (imported once per worker; TVM_NUM_THREADS is set by the parent)

    from stormdrop.errors import one_line
    from stormdrop.target import from_canonical

    logging.disable(logging.WARNING)  # TVM's Python warnings (e.g. RPC retries) would reach the user's terminal
    target = from_canonical(target_json)
    state, setup_error = None, ""
    if role == "runner":
        try:
            state = _RunnerState(target, rpc)
        except Exception as err:  # noqa: BLE001 - e.g. no RPC tracker there: every request gets the reason
            setup_error = f"runner set-up failed: {type(err).__name__}: {one_line(err)}"
    while True:
        try:
            command, payload = conn.recv()
        except EOFError:
            return
        if command == "stop":
            return
        if setup_error:
            conn.send(("error", setup_error))
            continue
        try:
            if command == "build":
                t0 = time.perf_counter()
                value = {**_build(target, *payload), "build_s": time.perf_counter() - t0}  # this build's own time
            elif command == "reference_build":
                value = _build_reference(target, *payload)
            elif command == "reference" and state is not None:
                value = state.reference(*payload)
            elif command == "run" and state is not None:
                value = state.run(*payload)
            else:
                raise ValueError(f"unknown command {command!r} for a {role} worker")
            conn.send(("ok", value))
        except DeviceLost as err:  # the remote device is gone: a failure the next run retries
            conn.send(("lost", str(err)[-3000:]))
        except Exception as err:  # noqa: BLE001 - every failure is reported, never fatal
            msg = f"{type(err).__name__}: {err}".strip()
            conn.send(("error", msg[-3000:] or traceback.format_exc()[-3000:]))


def _build_reference(target: Any, mod_jsons: list[str], out_path: str) -> str:
    """CPU workloads' untuned builds (``reference.build_references``) as one library at ``out_path``,
    which the runner loads and runs (``_RunnerState.reference``): builders compile references side by side."""
    import tvm

    from stormdrop.tvm_compat.cross import fcompile

    mods = [tvm.ir.load_json(m) for m in mod_jsons]
    build_references(mods, target).export_library(out_path, fcompile=fcompile(target))
    return out_path


def _build(target: Any, mod_json: str, out_path: str) -> dict:
    """Build a candidate; returns ``{"timed": path, "args": [[shape, dtype]...], "pack": plan | None,
    "codegen_s": seconds}`` (``codegen_s``: ``tvm.build``'s own, what compiling the kernel into a
    model costs: the gateway's estimate of a model's compile).

    A candidate whose schedule packs its weights (MetaSchedule's ``RewriteLayout``) is cut
    the way a compiled model cuts it (``prepack.split``): the library holds ``main``, the
    kernel on packed weights, the function a model deploys, and ``pack``, the weights' layout
    rewrite, which a model runs once at compile time. The runner packs the reference
    weights with ``pack`` and checks and times ``main`` itself on them. ``plan``: the pack's
    inputs (the kernel's parameter indices) and output shapes, and where each of ``main``'s
    arguments comes from (``prepack.Split``). A candidate the cut fails on is a build error:
    a model could not deploy it either.
    """
    import contextlib

    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from stormdrop.lowering.prepack import split
    from stormdrop.tvm_compat import nvrtc as _nvrtc
    from stormdrop.tvm_compat.cross import fcompile
    from stormdrop.tvm_compat.tir_pipeline import pipeline

    def shapes(func: Any) -> list:
        return [[[int(x) for x in a.shape], str(a.dtype)] for a in ArgInfo.from_prim_func(func)]

    mod = tvm.ir.load_json(mod_json)
    # only a kernel with a layout-rewrite block is cut (RewriteLayout is a CPU postprocessor):
    # removing the block changes its parameters' shapes
    rewrites = target.kind.name == "llvm" and shapes(
        RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)["main"]) != shapes(mod["main"])
    cut = split(mod) if rewrites else None
    if rewrites and cut is None:
        raise RuntimeError("the weights' layout rewrite could not be split off the kernel, as a model would")
    t0 = time.perf_counter()
    if cut is None:
        # a CUDA library is compiled once, on the host, where the `cuda` extra's NVRTC is here: by
        # tvm.build itself on a GPU's host, else by the check (None: the GPU's runtime compiles it)
        arch = str(target.attrs.get("arch", "")) if target.kind.name == "cuda" and _nvrtc.ready() else None
        with _nvrtc.compiling(arch) if arch else contextlib.nullcontext():
            lib = tvm.build(mod, target=target, pipeline=pipeline())
            built = {"timed": out_path, "args": shapes(mod["main"]), "pack": None,
                     "codegen_s": time.perf_counter() - t0}
            if target.kind.name == "cuda":  # a source that does not compile fails here, on the host
                built["cubin_bytes"] = sum(map(len, _nvrtc.library_cubins(lib, arch).values())) if arch else None
        lib.export_library(out_path, fcompile=fcompile(target))  # (a cross linker for a foreign CPU)
        return built
    lib = tvm.build(tvm.IRModule({"main": cut.compute, "pack": cut.pack}), target=target, pipeline=pipeline())
    codegen_s = time.perf_counter() - t0
    lib.export_library(out_path, fcompile=fcompile(target))
    plan = {"inputs": list(cut.pack_inputs), "outputs": shapes(cut.pack)[len(cut.pack_inputs):],
            "args": [list(a) for a in cut.compute_args]}
    return {"timed": out_path, "args": shapes(cut.compute), "pack": plan, "codegen_s": codegen_s}


class DeviceLost(RuntimeError):
    """The RPC device cannot be reached any more (its session could not be re-opened)."""


class _RunnerState:
    """Inputs and reference outputs per workload, and the device to time on.

    On an RPC device the session is renewed before the tracker's ``session_timeout`` ends it
    (in its last fifth, or last minute), and re-opened once after a failed request, which is
    then tried again: a run longer than the session timeout, or a server restarted in between,
    stores no spurious failure. A device that cannot be reached again raises ``DeviceLost``.
    Inputs and references are kept on the host, so a new session needs nothing re-computed.
    """

    def __init__(self, target: Any, rpc: RpcConfig | None) -> None:
        import tvm

        self.target = target
        self.rpc = rpc
        self.session = None
        self.kind = "cuda" if target.kind.name == "cuda" else "cpu"
        self.session_timeout = int(rpc.session_timeout_s) if rpc else 600
        self.opened = 0.0
        if rpc:
            try:  # fail in seconds, not after TVM's 60 s of silent retries
                knock(rpc, timeout=10)
            except OSError as err:
                raise RuntimeError(f"cannot reach the RPC tracker at {rpc.host}:{rpc.port}: "
                                   f"{err.strerror or err}") from None
            self._connect()
        else:
            self.dev = tvm.cuda(0) if self.kind == "cuda" else tvm.cpu(0)
        self.inputs: dict[str, list[Any]] = {}
        self.expected: dict[str, list[Any]] = {}
        self.outputs: dict[str, list[int]] = {}
        self._reference_lib: tuple[str, Any] | None = None  # the last group of references loaded

    def _connect(self) -> None:
        rpc = self.rpc
        tracker = connect_tracker(rpc)
        if rpc.join and self.session is None and not free_devices(rpc):
            # joining mid-run: never wait in the tracker's queue
            raise RuntimeError(f"no free device under key {rpc.key} any more")
        self.session = tracker.request(rpc.key, priority=1, session_timeout=self.session_timeout)
        self.dev = self.session.device(self.kind)
        self.opened = time.monotonic()

    def _tracker_answers(self) -> bool:
        """Whether the tracker's port accepts a connection (TVM's own connect retries silently for a minute)."""
        try:
            knock(self.rpc)
            return True
        except OSError:
            return False

    def _reconnect(self, why: str) -> None:
        """A new session, tried again with doubling waits (1 s to 30 s) for up to ``rpc.retry_s``
        seconds (default 120): a tracker restarted, or a device freed, in that time is used again.
        ``DeviceLost`` if the tracker or every device under the key stays unreachable."""
        import gc

        self.session = self.dev = self._reference_lib = None  # the old session closes, its device goes back
        gc.collect()
        address = f"{self.rpc.host}:{self.rpc.port}"
        deadline = time.monotonic() + self.rpc.retry_s
        wait, tries, last = 0.0, 0, ""
        while True:
            tries += 1
            try:
                if not self._tracker_answers():
                    raise RuntimeError(f"the RPC tracker at {address} does not answer")
                # a request for a busy key waits until a device is free: ask only when one is
                if not free_devices(self.rpc):
                    raise RuntimeError(f"no free device under key {self.rpc.key} at {address}")
                self._connect()
                return
            except Exception as err:  # noqa: BLE001
                last = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[-1]}"
            wait = min(30.0, max(1.0, 2 * wait))
            if time.monotonic() + wait > deadline:
                break
            time.sleep(wait)
        raise DeviceLost(f"RPC device {self.rpc.key} lost ({why}); no new session in "
                         f"{self.rpc.retry_s:.0f} s ({tries} tries): {last}")

    def _on_device(self, request: Any, *args: Any) -> Any:
        """``request(*args)`` on a live session: renewed when due, re-opened and retried once after an error."""
        if self.session is None:
            return request(*args)
        if renewal_due(self.opened, self.session_timeout) and self._tracker_answers():
            # (with the tracker gone, the session goes on as long as it lasts; then the retries below)
            self._reconnect("session about to expire")
        try:
            return request(*args)
        except Exception as err:  # noqa: BLE001 - maybe the session, maybe the kernel: try a new session once
            self._reconnect(f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[-1]}")
            return request(*args)

    def reference(self, key: str, mod_json: str, seed: int, lib: str | None = None,
                  function: str = "main") -> list[list[Any]]:
        return self._on_device(self._reference, key, mod_json, seed, lib, function)

    def run(self, key: str, built: dict, number: int, repeat: int, min_repeat_ms: float,
            cache_flush: bool, check: bool, warmup_ms: float) -> dict:
        return self._on_device(self._run, key, built, number, repeat, min_repeat_ms, cache_flush, check, warmup_ms)

    def _reference(self, key: str, mod_json: str, seed: int, lib: str | None, function: str) -> list[list[Any]]:
        """Random inputs for ``key`` and the outputs of its untuned (or reference) build: ``function``
        of the library ``lib`` when a builder compiled it (``_build_reference``), else built here."""
        import tvm

        mod = tvm.ir.load_json(mod_json)
        arrays = reference_inputs(mod, seed)
        if lib is None:
            rt_mod, function = self._built_reference(key, mod), "main"
        elif self._reference_lib is not None and self._reference_lib[0] == lib:
            rt_mod = self._reference_lib[1]  # a group's library, loaded for an earlier workload of it
        else:
            rt_mod = self._load(lib)
            self._reference_lib = (lib, rt_mod)
        args = [tvm.runtime.tensor(a, self.dev) for a in arrays]
        rt_mod[function](*args)
        self.dev.sync()
        results = [a.numpy() for a in args]
        self.outputs[key] = changed_arguments(arrays, results)
        self.inputs[key] = arrays
        self.expected[key] = results
        return [[len(arrays)], self.outputs[key]]

    def _built_reference(self, key: str, mod: Any) -> Any:
        """``mod``'s untuned build (``reference.build_reference``), compiled here, loaded where the
        candidates run."""
        rt_mod = build_reference(mod, self.target)
        if self.session is None:
            return rt_mod
        import tempfile

        from stormdrop.tvm_compat.cross import fcompile

        with tempfile.TemporaryDirectory(prefix="stormdrop-ref-") as tmp:
            path = os.path.join(tmp, f"reference_{abs(hash(key))}.so")
            rt_mod.export_library(path, fcompile=fcompile(self.target))
            return self._load(path)

    def _load(self, artifact: str) -> Any:
        import tvm

        if self.session is not None:
            self.session.upload(artifact)
            return self.session.load_module(os.path.basename(artifact))
        return tvm.runtime.load_module(artifact)

    def _args(self, key: str, rt_mod: Any, plan: dict | None) -> tuple[list[Any], list[int]]:
        """``main``'s arguments on the device, and the kernel parameter each one is (-1: a packed
        weight): the reference inputs, their weights packed by the library's ``pack`` when it has one."""
        import numpy as np
        import tvm

        inputs = self.inputs[key]
        if plan is None:
            return [tvm.runtime.tensor(a, self.dev) for a in inputs], list(range(len(inputs)))
        pack, main, params = packed_calls(plan, len(inputs))
        packed = {len(inputs) + j: tvm.runtime.tensor(np.zeros(shape, dtype), self.dev)
                  for j, (shape, dtype) in enumerate(plan["outputs"])}

        def buffers(indices: list[int]) -> list[Any]:  # the packed weights shared, each input a fresh copy
            return [packed[i] if i in packed else tvm.runtime.tensor(inputs[i], self.dev) for i in indices]

        rt_mod["pack"](*buffers(pack))
        return buffers(main), params

    def _run(self, key: str, built: dict, number: int, repeat: int, min_repeat_ms: float,
             cache_flush: bool, check: bool, warmup_ms: float) -> dict:
        from stormdrop.measure.outputs import difference

        rt_mod = self._load(built["timed"])
        args, params = self._args(key, rt_mod, built.get("pack"))
        wrong = ""
        if check:
            rt_mod["main"](*args)
            self.dev.sync()
            for arg, i in zip(args, params):
                if i in self.outputs[key] and (wrong := difference(i, arg.numpy(), self.expected[key][i])):
                    break
        if wrong:
            return {"wrong": wrong}
        if cache_flush:  # TVM flushes once per repeat: every sample must be one cold run
            number, min_repeat_ms = 1, 0
        _warm_up(rt_mod["main"], args, self.dev, warmup_ms)
        evaluator = rt_mod.time_evaluator(
            "main", self.dev, number=int(number), repeat=int(repeat), min_repeat_ms=int(min_repeat_ms),
            f_preproc="cache_flush_cpu_non_first_arg" if cache_flush else "",
        )
        secs = [float(x) for x in evaluator(*args).results]
        if self.session is not None:
            self.session.remove(os.path.basename(built["timed"]))
        return {"run_secs": secs}


def _warm_up(func: Any, args: list, dev: Any, ms: float) -> None:
    """Run ``func`` back to back for at least ``ms`` milliseconds (at least once when ``ms`` > 0),
    each run waited for: the cores leave their idle state before the timed samples, as inside a
    model whose kernels run back to back (``MeasureConfig.warmup_ms``)."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1e3
    while True:
        func(*args)
        dev.sync()
        if time.perf_counter() >= end:
            return


def _die_with(parent: int) -> None:
    """Exit when process ``parent`` (the tuner) is gone, even while busy in a kernel: Linux's
    parent-death signal, and a thread watching the parent's pid elsewhere. Ctrl-C is the
    tuner's to handle (it stops its workers), not a traceback here."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # gone already
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def main(argv: list[str]) -> None:
    """``main([FD, ROLE, TARGET_JSON, RPC_JSON, PARENT_PID])``: a worker's entry (``workers.Worker``)."""
    from multiprocessing.connection import Connection

    fd, role, target_json, rpc_json, parent = int(argv[0]), argv[1], argv[2], argv[3], int(argv[4])
    _die_with(parent)
    serve(Connection(fd), role, target_json, RpcConfig.from_json(rpc_json))
