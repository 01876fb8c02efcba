"""Writing the schedule hub (``storage.hub``): the best few records of every workload of one ISA
class in some databases, as the gzip JSON lines a hub file is (``tools/build_hub.py`` calls it)."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import tvm

from stormdrop.errors import DatabaseError
from stormdrop.storage.database import Database
from stormdrop.storage.hub import (
    FORMAT,
    PER_WORKLOAD,
    HubInfo,
    hub_header,
    hub_lines,
    info,
    isa_class,
)
from stormdrop.storage.identity import same_workload
from stormdrop.tvm_compat.trace_json import load_object_json


def _noted(db: Database, isa: str, models: Collection[str] | None) -> tuple[set[str], set[int] | None]:
    """The models noted in ``db`` as tuned on ``isa`` (those of ``models`` only, when given), and the
    workload ids of their tasks (None: every workload, when ``models`` is None)."""
    notes = {name: note for name, note in db.model_notes().items()
             if isinstance(note.get("target"), str) and isa_class(note["target"]) == isa
             and (models is None or name in models)}
    if models is None:
        return set(notes), None
    return set(notes), {int(t["workload_id"]) for note in notes.values() for t in note.get("tasks", [])}


def _shapes_of(mod: tvm.IRModule) -> list[list[int]] | None:
    """A line's ``shapes``: the kernel's parameter shapes (``parameter_shapes``), None where symbolic."""
    from stormdrop.workloads import parameter_shapes

    shapes = parameter_shapes(mod)
    return None if shapes is None else [list(s) for s in shapes]


def write_hub(db: Database | Sequence[Database], path: str | os.PathLike, isa: str, *,
              per_workload: int = PER_WORKLOAD, models: Collection[str] | None = None,
              base: str | os.PathLike | None = None) -> HubInfo:
    """Write the hub of ``isa`` from ``db`` (one database or several): every workload with valid
    records measured on a target of that ISA class (not imported ones), its ``per_workload``
    fastest; a workload in several databases or measured on several machines once, where its best
    is fastest. ``models``: only the tasks of these models' last tunes (their notes). ``base``: a
    hub file of the same ISA class whose workloads are kept as they are written there (a
    workload the databases hold too: once, where its best is fastest), its machines and models
    in the header too: a hub grows without its earlier build databases. Written aside, then
    moved in place. Returns what was written."""
    dbs = [db] if isinstance(db, Database) else list(db)
    machines: set[str] = set()
    rows: list[dict] = []
    names: set[str] = set()
    if base is not None:
        lines = hub_lines(Path(base))
        head = hub_header(Path(base), lines)
        if head["isa"] != isa:
            raise DatabaseError(f"hub {base} is of ISA class {head['isa']}, not {isa}")
        machines |= {str(m) for m in head.get("machines", [])}
        names |= {str(m) for m in head.get("models", [])}
        rows += [row for _, row in lines]
    for one in dbs:
        noted, allowed = _noted(one, isa, models)
        names |= noted
        for target_key in sorted({t for wl in one.workloads() for t in one.targets(wl.workload_id)}):
            if isa_class(target_key) != isa:
                continue
            for wl in one.workloads():
                if allowed is not None and wl.workload_id not in allowed:
                    continue
                best = [r for r in one.best(wl.workload_id, target_key, k=per_workload, checked=True) if r.ok]
                if not best:
                    continue
                machines.add(target_key)
                rows.append({"name": wl.name, "op_class": wl.op_class, "flops": wl.flops, "shash": wl.shash,
                             "mod": tvm.ir.save_json(wl.mod), "shapes": _shapes_of(wl.mod),
                             "measured_on": target_key,
                             "records": [{"trace": r.trace_json, "args_info": r.args_info_json,
                                          "run_secs": list(r.result.run_secs or ()), "measured_at": r.measured_at}
                                         for r in best]})
    merged: dict[str, list[tuple[Any, dict]]] = {}  # structural hash -> (module, row) of each workload
    for row in rows:  # one entry a workload (``same_workload``: as a database keys it), the fastest best wins
        mod = load_object_json(row["mod"])
        if row.get("shapes") is None:  # a base hub written before lines gave them
            row["shapes"] = _shapes_of(mod)
        same = merged.setdefault(row["shash"], [])
        k = next((k for k, (other, _) in enumerate(same) if same_workload(other, mod)), None)
        if k is None:
            same.append((mod, row))
        elif min(row["records"][0]["run_secs"]) < min(same[k][1]["records"][0]["run_secs"]):
            same[k] = (mod, row)
    head = {"stormdrop_hub": FORMAT, "isa": isa, "tvm": tvm.__version__, "built_at": time.time(),
            "machines": sorted(machines), "models": sorted(names)}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
        f.write(json.dumps(head) + "\n")
        for same in merged.values():
            for _, row in same:
                f.write(json.dumps(row) + "\n")
    os.replace(tmp, out)
    return info(out)
