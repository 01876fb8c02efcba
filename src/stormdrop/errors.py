"""Typed errors of stormdrop. Each one carries a single human-readable line."""

from __future__ import annotations


class StormdropError(Exception):
    """Base class: an error the CLI prints as one line and exits with ``exit_code``."""

    exit_code = 1


class SpecError(StormdropError):
    """A malformed kernel spec, target, model path or option value (user input)."""

    exit_code = 2


class DatabaseError(StormdropError):
    """The database cannot be opened, has a wrong schema version, or is corrupt."""

    exit_code = 2


class TuningError(StormdropError):
    """Tuning could not produce any valid, verified schedule."""

    exit_code = 1


def one_line(exc: BaseException | str) -> str:
    """The last non-empty line of an error (TVM's messages end with the reason)."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else text


class MeasureError(StormdropError):
    """The measurement set-up failed: no reference output, an unreachable RPC tracker or device."""

    exit_code = 1
