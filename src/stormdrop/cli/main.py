"""The ``stormdrop`` command. Bad input: one error line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any

from stormdrop import stop
from stormdrop.cli.options import build_parser
from stormdrop.errors import SpecError, StormdropError
from stormdrop.measure.tracker import RpcConfig

log = logging.getLogger("stormdrop")


def _check_output(path: str | None, flag: str) -> None:
    """``flag``'s file can be written (its directory exists and is writable): checked before any work."""
    if not path:
        return
    where = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise SpecError(f"{flag}: {path} is a directory")
    if not os.path.isdir(where):
        raise SpecError(f"{flag}: no directory {where}")
    if not os.access(where, os.W_OK):
        raise SpecError(f"{flag}: cannot write in {where}")


def _write_json(path: str, obj: object) -> None:
    """``obj`` as JSON at ``path``, whole or not at all: written beside it, then renamed over it."""
    where = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=where, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _cmd_tune(args: argparse.Namespace) -> int:
    from stormdrop.report.tables import task_table
    from stormdrop.target import describe, parse_target
    from stormdrop.tuning.kernel_tune import tune_kernel
    from stormdrop.tuning.options import KernelOptions
    from stormdrop.workloads import parse_kernel

    _check_output(args.json, "--json")
    _check_output(args.output, "--output")
    if args.model:
        return _cmd_tune_model(args)
    kernel = parse_kernel(args.kernel)  # validate input before any slow work
    target = parse_target(args.target)
    _check_runnable(target, args)
    options = KernelOptions(trials=64 if args.trials is None else args.trials, exploit_trials=args.exploit_trials,
                            time_budget=args.time_budget, seed=args.seed, search=_search_options(args),
                            measure=_measure_config(args), progress=not args.no_progress and sys.stderr.isatty(),
                            final_candidates=args.final_candidates)
    log.info("tuning %s on %s", kernel.name, describe(target))
    result = tune_kernel(kernel, options, target=target, db=args.db)
    print(task_table(result.tasks))
    print(f"target: {describe(target)}   tuning: {result.tuning_s:.1f} s")
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def _search_options(args: argparse.Namespace):
    from stormdrop.search.options import SearchOptions
    from stormdrop.search.phases import parse_phases
    from stormdrop.search.storm import StormConfig

    return SearchOptions(phases=parse_phases(args.phases), raindrop=_raindrop_config(args),
                         storm=StormConfig(batch_size=max(1, args.batch_size), prior=args.prior),
                         reuse=max(0, args.reuse), reuse_from=tuple(args.reuse_from), hub=args.hub)


def _raindrop_config(args: argparse.Namespace):
    from stormdrop.search.raindrop import RaindropConfig

    if not 0 < args.pvalue <= 1:
        raise SpecError(f"--pvalue must be in (0, 1], got {args.pvalue}")
    if args.register_tiles < 0:
        raise SpecError(f"--register-tiles must be >= 0, got {args.register_tiles}")
    return RaindropConfig(pvalue=args.pvalue, register_tiles=args.register_tiles)


def _check_runnable(target: Any, args: argparse.Namespace) -> None:
    """A target whose candidates cannot be measured from here (another CPU's, without an RPC device or
    a cross compiler) is refused before any work."""
    from stormdrop.tvm_compat.cross import unrunnable

    why = unrunnable(target, remote=_rpc(args) is not None)
    if why:
        raise SpecError(f"--target: {why}")


def _measure_config(args: argparse.Namespace):
    from stormdrop.measure.gateway import MeasureConfig

    return MeasureConfig(repeat=max(1, args.repeat), min_repeat_ms=args.min_repeat_ms, warmup_ms=args.warmup_ms,
                         cache_flush=args.cache_flush, build_timeout_s=args.build_timeout,
                         run_timeout_s=args.run_timeout, rpc=_rpc(args), rpc_devices=args.rpc_devices)


def _lowering(args: argparse.Namespace):
    from stormdrop.lowering.pipeline import Lowering

    return Lowering(layout=args.layout, fast_math=args.fast_math, winograd=args.winograd,
                    combine_matmuls=args.combine_matmuls)


def _rpc(args: argparse.Namespace) -> RpcConfig | None:
    if not (args.rpc_tracker or args.rpc_key):
        return None
    host, _, port = (args.rpc_tracker or "").rpartition(":")
    if not host or not port.isdigit() or not args.rpc_key:
        raise SpecError("--rpc-tracker HOST:PORT and --rpc-key KEY go together")
    return RpcConfig(host, int(port), args.rpc_key, retry_s=getattr(args, "rpc_retry", 120.0),
                     session_timeout_s=getattr(args, "rpc_session_timeout", 600.0),
                     join_every_s=getattr(args, "rpc_join_every", 60.0))


