"""The schedule hub: tuned schedules shipped with stormdrop, one read-only file per ISA class
(``x86-avx512``, ``x86-avx2``, ``aarch64``, ``cuda-sm_90``...), that a tune draws reuse donors
from by default, as from a ``--reuse-from`` database, for the workloads it holds (the kernels of
the networks it was built from: a new user of those does not start from nothing).

A hub file is gzip-compressed JSON lines: a header object (``stormdrop_hub``: the format
version, ``isa``, ``tvm``, ``built_at``, ``machines``: the targets its records were measured
on, ``models``: the models tuned into the database it was written from), then one object a workload (its name, reuse class, FLOPs, structural hash, module as TVM
JSON, its parameters' shapes, and its best few records: trace, argument info, run seconds, the
target measured on). The shapes let reuse rank a hub's workloads as donors before it decodes
any (``HubDatabase.listed``): a lookup decodes the donors it reaches, not every workload of a class.

Contracts:
- A hub is never written by a tune: it is opened as a temporary read-only donor database whose
  records are keyed to the run's target (its ISA class matched), marked imported; a transferred
  schedule is measured here like any other before it counts, and nothing of the hub is stored
  in the user's database unless measured there.
- Everything read is checked as an import is, never a crash: lines, fields and run times
  (``checked_run_secs``) when the hub is opened (a malformed one: one ``DatabaseError``);
  modules (``load_object_json``) and traces (``check_trace_json``) when a run looks their
  workload up (``HubDatabase``: a workload failing that is left out, with a warning).
- ``STORMDROP_HUB=off`` in the environment turns the default hub off (as ``--no-hub`` does);
  ``STORMDROP_HUB=PATH`` names another hub file.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
import tvm.s_tir.meta_schedule as ms
from tvm.target import Target

from stormdrop.errors import DatabaseError, one_line
from stormdrop.records import IMPORTED, MeasureResult, Phase, Record
from stormdrop.storage.database import Database, WorkloadEntry, candidate_key
from stormdrop.storage.identity import as_module
from stormdrop.storage.metaschedule import checked_run_secs
from stormdrop.tvm_compat.trace_json import check_trace_json, load_object_json

log = logging.getLogger(__name__)

FORMAT = 1
SHIPPED_DIR = Path(__file__).with_name("hubs")
SUFFIX = ".jsonl.gz"
PER_WORKLOAD = 3  # best records kept a workload: the best may not transfer, the next may


def isa_class(target: Target | str) -> str | None:
    """The ISA class whose hub serves ``target``: ``x86-avx512`` / ``x86-avx2`` (LLVM's CPU
    features of its ``mcpu``), ``aarch64`` (an aarch64 triple), ``cuda-<arch>``; None for others."""
    if isinstance(target, str):
        from stormdrop.target import from_canonical

        target = from_canonical(target)
    kind = target.kind.name
    if kind == "cuda":
        arch = str(target.attrs.get("arch", ""))
        return f"cuda-{arch}" if arch else None
    if kind != "llvm":
        return None
    triple = str(target.attrs.get("mtriple", "") or "")
    if triple.startswith(("aarch64", "arm64")):
        return "aarch64"
    from tvm.target import codegen

    try:
        features = set(codegen.llvm_get_cpu_features(target))
    except Exception:  # noqa: BLE001 - a target LLVM cannot describe has no hub
        return None
    if "avx512f" in features:
        return "x86-avx512"
    if "avx2" in features:
        return "x86-avx2"
    return None


def shipped_path(isa: str | None) -> Path | None:
    """The shipped hub file of an ISA class, if there is one."""
    if not isa:
        return None
    path = SHIPPED_DIR / f"{isa}{SUFFIX}"
    return path if path.is_file() else None


def hub_path(target: Target, hub: bool | str = True) -> Path | None:
    """The hub a run on ``target`` reads: ``hub`` a path (that file), True (``STORMDROP_HUB``
    when set: ``off`` or a path; else the shipped hub of the target's ISA class), False (none)."""
    if hub is False:
        return None
    if isinstance(hub, str):
        return Path(hub)
    env = os.environ.get("STORMDROP_HUB", "").strip()
    if env.lower() in ("off", "0", "no", "none"):
        return None
    if env:
        return Path(env)
    return shipped_path(isa_class(target))


@dataclass(frozen=True)
class HubInfo:
    """What a hub holds: its header and counts."""

    path: str
    isa: str
    tvm: str
    built_at: float
    machines: tuple[str, ...]
    models: tuple[str, ...]
    workloads: int
    records: int
    classes: tuple[str, ...]


@dataclass(frozen=True)
class HubLine:
    """A hub workload not decoded yet, as a donor search ranks it: its line's name, reuse class,
    FLOPs, structural hash and parameter shapes (``HubDatabase.reached`` decodes it)."""

    lineno: int
    name: str
    op_class: str
    flops: int
    shash: str
    shapes: list[tuple[int, ...]]


def _shapes_field(value: Any) -> list[tuple[int, ...]]:
    """A line's ``shapes``, checked: a list of lists of non-negative integers."""
    if not (isinstance(value, list) and all(isinstance(s, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in s) for s in value)):
        raise TypeError("shapes must be lists of non-negative integers")
    return [tuple(s) for s in value]


def hub_lines(path: Path) -> Iterable[tuple[int, dict]]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError) as e:
                    raise DatabaseError(f"hub {path} line {lineno}: malformed JSON: {one_line(e)}") from None
                if not isinstance(obj, dict):
                    raise DatabaseError(f"hub {path} line {lineno}: not an object")
                yield lineno, obj
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as e:
        raise DatabaseError(f"cannot read hub {path}: {one_line(e)}") from None


