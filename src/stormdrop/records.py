"""Immutable values shared by every phase: measurement results and tuning records.

Failures are data: a ``MeasureResult`` either holds the measured times or a typed
``ErrorKind`` with its message, never a magic number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import Enum


class Phase(str, Enum):
    """Which phase proposed a candidate."""

    REUSE = "reuse"
    STORM = "storm"
    RAINDROP = "raindrop"


class ErrorKind(str, Enum):
    """Why a candidate has no valid time."""

    INVALID_SCHEDULE = "invalid_schedule"  # postprocessor rejected it; never built
    BUILD_ERROR = "build_error"
    BUILD_TIMEOUT = "build_timeout"
    BUILDER_CRASH = "builder_crash"  # the build process died (killed: out of memory, the machine)
    RUN_ERROR = "run_error"
    RUN_TIMEOUT = "run_timeout"
    RUNNER_CRASH = "runner_crash"  # the timing process died (a crashing kernel, the machine)
    WRONG_RESULT = "wrong_result"  # ran, but its output differs from the reference

    @property
    def retryable(self) -> bool:
        """A failure that may not happen again (a busy machine, a lost device, a killed process): a
        later run measures it once more. Invalid schedules, build and run errors and wrong results
        are final."""
        return self in (ErrorKind.RUN_TIMEOUT, ErrorKind.RUNNER_CRASH, ErrorKind.BUILD_TIMEOUT,
                        ErrorKind.BUILDER_CRASH)


IMPORTED = "imported:"  # the versions prefix of a record imported from another tuner's database


@dataclass(frozen=True)
class MeasureResult:
    """Outcome of measuring one candidate: times in seconds, or a typed error."""

    run_secs: tuple[float, ...] | None = None
    error: ErrorKind | None = None
    error_msg: str = ""

    def __post_init__(self) -> None:
        if (self.run_secs is None) == (self.error is None):
            raise ValueError("a MeasureResult holds either run_secs or an error, not both")

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def mean(self) -> float:
        """Mean time in seconds; +inf for a failure (so it never wins a comparison)."""
        if self.run_secs is None or not self.run_secs:
            return math.inf
        return sum(self.run_secs) / len(self.run_secs)

    @property
    def median(self) -> float:
        """Median time in seconds (a sample stalled by another process counts as one); +inf for a failure."""
        if self.run_secs is None or not self.run_secs:
            return math.inf
        return statistics.median(self.run_secs)

    @classmethod
    def failure(cls, kind: ErrorKind, msg: str = "") -> MeasureResult:
        return cls(run_secs=None, error=kind, error_msg=msg[-2000:])


@dataclass(frozen=True)
class Record:
    """One measured candidate of one workload on one target, as stored in the database.

    ``trace_json`` is the JSON text of the full MetaSchedule trace (decisions and
    post-processing instructions included, as ``Trace.as_json(remove_postproc=False)``
    with plain Python numbers). ``candidate_key`` identifies the schedule (a hash of
    the trace JSON), so the same schedule is never measured twice.
    """

    workload_id: int
    target: str
    candidate_key: str
    trace_json: str
    args_info_json: str
    result: MeasureResult
    phase: Phase
    measured_at: float
    versions: str = ""
    record_id: int | None = field(default=None, compare=False)
    attempts: int = 1  # times this candidate was measured (a retryable failure is retried once)

    @property
    def retry_due(self) -> bool:
        """A retryable failure not yet retried."""
        return self.result.error is not None and self.result.error.retryable and self.attempts < 2

    @property
    def imported(self) -> bool:
        """Measured by another tuner (``stormdrop import``): it spent no budget of stormdrop's."""
        return self.versions.startswith(IMPORTED)

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def mean(self) -> float:
        return self.result.mean