def _cmd_tune_model(args: argparse.Namespace) -> int:
    from stormdrop.model.options import ModelOptions
    from stormdrop.model.tune import tune_model
    from stormdrop.report.tables import faster_text, task_table
    from stormdrop.target import describe, parse_target
    from stormdrop.workloads.models import load_model, parse_input_shapes

    target = parse_target(args.target)
    _check_runnable(target, args)
    search = _search_options(args)  # validate options before the model is loaded
    model = load_model(args.model, input_shapes=parse_input_shapes(args.input_shape), batch=args.batch,
                       resolution=args.resolution, seq_len=args.seq_len, seed=args.seed)
    # --time-budget without --trials: the budget (and --trials-per-task) decide, no global cap
    trials = args.trials if args.trials is not None else (None if args.time_budget else 1000)
    options = ModelOptions(trials=trials, trials_per_task=max(2, args.trials_per_task), time_budget=args.time_budget,
                           seed=args.seed, search=search, measure=_measure_config(args), lowering=_lowering(args),
                           output=args.output, untuned=args.untuned, in_model_candidates=args.in_model_candidates,
                           progress=not args.no_progress)
    result = tune_model(model, options, target=target, db=args.db)
    print(task_table(result.tasks))
    if result.deployed:
        print(f"in-model choice: {len(result.deployed)} task(s) deploy another of their best records: model "
              f"{result.choice_s['chosen_s'] * 1e3:.3f} ms (best records: {result.choice_s['best_s'] * 1e3:.3f} ms)")
    lat = result.latency_s
    fmt = lambda v: "n/a" if v is None else f"{v * 1e3:.3f} ms"  # noqa: E731
    untuned = "" if lat.get("untuned") is None else f"untuned {fmt(lat['untuned'])}, "
    print(f"model {result.model} on {describe(target)}: tuned {fmt(lat.get('tuned'))}, "
          f"{untuned}onnxruntime {fmt(lat.get('onnxruntime'))}, openvino {fmt(lat.get('openvino'))}; "
          f"tuning {result.tuning_s:.1f} s (stopped: {result.stopped_by}); output matches the reference (max |diff| {result.max_abs_error:.2g})")
    if result.stages_s:
        words = {"tasks": "tasks extracted", "set_up": "set-up", "search": "search and verification",
                 "compile": "compile"}
        print("tuning time: " + ", ".join(f"{words.get(k, k)} {v:.1f} s" for k, v in result.stages_s.items()))
    if result.faster_after_s:  # from each task's best so far, scaled to the measured model
        print("time to fast: " + faster_text(result.faster_after_s))
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from stormdrop.model.bench import bench_model, format_bench
    from stormdrop.target import parse_target
    from stormdrop.workloads.models import load_model, parse_input_shapes

    _check_output(args.json, "--json")
    target = parse_target(args.target)
    _check_runnable(target, args)
    model = load_model(args.model, input_shapes=parse_input_shapes(args.input_shape), batch=args.batch,
                       resolution=args.resolution, seq_len=args.seq_len, seed=args.seed)
    with _open_db(args.db) as db:
        result = bench_model(model, db=db, target=target, seed=args.seed, lowering=_lowering(args), rpc=_rpc(args))
    print(format_bench(result))
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from stormdrop.workloads.zoo import export_zoo_model, zoo_names

    if args.zoo_command == "list":
        print("\n".join(zoo_names()))
        return 0
    kw = {k: v for k, v in (("batch", args.batch), ("resolution", args.resolution), ("seq_len", args.seq_len)) if v}
    export_zoo_model(args.name, args.out, **kw)
    print(f"wrote {args.name} to {args.out}")
    return 0


def _open_db(path: str | None, must_exist: bool = True, read_only: bool = False):
    """``read_only``: a command that only reads (never creates, upgrades or writes beside the file)."""
    from stormdrop.storage.database import Database, default_db_path

    path = path or default_db_path()
    if must_exist and not os.path.exists(path):
        raise SpecError(f"--db: no database at {path}")
    return Database(path, read_only=read_only)


