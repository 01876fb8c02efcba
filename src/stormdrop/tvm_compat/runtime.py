"""Work-arounds of TVM 0.27 in its runtime: threads, exported libraries, memory (the index of all: ``tvm_compat``).

- TVM-FFI imports PyTorch at its own import whenever PyTorch is installed (a symbol-conflict
  workaround of its own), which more than triples TVM's import time; stormdrop's child processes
  (measurement workers, isolated steps) never use PyTorch and start with it made unimportable
  (``measure.workers.child_entry``).
- TVM's CPU runtime starts ``hardware_concurrency / 2`` threads on x86 (one on
  a 2-core machine), whatever the target's ``num-cores`` says; the count is read
  from ``TVM_NUM_THREADS`` when the thread pool starts (``runtime_threads_env``). Without it
  (nor ``OMP_NUM_THREADS``), every parallel launch also re-reads the CPU count from
  ``/sys/devices/system/cpu/online`` (``MaxConcurrency`` calls glibc's ``get_nprocs``): three
  system calls per kernel call, longer than a small kernel itself on a virtual machine.
- ``VMExecutable.export_library`` logs ``Warning: Scope Saving:`` from C++ once per
  saved item (a few hundred lines for ResNet-18) straight to file descriptor 2:
  ``export_library`` runs it with those lines filtered out of stderr.
- A candidate library that allocates a large intermediate buffer (e.g. a packed-weight
  kernel that re-lays its weights out itself, as the checked function did before
  ``prepack.split``) leaves that
  memory behind when the library is unloaded (megabytes per transformer FFN candidate), so a
  runner process grew without bound and a long BERT tune ran the machine out of
  memory (every build then timed out). The same library loaded once and called again does
  not grow. The gateway recycles its runner process when it has grown past a limit
  (``memory.runner_memory_limit_mb``).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def runtime_threads_env(num_cores: int, env: dict | None = None) -> dict:
    """Set ``TVM_NUM_THREADS`` to ``num_cores`` in ``env`` (default: this process) unless the user set it.

    Must happen before the first parallel kernel of the process runs.
    """
    env = os.environ if env is None else env
    if "TVM_NUM_THREADS" not in env and num_cores > 0:
        env["TVM_NUM_THREADS"] = str(num_cores)
    return env


_EXPORT_NOISE = "Warning: Scope Saving:"


def export_library(executable: Any, path: str, target: Any = None) -> None:
    """``executable.export_library(path)`` without TVM's per-item "Scope Saving" warnings, and
    whole or not at all: linked beside ``path``, then renamed over it; for a ``target`` of another
    CPU architecture, by its cross compiler (``cross.fcompile``).

    The C++ logger writes to file descriptor 2, out of Python's reach: fd 2 points to a
    temporary file during the call, and every other line is written back to stderr.
    """
    import tempfile

    from stormdrop.tvm_compat.cross import fcompile

    linker = fcompile(target) if target is not None else None
    where, name = os.path.split(os.path.abspath(path))
    partial = os.path.join(where, f".{name}.{os.getpid()}.partial{os.path.splitext(name)[1]}")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            executable.export_library(partial, fcompile=linker)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if _EXPORT_NOISE not in ln]
            sys.stderr.write("".join(kept))
