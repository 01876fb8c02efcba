"""The ``stormdrop`` command's options: the argument parser, and the checks that turn a value
no run could use (a budget of 0, NaN, a count below 1) into one error line before any work."""

from __future__ import annotations

import argparse
import math

from stormdrop import __version__
from stormdrop.errors import SpecError


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
    t.add_argument("--warmup-ms", type=_positive(float), default=0.0,
                   help="each candidate runs untimed for this long before its samples, the cores busy as "
                        "inside a model (default 0: off)")
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
    t.add_argument("--hub", default=True, metavar="PATH",
                   help="draw reuse donors from this schedule hub file (default: the hub shipped for the target's "
                        "ISA class, see `stormdrop hub info`; read only)")
    t.add_argument("--no-hub", dest="hub", action="store_false",
                   help="no schedule hub (STORMDROP_HUB=off in the environment does the same)")
    t.add_argument("--phases", default="reuse,storm,raindrop",
                   help="which phases run, in this order: 'reuse' = transfer only, 'reuse,raindrop' = transfer, "
                        "then Droplet from the best transfer (default: reuse,storm,raindrop)")
    t.add_argument("--no-prior", dest="prior", action="store_false",
                   help="x86: start the cost model cold instead of from the shipped prior")
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
    t.add_argument("--final-candidates", type=_positive(int, 1), default=1, metavar="K",
                   help="kernel: report whichever of its K best records runs fastest timed side by side in turns "
                        "(default 1: the best as stored; measured to gain little, RESULTS.md)")
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

    h = sub.add_parser("hub", help="the shipped schedule hub (tuned schedules a tune reuses by default)")
    hsub = h.add_subparsers(dest="hub_command", required=True, parser_class=_Parser)
    hi = hsub.add_parser("info", help="what the hub for a target holds and where it was measured")
    hi.add_argument("--target", default=None, help="TVM target (default: host CPU)")
    hi.add_argument("path", nargs="?", default=None, metavar="PATH", help="a hub file (default: the target's)")
    return p
