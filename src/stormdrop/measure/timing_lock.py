"""One timing at a time on this machine: a lock file held while kernels or models are timed.

Two tuners (or a tuner and a benchmark) on one host would otherwise time on the same
cores at the same moment and corrupt both measurements. Every stormdrop process takes
the same file lock (``flock``) around each timing: the candidate runs of the
measurement gateway and the model timings of ``bench`` and ``tune --model``. Builds
and reference computations are not timings and run freely. The lock is re-entrant
within a process. ``$STORMDROP_TIMING_LOCK`` names another lock file; an empty value
turns the lock off. The lock file lives in a shared directory: a symbolic link or anything
but a regular file there is refused (it could point another user's tuner at a file of its
own), and only its owner makes it writable to all.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_state = threading.local()
_process_lock = threading.RLock()


def lock_path() -> str | None:
    path = os.environ.get("STORMDROP_TIMING_LOCK")
    if path is None:
        return os.path.join(tempfile.gettempdir(), "stormdrop-timing.lock")
    return path or None


@contextmanager
def timing() -> Iterator[None]:
    """Hold the machine-wide timing lock for the duration of the block (blocking until it is free)."""
    path = lock_path()
    depth = getattr(_state, "depth", 0)
    if path is None or depth:
        _state.depth = depth + 1
        try:
            yield
        finally:
            _state.depth -= 1
        return
    with _process_lock:
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            _state.depth = 1
            try:
                yield
            finally:
                _state.depth = 0
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _open_lock(path: str) -> int:
    """The lock file, created if missing; never through a symbolic link (``MeasureError``)."""
    from stormdrop.errors import MeasureError

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as err:
        why = "it is a symbolic link" if err.errno == errno.ELOOP else (err.strerror or str(err))
        raise MeasureError(f"cannot use the timing lock file {path}: {why} "
                           "(STORMDROP_TIMING_LOCK names another one)") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise MeasureError(f"cannot use the timing lock file {path}: not a regular file "
                           "(STORMDROP_TIMING_LOCK names another one)")
    if info.st_uid == os.getuid():
        try:
            os.fchmod(fd, 0o666)  # other users' tuners share the machine too
        except OSError:
            pass
    return fd
