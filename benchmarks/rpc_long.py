"""A long tune through a TVM RPC tracker while its servers and the tracker itself are killed.

A tracker and ``--servers`` loopback servers under one key; the tracker ends every session after
``--session-timeout`` s, so the runners renew theirs again and again. ``stormdrop tune`` (a model by
default, its final timing on the remote device) runs for ``--minutes`` through them. Every
``--server-every`` s one server is SIGKILLed (each in turn) and a new one is started ``--down`` s later
on a new port (it joins the run); once, at ``--tracker-at`` of the run, the tracker is SIGKILLed and
started again ``--down`` s later on its port. The database's rows are read just before every kill.
Printed at the end:

- records lost: rows present before a kill that are missing, or changed, at the end (a retried run
  timeout or runner crash may change; nothing else may);
- failures by kind, and the spurious ones: a failure whose message names the RPC, a session, the
  tracker or a connection (the device's fault, not the candidate's: it must not be stored);
- the run's exit status, its records, and the model's latency as timed on the remote device.

Usage: ``python benchmarks/rpc_long.py [--minutes 65] [--servers 2] [--json PATH] [--out RESULTS.md]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loopback import Loopback  # noqa: E402
from _peers import emit  # noqa: E402
from faults import lost, rows  # noqa: E402

KEY = "rpc-long"
SPURIOUS = re.compile(r"rpc|session|tracker|connect|socket|broken pipe|device ?lost|devicegone", re.IGNORECASE)


def failures(db: str) -> tuple[Counter, list[str], int]:
    """(failures by kind, the spurious failures' messages, all records)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        got = con.execute("SELECT error, error_msg FROM records").fetchall()
    finally:
        con.close()
    bad = [(e, m or "") for e, m in got if e]
    return Counter(e for e, _ in bad), [f"{e}: {m[:200]}" for e, m in bad if SPURIOUS.search(m)], len(got)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=65)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--session-timeout", type=int, default=300)
    p.add_argument("--server-every", type=float, default=900, help="seconds between server kills")
    p.add_argument("--tracker-at", type=float, default=0.5, help="fraction of the run at which the tracker dies")
    p.add_argument("--down", type=float, default=10, help="seconds a killed process stays down")
    p.add_argument("--tune", default="--model resnet18 --resolution 64",
                   help="what to tune (stormdrop tune arguments; the time budget and RPC flags are added)")
    p.add_argument("--keep", default=None, help="keep the database and logs in this folder")
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="append the table to this Markdown file")
    args = p.parse_args(argv)

    work = args.keep or tempfile.mkdtemp(prefix="rpc-long-")
    os.makedirs(work, exist_ok=True)
    db, out_json = os.path.join(work, "long.db"), os.path.join(work, "tune.json")
    budget = args.minutes * 60
    cluster = Loopback(work, KEY, args.servers)
    cmd = [sys.executable, "-m", "stormdrop", "-v", "tune", *args.tune.split(), "--time-budget", str(budget),
           "--rpc-tracker", f"127.0.0.1:{cluster.port}", "--rpc-key", KEY, "--rpc-session-timeout",
           str(args.session_timeout), "--db", db, "--json", out_json, "--no-progress"]
    events, snapshots = [], []
    t0 = time.monotonic()
    try:
        with open(os.path.join(work, "tune.log"), "ab") as log:
            tune = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        next_server, tracker_due, victim = args.server_every, args.tracker_at * budget, 0
        while tune.poll() is None:
            now = time.monotonic() - t0
            if now >= min(next_server, tracker_due) and now < budget:
                snapshots.append(rows(db))
                if now >= tracker_due:
                    cluster.restart_tracker(args.down)
                    events.append(f"{now / 60:.1f} min: tracker killed, {len(snapshots[-1])} records")
                    tracker_due = float("inf")
                else:
                    cluster.replace_server(victim, args.down)
                    events.append(f"{now / 60:.1f} min: server {victim} killed, {len(snapshots[-1])} records")
                    victim, next_server = (victim + 1) % args.servers, next_server + args.server_every
                print(events[-1], flush=True)
            time.sleep(5)
        code, wall = tune.returncode, time.monotonic() - t0
    finally:
        cluster.close()
    kinds, spurious, n_records = failures(db)
    result = json.load(open(out_json)) if os.path.exists(out_json) else {}
    row = {"exit": code, "minutes": wall / 60, "records": n_records, "lost": lost(snapshots, rows(db)),
           "failures": dict(kinds), "spurious": len(spurious), "spurious_examples": spurious[:5],
           "events": events, "latency_s": result.get("latency_s"), "tune": args.tune,
           "session_timeout": args.session_timeout, "work": work}
    print(json.dumps(row, indent=2))
    model_ms = f"{1e3 * result['latency_s']['tuned']:.2f}" if result.get("latency_s") else "-"
    lines = [f"## RPC, a long run with faults, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- command: `benchmarks/rpc_long.py {shlex.join(argv if argv is not None else sys.argv[1:])}`",
             f"- `stormdrop tune {args.tune}` for {args.minutes:g} min through a loopback tracker and "
             f"{args.servers} servers on this machine (sessions end after {args.session_timeout} s); "
             f"faults: {'; '.join(events) or 'none'}", "",
             "| exit | wall min | records | lost | failures by kind | spurious | model ms (remote) |",
             "| --- | --- | --- | --- | --- | --- | --- |",
             f"| {code} | {wall / 60:.1f} | {n_records} | {row['lost']} | "
             f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items())) or 'none'} | {len(spurious)} | {model_ms} |"]
    emit(lines, args.out, args.json, row)
    return 0 if code == 0 and not row["lost"] and not spurious else 1


if __name__ == "__main__":
    sys.exit(main())
