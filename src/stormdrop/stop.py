"""The user's stop (Ctrl-C, SIGTERM): raised where the run is, and remembered until the run ends.

Python raises a signal's exception wherever the main thread runs Python next. When that is code
TVM called back (the XGBoost cost model inside the evolutionary search, a pass written in
Python), tvm-ffi carries the exception back out of TVM as a ``RuntimeError`` (it maps exception
types it does not know so), which a caller that skips a failing candidate may swallow, or which
ends the run as an error. So the handlers installed here also remember the signal: ``check``
(called by the measurement gateway at every step) raises the stop again, and ``requested`` tells
the command that an error which ended a run came from the user's stop. Where TVM calls Python
back from C++ code that cannot pass an exception on (MetaSchedule's logger, called from a C++
destructor all through the evolutionary search: an exception there aborts the process in
``std::terminate``), the search runs ``deferred``: a stop there is only remembered, and raised
when the block ends.

Only a command installs the handlers (``install``); a library caller keeps its own.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Terminated(BaseException):
    """SIGTERM (a batch scheduler's stop): handled as Ctrl-C is, and, as ``KeyboardInterrupt``,
    not an ``Exception`` that a caller skipping failures would catch."""


_requested: int | None = None
_deferring = 0  # depth of ``deferred`` blocks the main thread is in


def _raise(signum: int) -> None:
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt


def _on_signal(signum: int, frame: object) -> None:
    global _requested
    _requested = signum
    if not _deferring:
        _raise(signum)


def install() -> None:
    """Handle Ctrl-C and SIGTERM as described above, with no stop requested yet; only in the
    main thread (elsewhere Python cannot install handlers, and nothing changes)."""
    global _requested
    if threading.current_thread() is not threading.main_thread():
        return
    _requested = None
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)


def requested() -> int | None:
    """The signal of the stop the user asked for, or None."""
    return _requested


def check() -> None:
    """Raise the user's stop again if one was asked for (``KeyboardInterrupt`` or ``Terminated``)."""
    if _requested is not None:
        _raise(_requested)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A block in which a stop is only remembered: raised (``check``) once the block ends."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    check()
