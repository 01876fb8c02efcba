"""The ``stormdrop`` command. Bad input: one error line and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading

from . import __version__
from .errors import SpecError, StormdropError

log = logging.getLogger("stormdrop")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage too)
        raise SpecError(message)


def _positive(kind: type, minimum: float = 0, strict: bool = False):
    """An option's parser: a finite ``kind`` of at least ``minimum`` (above it where ``strict``)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            bound = f"above {minimum:g}" if strict else f"at least {minimum:g}"
            raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text!r}")
        return value

    return parse


_SECONDS = _positive(float, 0, strict=True)  # a budget, a timeout: 0 would mean none, or nothing


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stormdrop", description="Explore as a storm, exploit as a raindrop: "
                "an auto-scheduler for deep-learning kernels on Apache TVM.")
    p.add_argument("--version", action="version", version=f"stormdrop {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("tune", help="tune a kernel or a whole model")
    what = t.add_mutually_exclusive_group(required=True)
    what.add_argument("--kernel", metavar="SPEC",
                      help="built-in 'matmul:M=512,N=512,K=512' (see `stormdrop ops`) or 'file.py:function'")
    what.add_argument("--model", metavar="NAME|PATH", help="a zoo name (see `stormdrop zoo list`) or an .onnx file")
    t.add_argument("--target", default=None, help='TVM target as JSON dict or tag, "llvm" or "cuda" (default: host CPU)')
    t.add_argument("--trials", type=_positive(int), default=None,
                   help="kernel: storm (exploration) candidates (default 64); model: all tasks together "
                        "(default 1000, or no cap when --time-budget is given)")
    t.add_argument("--exploit-trials", type=_positive(int), default=None,
                   help="raindrop (exploitation) candidates at most (default: same as --trials)")
    t.add_argument("--time-budget", type=_SECONDS, default=None, metavar="SECONDS",
                   help="stop tuning after this many seconds (then verify, compile and time the best)")
    t.add_argument("--db", default=None, help="SQLite database (default: per-user data directory)")
    t.add_argument("--json", default=None, metavar="PATH", help="write the result as JSON")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--pvalue", type=float, default=0.05, help="raindrop acceptance threshold (t-test)")
    t.add_argument("--register-tiles", type=int, default=8, metavar="N",
                   help="CPU: the raindrop first measures up to N register-blocked micro-kernel shapes of the "
                        "best schedule's innermost tiles (0: off)")
    t.add_argument("--batch-size", type=_positive(int, 1), default=16, help="storm candidates per batch")
    t.add_argument("--repeat", type=_positive(int, 1), default=5,
                   help="timed samples per candidate (at least 2: the raindrop's t-test compares them)")
    t.add_argument("--min-repeat-ms", type=_positive(float), default=20.0)
    t.add_argument("--cache-flush", action=argparse.BooleanOptionalAction, default=None,
                   help="time each sample with the CPU caches flushed of the kernel's weights and output, as "
                        "inside a model (default: on for --model on a CPU, off for --kernel)")
    t.add_argument("--build-timeout", type=_SECONDS, default=60.0)
    t.add_argument("--run-timeout", type=_SECONDS, default=30.0)
    t.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT", help="time on a device of this RPC tracker")
    t.add_argument("--rpc-key", default=None, help="device key at the RPC tracker")
    t.add_argument("--rpc-devices", type=_positive(int), default=0, metavar="N",
                   help="time on at most N devices under the key at once (default: every free one)")
    t.add_argument("--rpc-retry", type=_SECONDS, default=120.0, metavar="SECONDS",
                   help="how long a lost RPC session is tried again (a tracker or server restarted) before "
                        "that device counts as lost (default 120)")
    t.add_argument("--rpc-session-timeout", type=_SECONDS, default=600.0, metavar="SECONDS",
                   help="the session length asked of the tracker; a session is renewed before it ends (default 600)")
    t.add_argument("--rpc-join-every", type=_SECONDS, default=60.0, metavar="SECONDS",
                   help="how often the tracker is asked for devices freed since the start, which then join "
                        "(between batches; default 60)")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--reuse", type=int, default=8, metavar="N",
                   help="first measure the best schedules of up to N same-class workloads in the database (0: off)")
    t.add_argument("--no-reuse", dest="reuse", action="store_const", const=0, help="same as --reuse 0")
    t.add_argument("--reuse-from", action="append", default=[], metavar="PATH",
                   help="also draw reuse donors from this database (read only; repeatable)")
    t.add_argument("--phases", default="reuse,storm,raindrop",
                   help="which phases run, in this order: 'reuse' = transfer only, 'reuse,raindrop' = transfer, "
                        "then Droplet from the best transfer (default: reuse,storm,raindrop)")
    t.add_argument("--no-prior", dest="prior", action="store_false",
                   help="x86: start the storm's cost model cold instead of from the shipped prior")
    t.add_argument("--trials-per-task", type=_positive(int, 1), default=128,
                   help="model: at most this many candidates per task, half storm, half raindrop")
    t.add_argument("--layout", default="auto", choices=["auto", "nhwc", "blocked", "nchw"],
                   help="model: convolutions' layout (auto: NHWC on CPUs; blocked: NCHW16c on AVX-512, "
                        "NCHW8c on AVX2; nchw: as the model has them)")
    t.add_argument("--no-fast-math", dest="fast_math", action="store_false",
                   help="model: keep libm's scalar erf/exp/tanh (default: vectorizable approximations on CPUs)")
    t.add_argument("--winograd", default="auto", choices=["auto", "off", "2", "4"],
                   help="model: 3x3 stride-1 convolutions as Winograd F(m x m, 3 x 3) on CPUs (auto: m=4 for outputs "
                        "of at least 28x28, m=2 down to 14x14; 2/4: every such convolution; off: all direct)")
    t.add_argument("--combine-matmuls", action="store_true",
                   help="model: matmuls of one input by constant weights (Q/K/V) as one GEMM and a split")
    t.add_argument("--output", default=None, metavar="PATH", help="model: write the compiled model (.so)")
    t.add_argument("--in-model-candidates", type=_positive(int, 1), default=1, metavar="K",
                   help="model: each task deploys whichever of its K best records runs fastest inside the compiled "
                        "model, each kernel timed in place (K model compiles after tuning; 1: the best as tuned). "
                        "Default 1 (off): measured to gain little (RESULTS.md), and its compiles come out of "
                        "--time-budget")
    t.add_argument("--untuned", action="store_true",
                   help="model: compile and time the untuned build too (naive loops on CPUs: minutes for BERT-base; "
                        "always run as the reference for a model without an ONNX graph)")
    t.add_argument("--input-shape", action="append", default=None, metavar="NAME:1x3x224x224")
    t.add_argument("--batch", type=_positive(int, 1), default=1)
    t.add_argument("--resolution", type=_positive(int, 1), default=None, help="zoo image models: input size")
    t.add_argument("--seq-len", type=_positive(int, 1), default=None, help="zoo BERT: sequence length")

    z = sub.add_parser("zoo", help="the built-in model zoo")
    zsub = z.add_subparsers(dest="zoo_command", required=True, parser_class=_Parser)
    zsub.add_parser("list", help="list the zoo models")
    ze = zsub.add_parser("export", help="write a zoo model as ONNX")
    ze.add_argument("name")
    ze.add_argument("out")
    ze.add_argument("--batch", type=_positive(int, 1), default=1)
    ze.add_argument("--resolution", type=_positive(int, 1), default=None)
    ze.add_argument("--seq-len", type=_positive(int, 1), default=None)

    b = sub.add_parser("bench", help="a model side by side: untuned, tuned (from the database), ONNX Runtime")
    b.add_argument("--model", required=True, metavar="NAME|PATH")
    b.add_argument("--db", default=None)
    b.add_argument("--target", default=None)
    b.add_argument("--json", default=None, metavar="PATH")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--layout", default="auto", choices=["auto", "nhwc", "blocked", "nchw"])
    b.add_argument("--no-fast-math", dest="fast_math", action="store_false")
    b.add_argument("--winograd", default="auto", choices=["auto", "off", "2", "4"])
    b.add_argument("--combine-matmuls", action="store_true")
    b.add_argument("--rpc-tracker", default=None, metavar="HOST:PORT",
                   help="time the untuned and tuned builds on a device of this tracker")
    b.add_argument("--rpc-key", default=None)
    b.add_argument("--input-shape", action="append", default=None, metavar="NAME:1x3x224x224")
    b.add_argument("--batch", type=_positive(int, 1), default=1)
    b.add_argument("--resolution", type=_positive(int, 1), default=None)
    b.add_argument("--seq-len", type=_positive(int, 1), default=None)

    s = sub.add_parser("show", help="best record per workload")
    s.add_argument("--db", default=None)

    r = sub.add_parser("report", help="an HTML page with plots of the tuning runs in a database")
    r.add_argument("--db", default=None)
    r.add_argument("--out", required=True, metavar="DIR", help="writes DIR/index.html (plots embedded)")
    pick = r.add_mutually_exclusive_group()
    pick.add_argument("--model", default=None, metavar="NAME", help="a model run in the database (its tasks)")
    pick.add_argument("--workload", action="append", default=None, metavar="ID|NAME",
                      help="only these workloads (repeatable; default: every workload)")
    r.add_argument("--target", default=None, help="the target's records (default: the run's, or the most common)")
    r.add_argument("--compare", default=None, metavar="PATH",
                   help="another stormdrop database, or a MetaSchedule JSON database directory, overlaid")

    e = sub.add_parser("export", help="write the database in another format")
    e.add_argument("--db", default=None)
    e.add_argument("--format", default="metaschedule", choices=["metaschedule"])
    e.add_argument("--out", required=True, metavar="DIR")

    i = sub.add_parser("import", help="read a MetaSchedule JSON database directory")
    i.add_argument("--db", default=None)
    i.add_argument("dir", metavar="DIR")

    sub.add_parser("ops", help="list the built-in operators and their parameters")
    return p


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
    from .kernel_tune import tune_kernel
    from .phases import parse_phases
    from .report import task_table
    from .storm import StormConfig
    from .target import describe, parse_target
    from .workloads import parse_kernel

    _check_output(args.json, "--json")
    _check_output(args.output, "--output")
    if args.model:
        return _cmd_tune_model(args)
    kernel = parse_kernel(args.kernel)  # validate input before any slow work
    target = parse_target(args.target)
    phases = parse_phases(args.phases)
    raindrop = _raindrop_config(args)
    measure = _measure_config(args)
    log.info("tuning %s on %s", kernel.name, describe(target))
    result = tune_kernel(kernel, target=target, trials=64 if args.trials is None else args.trials, exploit_trials=args.exploit_trials,
                         time_budget=args.time_budget, db=args.db, seed=args.seed, pvalue=args.pvalue,
                         measure=measure, storm=StormConfig(batch_size=max(1, args.batch_size), prior=args.prior),
                         raindrop=raindrop,
                         reuse=max(0, args.reuse), phases=phases, reuse_from=args.reuse_from,
                         progress=not args.no_progress and sys.stderr.isatty())
    print(task_table(result.tasks))
    print(f"target: {describe(target)}   tuning: {result.tuning_s:.1f} s")
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def _raindrop_config(args: argparse.Namespace):
    from .raindrop import RaindropConfig

    if not 0 < args.pvalue <= 1:
        raise SpecError(f"--pvalue must be in (0, 1], got {args.pvalue}")
    if args.register_tiles < 0:
        raise SpecError(f"--register-tiles must be >= 0, got {args.register_tiles}")
    return RaindropConfig(pvalue=args.pvalue, register_tiles=args.register_tiles)


