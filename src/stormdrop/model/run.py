"""Compile a model with tuned records, run it on the Relax VM, and run the references.

Shared by ``tune --model`` (compile and verify after tuning) and ``bench --model``
(side by side: untuned TVM, tuned TVM, and the runtimes of ``runtimes``: ONNX Runtime,
OpenVINO, PyTorch, on the same inputs). Every runtime is timed on the target's cores: TVM
through ``TVM_NUM_THREADS`` (set before the first kernel runs), the others through their own
thread settings.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm.s_tir.meta_schedule as ms
from tvm import relax
from tvm.target import Target

from stormdrop.measure.timing_lock import timing
from stormdrop.measure.tracker import RpcConfig
from stormdrop.model.runtimes import onnxruntime_timer, openvino_timer
from stormdrop.target import num_cores
from stormdrop.tvm_compat.relax_passes import fold_weight_prepacks
from stormdrop.tvm_compat.runtime import runtime_threads_env
from stormdrop.tvm_compat.tir_pipeline import pipeline
from stormdrop.tvm_compat.trace_json import schedule_from_trace_json
from stormdrop.workloads.models import Model


def random_inputs(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in model.inputs.items():
        if dtype.startswith(("int", "uint")):
            out[name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out


def commit_best(mdb: ms.database.Database, mod: tvm.IRModule, trace_json: str, latency_s: float,
                target: Target) -> None:
    """Put one tuned schedule of ``mod`` into a MetaSchedule database."""
    wl = mdb.commit_workload(mod)
    sch = schedule_from_trace_json(mod, trace_json)
    mdb.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, wl, [latency_s], target, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def prepack_weights(target: Target) -> bool:
    """Whether weights are packed at compile time for this target (CPU: yes, as MetaSchedule's
    ``static_shape_tuning_pipeline(cpu_weight_prepack=True)`` does)."""
    return target.kind.name == "llvm"


def apply_records(fused: tvm.IRModule, mdb: Any, target: Target) -> tvm.IRModule:
    """The fused module with the database's schedules applied, ready for ``tvm.compile``.

    On CPU, tasks' weights are layout-free (``extract_tasks``): a tuned schedule may
    rewrite a weight's layout (MetaSchedule's RewriteLayout). The rewrite is split off
    each kernel into its own function and, the weights being constants, folded away
    at compile time, so the deployed model reads pre-packed weights
    (``layout.weight_transforms`` of the result is 0).
    """
    with target, mdb, tvm.transform.PassContext(opt_level=3):
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(fused)
        if prepack_weights(target):
            mod = relax.transform.SplitLayoutRewritePreproc()(mod)
            mod = relax.transform.FoldConstant()(fold_weight_prepacks(mod))
    return mod


def compile_model(fused: tvm.IRModule, mdb: Any, target: Target, tir_pipeline: str | None = None) -> Any:
    """Compile the fused module with the database's schedules (``apply_records``), its kernels
    lowered as the builders lower candidates (``tvm_compat.tir_pipeline``; ``tir_pipeline``:
    another TIR pipeline by name, ``"default"`` for TVM's own)."""
    return tvm.compile(apply_records(fused, mdb, target), target=target, tir_pipeline=tir_pipeline or pipeline())


_SESSIONS: dict[tuple, tuple[Any, float]] = {}  # per device key: the process's RPC session, when opened


def _remote(rpc: RpcConfig, fresh: bool = False) -> Any:
    """The process's RPC session to a device under ``rpc``'s key, for model runs: a new one when
    ``fresh`` (``_on_remote``: after an error, or when the tracker's session timeout is near). The
    old session is closed first: its device goes back to the tracker (with one device under the
    key, a request while holding it waits until the old session times out); ``_on_remote`` lets go
    of the model loaded on it before asking."""
    import gc

    key = _key(rpc)
    if key in _SESSIONS and not fresh:
        return _SESSIONS[key][0]
    if _SESSIONS.pop(key, None) is not None:
        gc.collect()  # the old session's last reference is gone: it closes
    from stormdrop.measure.tracker import connect_tracker

    tracker = connect_tracker(rpc)
    _SESSIONS[key] = (tracker.request(rpc.key, priority=1, session_timeout=int(rpc.session_timeout_s)),
                      time.monotonic())
    return _SESSIONS[key][0]


def _key(rpc: RpcConfig) -> tuple:
    return rpc.host, rpc.port, rpc.key


def _renewal_due(rpc: RpcConfig) -> bool:
    """Whether the process's session under ``rpc``'s key is in its last fifth (or minute)."""
    from stormdrop.measure.tracker import renewal_due

    opened = _SESSIONS.get(_key(rpc), (None, None))[1]
    return opened is not None and renewal_due(opened, rpc.session_timeout_s)


def _on_remote(rpc: RpcConfig, ex: Any, inputs: dict[str, np.ndarray], target: Target,
               use: Callable[[Any, Any, list], Any], state: dict | None = None) -> Any:
    """``use(vm, dev, args)`` with the model loaded on the RPC device: on the live session (renewed
    when due; the model uploaded again to a new one), tried once more on a new session after an
    error. ``state`` keeps the loaded model between calls (a timer's samples)."""
    state = {} if state is None else state
    for attempt in (0, 1):
        due = _renewal_due(rpc)  # (its last fifth, or last minute, as the measurement runners renew theirs)
        if due:
            state.clear()  # the model loaded there holds the old session: let go, so it closes first
        session = _remote(rpc, fresh=attempt == 1 or due)
        try:
            if state.get("session") is not session:
                state.clear()
                state.update(session=session, loaded=_vm(ex, inputs, target, session=session))
            return use(*state["loaded"])
        except Exception:  # noqa: BLE001 - maybe the session, maybe the model: once more on a new session
            state.clear()
            session = None  # (nor may this frame hold it while the next one is requested)
            if attempt:
                raise
    raise AssertionError("unreachable")


def _vm(ex: Any, inputs: dict[str, np.ndarray], target: Target, session: Any = None) -> tuple[Any, Any, list]:
    """A Relax VM of the compiled model with its inputs: here, or on the RPC ``session``'s device."""
    kind = "cuda" if target.kind.name == "cuda" else "cpu"
    if session is not None:
        import os
        import tempfile

        from stormdrop.tvm_compat.cross import fcompile

        with tempfile.TemporaryDirectory(prefix="stormdrop-model-") as tmp:
            path = os.path.join(tmp, f"model_{os.getpid()}_{id(ex)}.so")
            ex.export_library(path, fcompile=fcompile(target))  # (a cross linker for a foreign CPU)
            session.upload(path)
            ex = session.load_module(os.path.basename(path))
        dev = session.device(kind)
    else:
        runtime_threads_env(num_cores(target))
        dev = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    return relax.VirtualMachine(ex, dev), dev, [tvm.runtime.tensor(v, dev) for v in inputs.values()]


def _timer(vm: Any, dev: Any, args: list, remote: bool = False) -> Callable[[], float]:
    vm.set_input("main", *args)
    timer = vm.time_evaluator("invoke_stateful", dev, number=1, repeat=5, min_repeat_ms=100)

    def sample() -> float:
        with timing() if not remote else contextlib.nullcontext():  # a remote device is not this machine's
            return float(np.median(timer("main").results))

    return sample


def model_timer(ex: Any, inputs: dict[str, np.ndarray], target: Target, rpc: RpcConfig | None = None,
                state: dict | None = None) -> Callable[[], float]:
    """A function returning one latency sample (s) of the compiled model: the median of
    5 means of >= 100 ms of back-to-back runs on the Relax VM (on the RPC device ``rpc``, where a
    long benchmark's samples outlive sessions: ``_on_remote``, whose ``state`` it may share)."""
    if not rpc:
        return _timer(*_vm(ex, inputs, target))
    state = {} if state is None else state

    def sample(vm: Any, dev: Any, args: list) -> float:
        if "timer" not in state:  # (a new session clears the state: the model is loaded there again)
            state["timer"] = _timer(vm, dev, args, remote=True)
        return state["timer"]()

    return lambda: _on_remote(rpc, ex, inputs, target, sample, state)


def run_model(ex: Any, inputs: dict[str, np.ndarray], target: Target, *, time_it: bool = True,
              rpc: RpcConfig | None = None) -> tuple[list[np.ndarray], float | None]:
    """Outputs of the compiled model, and its median latency (s) when ``time_it`` (here, or on the
    RPC device ``rpc``)."""

    def use(vm: Any, dev: Any, args: list) -> tuple[list[np.ndarray], float | None]:
        outs = _outputs(vm, args)
        return outs, (_timer(vm, dev, args, remote=bool(rpc))() if time_it else None)

    return _on_remote(rpc, ex, inputs, target, use) if rpc else use(*_vm(ex, inputs, target))


def _outputs(vm: Any, args: list) -> list[np.ndarray]:
    out = vm["main"](*args)
    return [o.numpy() for o in out] if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [
        out.numpy()]


WARM_UP_S = 0.3  # the model runs this long before its kernels are timed in place (``kernel_times``)


def kernel_times(ex: Any, inputs: dict[str, np.ndarray], target: Target, runs: int = 20) -> dict[str, float]:
    """Seconds per model run spent in each kernel (by function name), timed inside the model.

    A kernel timed alone on warm caches (as tuning measures it) can run faster than the
    same kernel between its neighbours in the model, where its weights and inputs come
    from further away. A VM instrument times every kernel call of ``runs`` runs; each figure is
    the median over runs of the kernel's summed calls in one run, and includes the instrument's
    own cost (about a microsecond a call). VM builtins (allocation, tuples) are not kernels and
    are left out.

    The model first runs uninstrumented for ``WARM_UP_S``: right after the model's compile, or
    after ONNX Runtime ran in this process (its idle threads keep taking turns on the cores for
    a while), a few dozen runs under the instrument took up to twice the model's latency.
    """
    vm, _, args = _vm(ex, inputs, target)
    per_run: dict[str, list[float]] = {}
    current: dict[str, float] = {}
    started = [0.0]

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *call_args: Any) -> int:
        if symbol.startswith("vm."):
            return 0
        if before:
            started[0] = time.perf_counter()
        else:
            current[symbol] = current.get(symbol, 0.0) + time.perf_counter() - started[0]
        return 0

    with timing():
        warm_until = time.perf_counter() + WARM_UP_S
        while time.perf_counter() < warm_until:
            vm["main"](*args)
        vm.set_instrument(instrument)
        _kernel_runs(vm, args, runs, current, per_run)
    return {symbol: float(np.median(v)) for symbol, v in per_run.items()}


