"""Donor databases of a run: the ``--reuse-from`` databases opened read only, and whether the
donors (those, the schedule hub) hold tuned records of one workload exactly. Reuse
(``search.reuse``) draws its transfers from them; nothing here writes."""

from __future__ import annotations

import os
from collections.abc import Sequence

import tvm

from stormdrop.errors import DatabaseError, SpecError
from stormdrop.storage.database import Database


def tuned_in(mod: tvm.IRModule, target_key: str, dbs: Sequence[Database]) -> bool:
    """Whether one of ``dbs`` (donors: ``--reuse-from``, the hub) holds valid records of this very
    workload on ``target_key``: reuse then starts its task from them, no search needed to reach them
    (a tune under a small trial cap keeps Winograd kernels only where they all are)."""
    for donor in dbs:
        entry = donor.find_workload(mod)
        if entry is not None and donor.best(entry.workload_id, target_key):
            return True
    return False


def open_donors(paths: Sequence[str | os.PathLike]) -> list[Database]:
    """The ``--reuse-from`` databases, read only (SpecError naming the first that cannot be opened)."""
    out: list[Database] = []
    try:
        for p in paths:
            out.append(Database(p, read_only=True))
    except DatabaseError as err:
        for d in out:
            d.close()
        raise SpecError(f"--reuse-from: {err}") from None
    return out