def _cmd_show(args: argparse.Namespace) -> int:
    from stormdrop.report.tables import format_best_table

    with _open_db(args.db, read_only=True) as db:
        print(format_best_table(db))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from stormdrop.report.page import write_report
    from stormdrop.storage.database import canonical_target, default_db_path

    target = canonical_target(args.target) if args.target else None
    out = write_report(args.db or default_db_path(), args.out, model=args.model, workloads=args.workload or (),
                       target=target, compare=args.compare)
    print(f"wrote {out}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from stormdrop.tvm_compat import isolated

    with _open_db(args.db, read_only=True) as db:  # refused here with its own line if it cannot be read
        path = db.path
    scratch = f".stormdrop-export-{os.getpid()}-{secrets.token_hex(4)}"  # the child writes here first
    try:
        n = int(isolated.run("export", path, args.out, "", scratch, what=path))  # TVM replays traces: in a child
    finally:  # a child killed before its own cleanup leaves its files
        shutil.rmtree(os.path.join(args.out, scratch), ignore_errors=True)
    print(f"exported {n} records to {args.out}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from stormdrop.storage.metaschedule import import_records, read_metaschedule
    from stormdrop.tvm_compat import isolated

    isolated.run("read_metaschedule", args.dir, what=args.dir)  # TVM reads the traces: first in a child
    records = read_metaschedule(args.dir)  # refused before the database is created or opened
    with _open_db(args.db, must_exist=False) as db:
        n = import_records(db, records)
    print(f"imported {n} records from {args.dir}")
    return 0


def _cmd_hub(args: argparse.Namespace) -> int:
    import datetime

    from stormdrop.storage import hub
    from stormdrop.target import describe, from_canonical, parse_target

    target = parse_target(args.target)
    path = args.path or hub.hub_path(target)
    if path is None:
        isa = hub.isa_class(target)
        print(f"no schedule hub for {describe(target)} (ISA class {isa or 'unknown'}; STORMDROP_HUB="
              f"{os.environ.get('STORMDROP_HUB', '')!r}); shipped: "
              + (", ".join(sorted(p.name for p in hub.SHIPPED_DIR.glob("*" + hub.SUFFIX))) or "none"))
        return 0
    if not os.path.isfile(path):
        raise SpecError(f"no hub file at {path}")
    got = hub.info(path)
    built = datetime.datetime.fromtimestamp(got.built_at, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"hub: {got.path}\nISA class: {got.isa}   TVM: {got.tvm}   built: {built}\n"
          f"workloads: {got.workloads}   records: {got.records}\n"
          f"measured on: {'; '.join(describe(from_canonical(m)) for m in got.machines) or '-'}\n"
          f"models: {', '.join(got.models) or '-'}\n"
          f"classes: {', '.join(got.classes)}")
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    from stormdrop.workloads import builtin_operators

    for name, params in builtin_operators().items():
        print(f"{name}:{params}")
    print("path/to/file.py:function   (returns a PrimFunc, an IRModule or a list of TE tensors)")
    return 0


COMMANDS = {"tune": _cmd_tune, "bench": _cmd_bench, "show": _cmd_show, "report": _cmd_report, "export": _cmd_export, "import": _cmd_import, "ops": _cmd_ops,
            "zoo": _cmd_zoo, "hub": _cmd_hub}


def _stopped(signum: int) -> int:
    """The one line and exit code of a run the user stopped (Ctrl-C: 130, SIGTERM: 143)."""
    word, code = ("terminated", 143) if signum == signal.SIGTERM else ("interrupted", 130)
    print(f"stormdrop: {word}; every measured record is kept in the database", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    verbose = 0
    if threading.current_thread() is threading.main_thread():
        stop.install()
        # `kill -USR1 <pid>` prints every thread's Python stack to stderr (where a stuck run is) and goes on
        # (the process's own stderr: a caller may have replaced sys.stderr with a file without a descriptor)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True, chain=False)
    try:
        args = build_parser().parse_args(argv)
        verbose = args.verbose
        _setup_logging(verbose)
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return _stopped(stop.requested() or signal.SIGINT)
    except stop.Terminated:
        return _stopped(signal.SIGTERM)
    except Exception as err:  # noqa: BLE001 - never a traceback for the user, unless -v
        if stop.requested():  # the stop came back out of TVM as another error (see stormdrop.stop)
            return _stopped(stop.requested())
        if isinstance(err, StormdropError):
            print(f"stormdrop: error: {err}", file=sys.stderr)
            return err.exit_code
        if verbose:
            raise
        first = (str(err).strip().splitlines() or [""])[-1]
        print(f"stormdrop: error: {type(err).__name__}: {first} (run with -v for details)", file=sys.stderr)
        return 1


def _setup_logging(verbose: int) -> None:
    from tqdm.contrib.logging import _TqdmLoggingHandler

    handler = _TqdmLoggingHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING - 10 * min(verbose, 2))
    log.propagate = False


if __name__ == "__main__":
    sys.exit(main())