def _measure_config(args: argparse.Namespace):
    from .measure import MeasureConfig

    return MeasureConfig(repeat=max(1, args.repeat), min_repeat_ms=args.min_repeat_ms,
                         cache_flush=args.cache_flush, build_timeout_s=args.build_timeout,
                         run_timeout_s=args.run_timeout, rpc=_rpc(args), rpc_devices=args.rpc_devices)


def _lowering(args: argparse.Namespace):
    from .lowering import Lowering

    return Lowering(layout=args.layout, fast_math=args.fast_math, winograd=args.winograd,
                    combine_matmuls=args.combine_matmuls)


def _rpc(args: argparse.Namespace) -> dict | None:
    if not (args.rpc_tracker or args.rpc_key):
        return None
    host, _, port = (args.rpc_tracker or "").rpartition(":")
    if not host or not port.isdigit() or not args.rpc_key:
        raise SpecError("--rpc-tracker HOST:PORT and --rpc-key KEY go together")
    return {"host": host, "port": int(port), "key": args.rpc_key, "retry_s": getattr(args, "rpc_retry", 120.0),
            "session_timeout": getattr(args, "rpc_session_timeout", 600.0),
            "join_every_s": getattr(args, "rpc_join_every", 60.0)}


def _cmd_tune_model(args: argparse.Namespace) -> int:
    from .model_tune import tune_model
    from .phases import parse_phases
    from .report import task_table
    from .storm import StormConfig
    from .target import describe, parse_target
    from .workloads.models import load_model, parse_input_shapes

    target = parse_target(args.target)
    raindrop = _raindrop_config(args)
    phases = parse_phases(args.phases)
    model = load_model(args.model, input_shapes=parse_input_shapes(args.input_shape), batch=args.batch,
                       resolution=args.resolution, seq_len=args.seq_len, seed=args.seed)
    # --time-budget without --trials: the budget (and --trials-per-task) decide, no global cap
    trials = args.trials if args.trials is not None else (None if args.time_budget else 1000)
    result = tune_model(model, target=target, trials=trials,
                        trials_per_task=max(2, args.trials_per_task), time_budget=args.time_budget, db=args.db,
                        seed=args.seed, pvalue=args.pvalue, output=args.output, measure=_measure_config(args),
                        storm=StormConfig(batch_size=max(1, args.batch_size), prior=args.prior),
                        reuse=max(0, args.reuse), lowering=_lowering(args), raindrop=raindrop, progress=not args.no_progress, phases=phases,
                        reuse_from=args.reuse_from, untuned=args.untuned,
                        in_model_candidates=args.in_model_candidates)
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
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .model_bench import bench_model, format_bench
    from .target import parse_target
    from .workloads.models import load_model, parse_input_shapes

    _check_output(args.json, "--json")
    target = parse_target(args.target)
    model = load_model(args.model, input_shapes=parse_input_shapes(args.input_shape), batch=args.batch,
                       resolution=args.resolution, seq_len=args.seq_len, seed=args.seed)
    with _open_db(args.db) as db:
        result = bench_model(model, db=db, target=target, seed=args.seed, lowering=_lowering(args), rpc=_rpc(args))
    print(format_bench(result))
    if args.json:
        _write_json(args.json, result.to_json())
    return 0


