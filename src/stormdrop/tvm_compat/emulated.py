"""Candidates for another CPU checked on this one, without its board: user-mode emulation.

A candidate built for an aarch64 board (``cross.fcompile`` links it) cannot be loaded here, and
TVM's runtime for that CPU is not installed either. ``emulated_main.c``, built by the target's
cross compiler, stands in for the runtime: it loads the library under ``qemu-<arch>`` (Debian's
``qemu-user``), gives it the entry points TVM's loader gives a library (workspace, a parallel
launch on POSIX threads, a barrier, error reporting) and calls its functions on buffers passed as
files. ``check_emulated`` runs a candidate so on the workload's reference inputs and compares its
outputs with the reference build computed on this machine, as a runner on the board would.
Correctness only: an emulated run's time says nothing of the board's.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from stormdrop.tvm_compat.cross import fcompile, gnu_triple, is_foreign, target_arch

HARNESS_SOURCE = os.path.join(os.path.dirname(__file__), "emulated_main.c")
RUN_TIMEOUT_S = 600.0  # an emulated run is tens of times slower than the board's

_DL_CODES = {"int": 0, "uint": 1, "float": 2, "bfloat": 4, "bool": 6}


class EmulatorMissing(RuntimeError):
    """No user-mode emulator (or no cross compiler) on this machine for a foreign target."""


class EmulatedRunFailed(RuntimeError):
    """The library did not run to the end under emulation (one line: why)."""


def emulator(target: Any) -> list[str]:
    """The command that runs a program of ``target``'s CPU here: ``qemu-<arch>`` with the cross
    toolchain's C library (``/usr/<triple>``) and the emulator's fullest CPU (SVE on aarch64).
    ``EmulatorMissing`` (one line) where there is none."""
    if not is_foreign(target):
        raise ValueError(f"{target}: this machine's own CPU needs no emulator")
    arch = target_arch(target)
    qemu = f"qemu-{arch}"
    if shutil.which(qemu) is None:
        raise EmulatorMissing(f"no {qemu} on this machine to run {arch} libraries (Debian/Ubuntu: "
                              f"apt install qemu-user)")
    return [qemu, "-cpu", "max", "-L", f"/usr/{gnu_triple(target)}"]


@functools.cache
def _harness(compiler: str) -> str:
    """``emulated_main.c`` built by ``compiler`` (the target's cross ``gcc``), once a process."""
    import tvm_ffi.libinfo

    out = tempfile.mkdtemp(prefix="stormdrop-emulated-")
    atexit.register(shutil.rmtree, out, True)
    path = os.path.join(out, "emulated_main")
    cmd = [compiler, "-O1", "-std=c11", "-D_POSIX_C_SOURCE=200809L", f"-I{tvm_ffi.libinfo.find_include_path()}",
           f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}", "-rdynamic", "-o", path, HARNESS_SOURCE,
           "-ldl", "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise EmulatorMissing(f"{compiler} could not build the emulation harness: "
                              f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return path


def harness(target: Any) -> str:
    """The emulation harness for ``target``'s CPU (``EmulatorMissing`` without a cross compiler)."""
    from stormdrop.tvm_compat.cross import CrossLinkerMissing

    try:
        fcompile(target)  # names the missing cross compiler and its package
    except CrossLinkerMissing as err:
        raise EmulatorMissing(str(err)) from None
    return _harness(f"{gnu_triple(target)}-gcc")


def dl_dtype(dtype: Any) -> str:
    """A NumPy dtype as the harness reads it: DLPack ``code:bits:lanes``."""
    dt = np.dtype(dtype)
    kind = "bool" if dt == np.bool_ else {"i": "int", "u": "uint", "f": "float"}.get(dt.kind)
    if kind is None:
        raise ValueError(f"dtype {dt} has no DLPack code here")
    return f"{_DL_CODES[kind]}:{dt.itemsize * 8}:1"


def run_emulated(target: Any, library: str, buffers: Sequence[np.ndarray],
                 calls: Sequence[tuple[str, Sequence[int]]], *, threads: int | None = None,
                 timeout: float = RUN_TIMEOUT_S) -> list[np.ndarray]:
    """Call ``library``'s functions under emulation, in order, each on the ``buffers`` its
    indices name (``calls``: (function, indices)); returns every buffer as the calls left it.
    ``threads``: the tasks of a parallel loop (default: the target's cores)."""
    if threads is None:
        threads = int(target.attrs.get("num-cores", 1) or 1)
    cmd = [*emulator(target), harness(target), os.path.abspath(library), str(max(1, threads))]
    with tempfile.TemporaryDirectory(prefix="stormdrop-emulated-") as tmp:
        paths = []
        for i, buf in enumerate(buffers):
            arr = np.ascontiguousarray(buf)
            paths.append(os.path.join(tmp, f"b{i}.bin"))
            arr.tofile(paths[-1])
            shape = "x".join(str(d) for d in arr.shape) or "-"
            cmd += ["-b", f"{dl_dtype(arr.dtype)}:{shape}", paths[-1]]
        for name, indices in calls:
            cmd += ["-c", name, ",".join(str(i) for i in indices)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise EmulatedRunFailed(f"{os.path.basename(library)}: no result after {timeout:.0f} s "
                                    f"under emulation") from None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            raise EmulatedRunFailed(f"{os.path.basename(library)}: {why}")
        return [np.fromfile(p, dtype=b.dtype).reshape(b.shape) for p, b in zip(paths, buffers)]


def reference_outputs(mod: Any, seed: int) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """``mod``'s reference inputs (``measure.reference.reference_inputs``), the arguments as its
    reference build left them, computed on this machine's CPU, and the indices of its outputs (the
    arguments it changed; the last one where none changed)."""
    import tvm

    from stormdrop.measure.reference import build_reference, changed_arguments, reference_inputs
    from stormdrop.target import host_target

    inputs = reference_inputs(mod, seed)
    rt_mod = build_reference(mod, host_target())
    args = [tvm.runtime.tensor(a, tvm.cpu(0)) for a in inputs]
    rt_mod["main"](*args)
    results = [a.numpy() for a in args]
    return inputs, results, changed_arguments(inputs, results)


def check_emulated(target: Any, mod: Any, built: dict, seed: int = 0) -> str:
    """Whether the candidate ``built`` (a builder's result: its library ``timed`` and weight-packing
    plan ``pack``) of workload ``mod`` computes the reference outputs when run under emulation:
    "" where it does, else how it differs (one line, ``measure.outputs.difference``)."""
    from stormdrop.measure.outputs import difference
    from stormdrop.measure.reference import packed_calls

    inputs, expected, outputs = reference_outputs(mod, seed)
    n = len(inputs)
    plan = built.get("pack")
    buffers = [a.copy() for a in inputs]
    if plan is None:
        calls = [("main", list(range(n)))]
        params = list(range(n))
    else:  # weights packed by the library's own ``pack`` first, as the runner does
        buffers += [np.zeros(shape, dtype) for shape, dtype in plan["outputs"]]
        pack, main, params = packed_calls(plan, n)
        calls = [("pack", pack), ("main", main)]
    got = run_emulated(target, built["timed"], buffers, calls)
    for buf, i in zip(calls[-1][1], params):
        if i in outputs and (wrong := difference(i, got[buf], expected[i])):
            return wrong
    return ""
