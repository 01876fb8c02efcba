"""Steps that hand stored schedules to TVM, run in a child process: TVM's C++ crashes on some
malformed traces (an instruction attribute of the wrong type reaches an unchecked cast) instead
of raising, so a crafted file or database row would kill the command. The child's death by a
signal becomes one ``DatabaseError`` line naming what it was reading.

A step prints ``at: WHAT`` lines as it goes and ``result: TEXT`` at the end; a ``StormdropError``
in it is its one line on stderr and exit 2.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from stormdrop.errors import DatabaseError, StormdropError


def run(step: str, *args: str, what: str) -> str:
    """``step(*args)`` (a name of ``_steps()``) in a child process; its result text. ``what``: the
    input, for the error line when TVM crashes on it."""
    from stormdrop.measure.workers import child_entry, child_env

    r = subprocess.run([sys.executable, "-c", child_entry("tvm_compat.isolated", "_child"), step, *args], env=child_env(),
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    lines = r.stdout.splitlines()
    if r.returncode < 0:
        at = next((ln[4:] for ln in reversed(lines) if ln.startswith("at: ")), what)
        name = signal.Signals(-r.returncode).name if -r.returncode in signal.Signals._value2member_map_ else r.returncode
        raise DatabaseError(f"malformed entry in {at}: TVM crashed on it ({name}); nothing was written")
    if r.returncode != 0:
        err = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        raise DatabaseError(err[-1] if err else f"{what}: failed (exit {r.returncode})")
    sys.stderr.write(r.stderr)  # its warnings (a record skipped)
    return next((ln[8:] for ln in reversed(lines) if ln.startswith("result: ")), "")


def _steps() -> dict:
    from stormdrop.storage import metaschedule
    from stormdrop.storage.database import Database

    def read(in_dir: str) -> str:
        return str(len(metaschedule.read_metaschedule(in_dir, progress=_at)))

    def export(db_path: str, out_dir: str, target: str = "", scratch: str = "") -> str:
        with Database(db_path, read_only=True) as db:
            return str(metaschedule.export_metaschedule(db, out_dir, target=target or None, progress=_at,
                                                    scratch=scratch or None))

    return {"read_metaschedule": read, "export": export}


def _at(where: str) -> None:
    print(f"at: {where}", flush=True)


def _child(argv: list[str]) -> None:
    step, args = argv[0], argv[1:]
    try:
        result = _steps()[step](*args)
    except StormdropError as e:
        print(e, file=sys.stderr)
        sys.exit(2)
    print(f"result: {result}", flush=True)