def hub_header(path: Path, lines: Iterable[tuple[int, dict]]) -> dict:
    for _, head in lines:
        if head.get("stormdrop_hub") != FORMAT or not isinstance(head.get("isa"), str):
            raise DatabaseError(f"hub {path}: not a stormdrop hub of format {FORMAT}")
        return head
    raise DatabaseError(f"hub {path}: empty")


def info(path: str | os.PathLike) -> HubInfo:
    """The header and counts of the hub file at ``path`` (``DatabaseError`` if it is not one)."""
    p = Path(path)
    lines = hub_lines(p)
    head = hub_header(p, lines)
    workloads = records = 0
    classes: set[str] = set()
    for _, wl in lines:
        workloads += 1
        records += len(wl.get("records") or [])
        classes.add(str(wl.get("op_class", "?")))
    return HubInfo(str(p), head["isa"], str(head.get("tvm", "?")), float(head.get("built_at", 0.0)),
                   tuple(str(m) for m in head.get("machines", [])), tuple(str(m) for m in head.get("models", [])),
                   workloads, records, tuple(sorted(classes)))


class HubDatabase(Database):
    """A hub opened as a donor database, lazily: opening reads and checks the hub's lines (JSON,
    fields, run times: a malformed line is one ``DatabaseError`` then), and a workload's module
    and traces are decoded, checked and put in a temporary SQLite file (removed at ``close``)
    only when ``find_workload`` asks for its structural hash (or ``workloads`` for all): a run
    pays for the workloads it has, not for the whole hub. The records are keyed to
    ``target_key`` and marked imported. A workload whose module or trace fails its check when
    decoded is left out, with a warning (a damaged line costs its donor, not the run).

    ``exact_only``: reuse looks a task's very workload up in a hub rather than listing the hub's
    workloads; it draws the related ones as well (transfers from the hub's shapes) where
    ``StormConfig.hub_transfers`` says so, and then decodes those alone (``workloads(keep)``)."""

    exact_only = True

    def __init__(self, path: str | os.PathLike, target_key: str) -> None:
        self.source = Path(path)
        self._target_key = target_key
        self._pending: dict[str, list[tuple[int, dict]]] = {}  # structural hash -> lines not decoded yet
        self._known: list[HubLine | None] = []  # each line with shapes, in file order (None: without them)
        self._ids: dict[int, int | None] = {}  # line number -> its workload id once decoded (None: left out)
        self._dir = tempfile.mkdtemp(prefix="stormdrop-hub-")
        try:
            self._index()
            super().__init__(os.path.join(self._dir, "hub.db"))
            self._c().execute("PRAGMA synchronous=OFF")  # a scratch copy, removed at close: no commit waits on the disk
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def _index(self) -> None:
        lines = hub_lines(self.source)
        head = hub_header(self.source, lines)
        self._versions = f"{IMPORTED}hub {head['isa']} tvm={head.get('tvm', '?')}"
        for lineno, wl in lines:
            try:
                if not all(isinstance(wl[k], str) for k in ("shash", "name", "op_class", "mod")):
                    raise TypeError("shash, name, op_class and mod must be strings")
                int(wl["flops"])
                for rec in wl.get("records") or []:
                    if not isinstance(rec["trace"], str) or not isinstance(rec.get("args_info", "[]"), str):
                        raise TypeError("a record's trace and args_info must be strings")
                    checked_run_secs(rec["run_secs"])
                    float(rec.get("measured_at", 0.0))
                shapes = _shapes_field(wl["shapes"]) if wl.get("shapes") is not None else None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise DatabaseError(f"hub {self.source} line {lineno}: malformed: {one_line(e)}") from None
            self._pending.setdefault(wl["shash"], []).append((lineno, wl))
            self._known.append(None if shapes is None else HubLine(lineno, wl["name"], wl["op_class"], int(wl["flops"]),
                                                                   wl["shash"], shapes))

    def _decode(self, lineno: int, wl: dict) -> None:
        try:
            mod = load_object_json(wl["mod"])  # checked: what would crash TVM is refused
            records = []
            for rec in wl.get("records") or []:
                check_trace_json(json.loads(rec["trace"]))
                records.append(rec)
        except (ValueError, TypeError, RecursionError) as e:
            log.warning("hub %s line %d (%s): left out, malformed: %s", self.source, lineno, wl["name"][:60],
                        one_line(e))
            self._ids[lineno] = None
            return
        with self.transaction():
            wid = self._ids[lineno] = super().commit_workload(mod, name=wl["name"], op_class=wl["op_class"], flops=int(wl["flops"]),
                                          mod_json=wl["mod"]).workload_id
            for rec in records:
                self.commit_record(Record(
                    workload_id=wid, target=self._target_key, candidate_key=candidate_key(rec["trace"]),
                    trace_json=rec["trace"], args_info_json=rec.get("args_info", "[]"),
                    result=MeasureResult(run_secs=checked_run_secs(rec["run_secs"])), phase=Phase.STORM,
                    measured_at=float(rec.get("measured_at", 0.0)), versions=self._versions))

    def _decode_pending(self, shash: str | None = None) -> None:
        keys = list(self._pending) if shash is None else [shash]
        with self.transaction():  # one commit for them all
            for key in keys:
                for lineno, wl in self._pending.pop(key, []):
                    self._decode(lineno, wl)

    def find_workload(self, mod: tvm.IRModule) -> WorkloadEntry | None:
        if self._pending:
            self._decode_pending(ms.utils.shash2hex(as_module(mod)))
        return super().find_workload(mod)

    def workloads(self, keep: Callable[[str], bool] | None = None) -> list[WorkloadEntry]:
        """As ``Database.workloads``: the lines of the op classes ``keep`` accepts decoded first
        (every line without it), the others left for later."""
        if keep is None:
            self._decode_pending()
        else:
            with self.transaction():
                for shash in [k for k, lines in self._pending.items() if any(keep(wl["op_class"]) for _, wl in lines)]:
                    self._decode_pending(shash)
        return super().workloads(keep)

    def listed(self, keep: Callable[[str], bool]) -> list[WorkloadEntry | HubLine]:
        """The workloads of the op classes ``keep`` accepts, in file order, as a donor search ranks
        them: those decoded already as entries, the others as their lines (``HubLine``) where the
        line gives their shapes, decoded now where it does not (a hub written before shapes were)."""
        kept = [k for k, line in enumerate(self._known) if line is None or keep(line.op_class)]
        if any(self._known[k] is None for k in kept):
            self.workloads(keep)  # those without shapes: decoded, as a listing did before
        entries = {e.workload_id: e for e in Database.workloads(self, keep)}
        out: list[WorkloadEntry | HubLine] = []
        for k in kept:
            line = self._known[k]
            if line is None:
                continue
            if line.lineno not in self._ids:
                out.append(line)
            elif (wid := self._ids[line.lineno]) is not None and wid in entries:
                out.append(entries.pop(wid))
        return out + list(entries.values())  # lines without shapes, decoded above

    def reached(self, line: HubLine) -> WorkloadEntry | None:
        """The workload of ``line``, decoded (with the other lines of its structural hash) if it was
        not; None when its module or a trace failed the check (left out, with a warning)."""
        if line.lineno not in self._ids:
            self._decode_pending(line.shash)
        wid = self._ids.get(line.lineno)
        return None if wid is None else self.workload(wid)

    def modules_of_class(self, word: str) -> list[tvm.IRModule]:
        """As ``Database.modules_of_class``, the lines not yet decoded read for their module alone (a
        malformed one left out: decoding it for ``find_workload`` says so)."""
        mods = super().modules_of_class(word)
        for lines in self._pending.values():
            for _, wl in lines:
                if word in wl["op_class"]:
                    with contextlib.suppress(ValueError, TypeError, RecursionError):
                        mods.append(load_object_json(wl["mod"]))
        return mods

    def close(self) -> None:
        try:
            super().close()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)


def open_hub(target: Target, hub: bool | str = True) -> HubDatabase | None:
    """The hub a run on ``target`` draws donors from (``hub_path``), opened, or None."""
    path = hub_path(target, hub)
    if path is None:
        return None
    if not path.is_file():
        raise DatabaseError(f"hub not found: {path}")
    from stormdrop.target import canonical

    return HubDatabase(path, canonical(target))