def _cmd_zoo(args: argparse.Namespace) -> int:
    from .workloads.zoo import export_zoo_model, zoo_names

    if args.zoo_command == "list":
        print("\n".join(zoo_names()))
        return 0
    kw = {k: v for k, v in (("batch", args.batch), ("resolution", args.resolution), ("seq_len", args.seq_len)) if v}
    export_zoo_model(args.name, args.out, **kw)
    print(f"wrote {args.name} to {args.out}")
    return 0


def _open_db(path: str | None, must_exist: bool = True, read_only: bool = False):
    """``read_only``: a command that only reads (never creates, upgrades or writes beside the file)."""
    from .database import Database, default_db_path

    path = path or default_db_path()
    if must_exist and not os.path.exists(path):
        raise SpecError(f"--db: no database at {path}")
    return Database(path, read_only=read_only)


def _cmd_show(args: argparse.Namespace) -> int:
    from .report import format_best_table

    with _open_db(args.db, read_only=True) as db:
        print(format_best_table(db))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .database import canonical_target, default_db_path
    from .report_page import write_report

    target = canonical_target(args.target) if args.target else None
    out = write_report(args.db or default_db_path(), args.out, model=args.model, workloads=args.workload or (),
                       target=target, compare=args.compare)
    print(f"wrote {out}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from . import isolated

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
    from . import isolated
    from ._ms_json import import_records, read_metaschedule

    isolated.run("read_metaschedule", args.dir, what=args.dir)  # TVM reads the traces: first in a child
    records = read_metaschedule(args.dir)  # refused before the database is created or opened
    with _open_db(args.db, must_exist=False) as db:
        n = import_records(db, records)
    print(f"imported {n} records from {args.dir}")
    return 0


def _cmd_ops(args: argparse.Namespace) -> int:
    from .workloads import builtin_operators

    for name, params in builtin_operators().items():
        print(f"{name}:{params}")
    print("path/to/file.py:function   (returns a PrimFunc, an IRModule or a list of TE tensors)")
    return 0


COMMANDS = {"tune": _cmd_tune, "bench": _cmd_bench, "show": _cmd_show, "report": _cmd_report, "export": _cmd_export, "import": _cmd_import, "ops": _cmd_ops,
            "zoo": _cmd_zoo}


class _Terminated(Exception):
    """SIGTERM (a batch scheduler's stop): handled as Ctrl-C is."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise _Terminated()


def main(argv: list[str] | None = None) -> int:
    verbose = 0
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        args = build_parser().parse_args(argv)
        verbose = args.verbose
        _setup_logging(verbose)
        return COMMANDS[args.command](args)
    except StormdropError as err:
        print(f"stormdrop: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("stormdrop: interrupted; every measured record is kept in the database", file=sys.stderr)
        return 130
    except _Terminated:
        print("stormdrop: terminated; every measured record is kept in the database", file=sys.stderr)
        return 143
    except Exception as err:  # noqa: BLE001 - never a traceback for the user, unless -v
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
