"""Peers of stormdrop for bench_kernels.py: MetaSchedule runs, vendor libraries, machine facts."""

from __future__ import annotations

import functools
import logging
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

MS_LOGGER = "tvm.s_tir.meta_schedule"


def short(err: BaseException | str, limit: int = 80) -> str:
    """A one-line reason for a table cell (no '|', which would break the Markdown table)."""
    text = str(err).strip() or type(err).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "")
    if isinstance(err, BaseException) and type(err).__name__ not in line:
        line = f"{type(err).__name__}: {line}"
    return line.replace("|", "/")[:limit]


def publish(lines: list[str], out: str) -> None:
    """Append a results section to ``out`` (RESULTS.md) and print it."""
    with open(out, "a") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


def emit(lines: list[str], out: str | None = None, json_path: str | None = None, data: Any = None) -> None:
    """Print a results section; append it to ``out`` (RESULTS.md) and write ``data`` as JSON to
    ``json_path`` when they are given."""
    import json

    print("\n".join(lines))
    if out:
        with open(out, "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(data, f, indent=2)


def save_json(json_path: str | None, target: str, field: str, raw: list, **extra) -> None:
    """Write a run's JSON (its command, target, ``extra`` fields and ``raw`` under ``field``) when
    ``json_path`` is given."""
    import json
    import sys

    if json_path:
        with open(json_path, "w") as f:
            json.dump({"command": " ".join(sys.argv), "target": target, **extra, field: raw}, f, indent=1)


def checkpoint(row: list[str], json_path: str | None, target: str, field: str, raw: list) -> None:
    """Print a finished table row and, when ``json_path`` is given, rewrite the run's JSON so far
    (``save_json``): a run stopped later keeps what it measured."""
    print("| " + " | ".join(row) + " |", flush=True)
    save_json(json_path, target, field, raw)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines."""
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def pair_rows(raw: list[dict], first: str, second: str, label: Callable[[dict], str]) -> tuple[list[list[str]], str]:
    """The table rows of a two-variant kernel benchmark (``tuned_and_retimed``'s rows under ``first``
    and ``second`` in each entry, which holds its ``bytes``): label, both re-timed latencies (us),
    both GB/s, second / first speed, both tuning times; and the summary line (geometric mean)."""
    import statistics

    rows, speeds = [], []
    for e in raw:
        a, b = e[first].get("retimed_s"), e[second].get("retimed_s")
        speed = a / b if a and b else None
        if speed:
            speeds.append(speed)
        rows.append([label(e), *(f"{s * 1e6:.1f}" if s else "-" for s in (a, b)),
                     *(f"{e['bytes'] / s / 1e9:.1f}" if s else "-" for s in (a, b)), f"{speed:.1f}" if speed else "-",
                     f"{e[first]['tuning_s']:.0f}", f"{e[second]['tuning_s']:.0f}"])
    summary = f"- geometric mean speed-up: {statistics.geometric_mean(speeds):.1f}x over {len(speeds)} shapes" \
        if speeds else "- no run finished"
    return rows, summary


def each_row(specs: str, bench: Callable[[str], dict], row: Callable[[dict], list[str]], json_path: str | None,
             target: str, field: str) -> tuple[list[dict], list[list[str]]]:
    """``bench(spec)`` for each of the comma-separated ``specs``, each result's table row printed and
    the JSON rewritten as it comes (``checkpoint``): the raw results and their rows."""
    raw, rows = [], []
    for spec in [m.strip() for m in specs.split(",") if m.strip()]:
        print(f"[{spec}]", flush=True)
        raw.append(bench(spec))
        rows.append(row(raw[-1]))
        checkpoint(rows[-1], json_path, target, field, raw)
    return raw, rows


def machine() -> str:
    """CPU model name (lscpu, else platform.processor()) and core counts."""
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                      if ln.lower().startswith("model name")), "")
    except (OSError, subprocess.SubprocessError):
        pass
    from stormdrop.target import physical_cores

    return f"{model or platform.processor() or 'unknown CPU'}, {physical_cores()} physical cores " \
           f"({os.cpu_count()} logical)"


def pinned_host() -> tuple[Any, str]:
    """A kernel benchmark's set-up: the threading libraries pinned to the physical cores
    (``bench_kernels.pin_threads``), then the host target and its canonical string."""
    from bench_kernels import pin_threads

    from stormdrop.target import canonical, host_target, physical_cores

    pin_threads(physical_cores())
    target = host_target()
    return target, canonical(target)


def tuned_best(kernel: Any, target: Any, trials: int, path: str, seed: int, search: Any = None,
               measure: Any = None) -> tuple[dict, Any]:
    """Tune ``kernel`` (``trials`` storm + as many raindrop; ``search``: a ``SearchOptions``,
    ``measure``: a ``MeasureConfig``) into the database ``path``: its row
    (stored latency, tuning seconds, trials) and its best schedule, replayed on the workload."""
    from stormdrop import KernelOptions, SearchOptions, open_database, tune_kernel
    from stormdrop.target import canonical
    from stormdrop.tvm_compat.trace_json import schedule_from_trace_json

    options = KernelOptions(trials=trials, exploit_trials=trials, seed=seed, search=search or SearchOptions(),
                            measure=measure)
    t = tune_kernel(kernel, options, target=target, db=path).tasks[0]
    with open_database(path) as db:
        best = db.best(db.find_workload(kernel.mod).workload_id, canonical(target), k=1)[0]
    row = {"stored_s": t.latency_s, "tuning_s": t.tuning_s, "trials": t.trials}
    return row, schedule_from_trace_json(kernel.mod, best.trace_json).mod


def retime_in_turns(target: Any, variants: dict[str, tuple[str, Any, Any]], rounds: int, seed: int,
                    measure: Any = None) -> dict[str, float | None]:
    """Each variant's best schedule timed by one measurement gateway, the variants taking turns
    for ``rounds`` rounds: the median (s), ``None`` when no run succeeded. ``variants``: name ->
    (workload key, workload module, scheduled module); ``measure``: the gateway's
    ``MeasureConfig`` (default: its own)."""
    from stormdrop.measure.gateway import Gateway

    times: dict[str, list[float]] = {n: [] for n in variants}
    with Gateway(target, measure) as gw:
        for key, mod, _ in variants.values():
            gw.prepare(key, mod, seed)
        for _ in range(rounds):
            for n, (key, _, best_mod) in variants.items():
                res = gw.measure(key, [best_mod])[0]
                if res.run_secs:
                    times[n].append(statistics.mean(res.run_secs))
    return {n: statistics.median(v) if v else None for n, v in times.items()}


def tuned_and_retimed(target: Any, kernels: dict[str, Any], trials: int, rounds: int, seed: int, work_dir: str,
                      measure: Any = None) -> dict[str, dict]:
    """Each kernel tuned alike (``tuned_best``, its own database in ``work_dir``), then the bests
    re-timed in turns (``retime_in_turns``): name -> its ``tuned_best`` row with ``retimed_s``.
    ``measure``: the ``MeasureConfig`` of both (default: a kernel's)."""
    rows, variants = {}, {}
    for name, kernel in kernels.items():
        rows[name], best = tuned_best(kernel, target, trials, os.path.join(work_dir, f"{kernel.name}.db"), seed,
                                      measure=measure)
        variants[name] = (kernel.name, kernel.mod, best)
    for name, secs in retime_in_turns(target, variants, rounds, seed, measure).items():
        rows[name]["retimed_s"] = secs
    return rows


def quiet_meta_schedule() -> None:
    """Console output of MetaSchedule at WARNING (its per-task logs still go to work_dir files).

    ``tune_tir`` reconfigures the logger (level DEBUG) on every call and takes the console
    level from the level the logger had before, so this is called before every run.
    """
    logging.getLogger(MS_LOGGER).setLevel(logging.WARNING)


from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics  # noqa: E402


def meta_schedule_model(model: Any, target: Any, trials: int, seed: int, batch: int, lowering: Any,
                        work_dir: str) -> tuple[Any, Any, float]:
    """MetaSchedule's ``tune_relax`` at ``trials`` (global) on the fused module stormdrop tunes (the
    same lowering; ``tune_relax`` on the raw imported module finds no task: it expects legalized,
    fused primitive functions); its JSON database in ``work_dir``. Returns (the fused module, the
    database, tuning seconds: extraction and search)."""
    import tvm.s_tir.meta_schedule as ms

    from stormdrop import extract_tasks

    quiet_meta_schedule()
    builder = ms.builder.LocalBuilder(timeout_sec=60.0, initializer=functools.partial(load_tensor_intrinsics, "llvm"))
    t0 = time.monotonic()
    fused, _ = extract_tasks(model, target, lowering)
    db = ms.relax_integration.tune_relax(fused, {}, target, work_dir, trials, num_trials_per_iter=batch,
                                         builder=builder, seed=seed)
    return fused, db, time.monotonic() - t0


def meta_schedule_for(seconds: float, argv: list[str], work_dir: str) -> tuple[float, int, bool]:
    """Run ``argv``, a process tuning with MetaSchedule into the JSON database in ``work_dir``, for at
    most ``seconds`` (MetaSchedule has no time budget); then stop it and its builder and runner
    workers, and drop the database lines the stop cut short (a tuning record whose workload line
    went with them too). Returns (wall seconds, tuning records kept, whether it ended on its own)."""
    import json
    import signal

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        proc.wait(timeout=seconds)
        finished = proc.returncode == 0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        finished = False
    wall = time.monotonic() - t0

    def lines(name: str) -> list[tuple[str, Any]]:  # (line, its JSON) of those whole
        path = os.path.join(work_dir, name)
        kept = []
        if os.path.exists(path):
            with open(path) as f:
                for line in f:
                    try:
                        kept.append((line.rstrip("\n"), json.loads(line)))
                    except ValueError:
                        pass
        return kept

    workloads = lines("database_workload.json")
    records = [r for r in lines("database_tuning_record.json") if r[1][0] < len(workloads)]
    for name, kept in (("database_workload.json", workloads), ("database_tuning_record.json", records)):
        with open(os.path.join(work_dir, name), "w") as f:
            f.write("".join(text + "\n" for text, _ in kept))
    return wall, len(records), finished


def run_meta_schedule(mod: Any, target: Any, trials: int, seed: int, post_opt: bool) -> dict:
    """``ms.tune_tir`` at ``trials`` in a fresh work dir; returns the best schedule's module.

    With ``post_opt`` the Droplet post-optimization (up to 100 more trials, not configurable
    through tune_tir) appends its best record to the JSON files only, so the database is
    re-opened from the work dir before ``compile_tir``.
    """
    import tvm.s_tir.meta_schedule as ms

    from stormdrop.search.sketches import design_space

    quiet_meta_schedule()
    load_tensor_intrinsics(target)  # (a GPU's tensor-core space names its intrinsics)
    # As shipped, LocalBuilder starts a new process pool on every batch whose default_build
    # imports every backend's tensor intrinsics (~32 s on this machine), past its own 30 s
    # timeout: every candidate failed to build. MetaSchedule is given stormdrop's cheap
    # CPU-only intrinsics import in its builder workers, so it is measured at its best.
    builder = ms.builder.LocalBuilder(timeout_sec=60.0,
                                      initializer=functools.partial(load_tensor_intrinsics, "llvm"))
    with tempfile.TemporaryDirectory(prefix="bench-ms-") as work_dir:
        t0 = time.monotonic()
        db = ms.tune_tir(mod, target=target, work_dir=work_dir, max_trials_global=trials,
                         num_trials_per_iter=64, seed=seed, post_optimization=post_opt, builder=builder,
                         space=design_space(mod, target))  # stormdrop's: tensor cores for float16 on a GPU
        tuning_s = time.monotonic() - t0
        if post_opt:
            db = ms.database.JSONDatabase(work_dir=work_dir)
        records = db.get_all_tuning_records()
        measured = [r for r in records if r.run_secs and float(r.run_secs[0]) < 1e9]
        self_best = min((statistics.fmean(float(s) for s in r.run_secs) for r in measured), default=None)
        sch = ms.tir_integration.compile_tir(db, mod, target)
        if sch is None:
            raise RuntimeError(f"no valid schedule among {len(records)} records")
        return {"mod": sch.mod, "tuning_s": tuning_s, "trials": len(records), "self_latency_s": self_best}


# ----------------------------------------------------------------------------- vendor libraries


def _time_call(fn: Callable[[], object], repeat: int = 10, min_repeat_s: float = 0.05) -> float:
    """Median seconds per call over ``repeat`` samples of >= ``min_repeat_s`` each (like the gateway)."""
    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(min_repeat_s / once) + 1)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def vendor_latency(op_class: str, args: list[tuple[str, tuple[int, ...], str]],
                   params: dict[str, str], threads: int, device: str = "llvm") -> tuple[float | None, str]:
    """(seconds, library) for NumPy/OpenBLAS (matmuls) or PyTorch (NCHW convs); (None, why) otherwise.

    On a CUDA target: PyTorch on the GPU (cuBLAS, cuDNN) in float32 with TF32 off, as TVM's
    float32 kernels compute, or in float16 (tensor cores) for a float16 workload."""
    import numpy as np

    rng = np.random.default_rng(0)
    dtypes = {dt for _, _, dt in args}
    if dtypes != {"float32"} and not (device == "cuda" and dtypes == {"float16"}):
        return None, "n/a (dtype)"
    if device == "cuda":
        return _gpu_vendor_latency(op_class, args, params, rng)
    ins = [rng.standard_normal(shape, dtype=np.float32) for _, shape, _ in args[:-1]]
    out = np.empty(args[-1][1], dtype=np.float32)
    if op_class in ("matmul", "batch_matmul"):
        a, b = ins
        return _time_call(lambda: np.matmul(a, b, out=out)), "numpy"
    if op_class == "dense":  # out = data @ weight.T, weight stored (N, K) as in the TVM kernel
        x, w = ins
        return _time_call(lambda: np.matmul(x, w.T, out=out)), "numpy"
    if op_class not in ("conv2d", "depthwise_conv2d"):
        return None, "n/a"
    try:
        import torch
    except ImportError:
        return None, "n/a (no torch)"
    torch.set_num_threads(threads)
    data, weight = (torch.from_numpy(t) for t in ins)
    stride, pad = int(params.get("stride", 1)), int(params.get("pad", 0))
    groups = data.shape[1] if op_class == "depthwise_conv2d" else 1
    conv = torch.nn.functional.conv2d

    def run() -> object:
        with torch.no_grad():
            return conv(data, weight, stride=stride, padding=pad, groups=groups)

    return _time_call(run), "torch"


def _gpu_vendor_latency(op_class: str, args: list[tuple[str, tuple[int, ...], str]],
                        params: dict[str, str], rng: Any) -> tuple[float | None, str]:
    """Median seconds per call of PyTorch's CUDA kernel for the workload (synchronized per sample)."""
    try:
        import torch
    except ImportError:
        return None, "n/a (no torch)"
    if not torch.cuda.is_available():
        return None, "n/a (torch sees no GPU)"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = str(args[0][2])
    ins = [torch.from_numpy(rng.standard_normal(shape, dtype="float32")).cuda().to(getattr(torch, dtype))
           for _, shape, _ in args[:-1]]
    if op_class in ("matmul", "batch_matmul"):
        a, b = ins
        fn, lib = (lambda: torch.matmul(a, b)), "torch cuBLAS"
    elif op_class == "dense":
        x, w = ins
        fn, lib = (lambda: torch.nn.functional.linear(x, w)), "torch cuBLAS"
    elif op_class in ("conv2d", "depthwise_conv2d"):
        data, weight = ins
        stride, pad = int(params.get("stride", 1)), int(params.get("pad", 0))
        groups = data.shape[1] if op_class == "depthwise_conv2d" else 1
        fn, lib = (lambda: torch.nn.functional.conv2d(data, weight, stride=stride, padding=pad,
                                                       groups=groups)), "torch cuDNN"
    else:
        return None, "n/a"

    def run() -> object:
        with torch.no_grad():
            fn()
        torch.cuda.synchronize()

    return _time_call(run), f"{lib}, {'fp16' if dtype == 'float16' else 'fp32'}"