def task_times(ex: Any, inputs: dict[str, np.ndarray], target: Target, runs: int = 20) -> dict[str, float]:
    """``kernel_times`` by task name: a tuned kernel whose weights were packed at compile time
    runs as its task's ``<name>_prepacked`` function."""
    return {symbol.removesuffix("_prepacked"): secs for symbol, secs in kernel_times(ex, inputs, target, runs).items()}


def _kernel_runs(vm: Any, args: list, runs: int, current: dict, per_run: dict) -> None:
    for i in range(runs + 1):
        current.clear()
        vm["main"](*args)
        if i:
            for symbol, secs in current.items():
                per_run.setdefault(symbol, []).append(secs)


def interleaved(timers: dict[str, Callable[[], float]], rounds: int = 3) -> dict[str, float]:
    """Each peer's median latency over ``rounds`` rounds, the peers taking turns in every
    round, so that a slow spell of a shared machine falls on all of them alike."""
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer())
    return {name: float(np.median(v)) for name, v in samples.items()}


def max_abs_diff(outs: list[np.ndarray], ref: list[np.ndarray]) -> tuple[float, float]:
    """(max |out - ref|, scale of ref) over all outputs. Equal values (infinities included) and NaN
    where the reference has NaN count as no difference; a NaN or infinity where the reference has a
    finite value is an infinite one (``max`` of Python would drop a NaN that is not first)."""
    err, scale = 0.0, 1.0
    for o, r in zip(outs, ref):
        o, r = np.asarray(o, dtype=np.float64), np.asarray(r, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.where((o == r) | (np.isnan(o) & np.isnan(r)), 0.0, np.abs(o - r))
        err = max(err, float(np.max(np.nan_to_num(diff, nan=np.inf, posinf=np.inf), initial=0.0)))
        finite = np.abs(r[np.isfinite(r)])
        scale = max(scale, float(np.max(finite, initial=0.0)))
    return err, scale


def side_by_side(model: Model, ex: Any, inputs: dict[str, np.ndarray], target: Target, *,
                 rpc: RpcConfig | None = None, rounds: int = 3, untuned: bool = True
                 ) -> tuple[dict[str, float | None], float]:
    """The one compile-and-verify check of ``tune --model`` and ``bench --model``: untuned TVM
    (timed once: it can take seconds a run), the tuned executable ``ex``, ONNX Runtime and OpenVINO
    (when installed and its outputs match ONNX Runtime's; timed in turns, ``interleaved``) on the
    same inputs; TVM on the RPC device ``rpc`` when given
    (ONNX Runtime runs here). The tuned outputs must match the reference (ONNX Runtime, else the
    untuned build) within 1e-3 of its scale: ``TuningError`` otherwise. ``untuned=False``: the
    untuned build is compiled and run only when it is the reference (no ONNX model): on a CPU it
    runs naive loops (minutes for BERT-base with its compile). Returns the latencies
    (``untuned``, ``tuned``, ``onnxruntime``, ``openvino``: None when not run) and the max |diff|."""
    from stormdrop.errors import TuningError

    untuned_outs, untuned_s = None, None
    if untuned or model.onnx_model is None:
        untuned_outs, untuned_s = run_model(tvm.compile(model.mod, target=target), inputs, target, rpc=rpc)
    # one upload and load of the tuned library for its outputs and timing (an RPC server that loaded
    # the same file name twice in a session shut it down)
    if rpc:
        loaded: dict = {}
        outs = _on_remote(rpc, ex, inputs, target, lambda vm, dev, args: _outputs(vm, args), loaded)
        timers = {"tuned": model_timer(ex, inputs, target, rpc, loaded)}
    else:
        vm, dev, args = _vm(ex, inputs, target)
        outs, timers = _outputs(vm, args), {"tuned": _timer(vm, dev, args)}
    ref, latency = untuned_outs, {"untuned": untuned_s, "onnxruntime": None, "openvino": None}
    if model.onnx_model is not None:
        found = peers(model, inputs, num_cores(target))
        ref = found.reference
        timers.update(found.timers)
    err, scale = max_abs_diff(outs, ref)
    if not err <= 1e-3 * scale:
        raise TuningError(f"{model.name}: the tuned model's output differs from the reference (max |diff| {err:.3g})")
    latency.update(interleaved(timers, rounds))
    return latency, err


@dataclass
class Peers:
    """The runtimes a model is compared with, on one set of inputs: ONNX Runtime's outputs (the
    ``reference``), a timer for each peer that runs (``onnxruntime``; ``openvino`` when installed
    and its outputs match the reference), why a peer has no timer (``missing``) and, where it
    failed, the exception (``errors``)."""

    reference: list[np.ndarray]
    timers: dict[str, Callable[[], float]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)


def peers(model: Model, inputs: dict[str, np.ndarray], threads: int) -> Peers:
    """ONNX Runtime and OpenVINO on ``model``'s ONNX graph with ``threads`` threads each. OpenVINO
    is timed only when it is installed, reads the model and matches ONNX Runtime within 1e-3 of its
    scale (as the tuned model must); otherwise ``missing["openvino"]`` says why, and a warning too."""
    import logging

    log = logging.getLogger("stormdrop")
    ref, ort = onnxruntime_timer(model.onnx_model, inputs, threads)
    found = Peers(ref, {"onnxruntime": ort})
    try:
        ov = openvino_timer(model.onnx_model, inputs, threads)
        err, scale = max_abs_diff(ov[0], ref) if ov is not None else (0.0, 1.0)
    except Exception as e:  # noqa: BLE001 - a peer that cannot run this model is a missing column
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        log.warning("OpenVINO could not run %s: %s", model.name, reason)
        found.missing["openvino"], found.errors["openvino"] = f"failed: {reason}", e
        return found
    if ov is None:
        log.info("OpenVINO is not installed (pip install stormdrop[openvino]): no OpenVINO column")
        found.missing["openvino"] = "not installed"
        return found
    timer = ov[1]
    if not err <= 1e-3 * scale:
        log.warning("OpenVINO's output differs from ONNX Runtime's on %s (max |diff| %.3g): not timed", model.name, err)
        found.missing["openvino"] = f"wrong (max diff {err:.2g})"
        return found
    found.timers["openvino"] = timer
    return found
