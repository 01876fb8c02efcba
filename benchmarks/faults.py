"""Fault script: SIGKILL kernel and model tunes at random points, re-run them, count what was lost.

For each scenario, one uninterrupted run on its own database is the reference. Then, in
cycles on fresh databases, the same command is started and killed (SIGKILL to its process
group, so its workers die too) at a random moment, again and again until a run finishes
before its kill, and once more run to the end; cycles follow until ``--kills`` kills were
delivered. The reuse scenario is the kernel's with transfers first (``--reuse-from`` a
database of four other matmul shapes tuned beforehand), so kills land in its reuse, storm and
raindrop phases. The concurrent scenario starts two identical tunes on one database, kills one at
a random moment, and re-runs both. Printed per scenario:

- records lost: rows present right after a kill that are missing, or changed, at the end
  (a retried run timeout may change; nothing else may);
- measured twice: "measured twice" warnings of any run (a candidate measured although its
  record existed; claims and lookups exist to prevent it);
- kills by phase: the phase of the last record committed before each kill (``none``: before
  the first);
- records and best latency at the end of each cycle, against the uninterrupted run's (the
  ledger caps the count at the uninterrupted run's; a killed raindrop that restarts may
  converge with fewer; the best latencies differ by timing noise and search path).

Usage: ``python benchmarks/faults.py --kills 20 [--scenarios kernel,reuse,model,concurrent] [--json PATH] [--out RESULTS.md]``
"""

from __future__ import annotations

import argparse
import datetime
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter

from _peers import emit

KERNEL = ["--kernel", "matmul:M=64,N=64,K=64", "--trials", "24", "--exploit-trials", "16", "--batch-size", "4"]
DONORS = ["matmul:M=32,N=32,K=32", "matmul:M=48,N=48,K=48", "matmul:M=96,N=96,K=96", "matmul:M=128,N=64,K=64"]
SCENARIOS = ("kernel", "reuse", "model", "concurrent")
MODEL = ["--model", "resnet18", "--resolution", "32", "--trials", "40", "--trials-per-task", "4",
         "--batch-size", "4"]


def rows(db: str) -> dict[tuple, tuple]:
    """(workload, target, key) -> the whole row, read-only; {} while the file is not there yet."""
    if not os.path.exists(db):
        return {}
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            got = con.execute("SELECT * FROM records").fetchall()
            cols = [d[0] for d in con.execute("SELECT * FROM records LIMIT 0").description]
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    i = [cols.index(c) for c in ("workload_id", "target", "candidate_key")]
    return {tuple(r[j] for j in i): r for r in got}


def best(db: str) -> float | None:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT SUM(m) FROM (SELECT MIN(mean_secs) AS m FROM records GROUP BY workload_id)")
        return row.fetchone()[0]
    finally:
        con.close()


def last_phase(db: str) -> str:
    """The phase of the record committed last (``none``: no record yet)."""
    if not os.path.exists(db):
        return "none"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = con.execute("SELECT phase FROM records ORDER BY record_id DESC LIMIT 1").fetchone()
    except sqlite3.Error:
        row = None
    finally:
        con.close()
    return row[0] if row else "none"


def donor_db(tmp: str) -> str:
    """A database of four other matmul shapes, each tuned with 8 storm trials: the reuse scenario's donors."""
    db = os.path.join(tmp, "donors.db")
    for spec in DONORS:
        cmd = [sys.executable, "-m", "stormdrop", "tune", "--kernel", spec, "--trials", "8", "--phases", "storm",
               "--db", db, "--no-progress"]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).returncode != 0:
            raise SystemExit(f"tuning the donor {spec} failed")
    return db


def start(args: list[str], db: str, log: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "stormdrop", "-v", "tune", *args, "--db", db, "--no-progress"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "ab"), start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def twice(logs: list[str]) -> int:
    return sum(open(p, errors="replace").read().count("was measured twice") for p in logs if os.path.exists(p))


def lost(snapshots: list[dict], final: dict) -> int:
    n = 0
    for snap in snapshots:
        for key, row in snap.items():
            now = final.get(key)
            retried = now is not None and row[8] in ("run_timeout", "runner_crash")  # error column
            n += now is None or (now != row and not retried)
    return n


def scenario(name: str, args: list[str], concurrent: bool, kills: int, rng: random.Random, tmp: str) -> dict:
    """Cycles, each on a fresh database: runs killed at random moments until one finishes before its
    kill, then a final run; as many cycles as it takes to deliver ``kills`` kills."""
    ref_db = os.path.join(tmp, f"{name}_ref.db")
    logs = [os.path.join(tmp, f"{name}_{i}.log") for i in range(3)]
    t0 = time.monotonic()
    ref = start(args, ref_db, logs[2])
    if ref.wait() != 0:
        raise SystemExit(f"{name}: the uninterrupted run failed; see {logs[2]}")
    duration = time.monotonic() - t0
    done, runs, n_lost, ok, finals, phases = 0, 1, 0, True, [], Counter()
    while done < kills:
        db, snapshots = os.path.join(tmp, f"{name}_{len(finals)}.db"), []
        while done < kills:
            procs = [start(args, db, logs[0])] + ([start(args, db, logs[1])] if concurrent else [])
            runs += len(procs)
            time.sleep(rng.uniform(0.1, 0.9) * duration)
            victim = procs[0] if not concurrent else rng.choice(procs)
            if victim.poll() is not None:  # it finished before its kill: this cycle is over
                for p in procs:
                    p.wait()
                break
            kill(victim)
            done += 1
            phases[last_phase(db)] += 1
            snapshots.append(rows(db))
            for p in procs:
                if p is not victim:
                    p.wait()
        final_runs = [start(args, db, logs[0])] + ([start(args, db, logs[1])] if concurrent else [])
        runs += len(final_runs)
        ok &= all(p.wait() == 0 for p in final_runs)
        final = rows(db)
        n_lost += lost(snapshots, final)
        finals.append((len(final), best(db)))
    counts = sorted(n for n, _ in finals)
    bests = sorted(b for _, b in finals if b)
    return {"scenario": name, "runs": runs, "kills": done, "cycles": len(finals), "records_lost": n_lost,
            "measured_twice": twice(logs[:2]), "final_ok": ok, "kills_by_phase": dict(phases),
            "records": f"{counts[0]}-{counts[-1]}" if counts[0] != counts[-1] else str(counts[0]),
            "records_uninterrupted": len(rows(ref_db)), "best_s": bests[len(bests) // 2] if bests else None,
            "best_uninterrupted_s": best(ref_db), "uninterrupted_s": duration}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per scenario (over as many cycles as it takes)")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="which of them, comma separated")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--out", default=None, help="append the table to this Markdown file")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not chosen or set(chosen) - set(SCENARIOS):
        p.error(f"--scenarios: a comma list of {', '.join(SCENARIOS)}")
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="stormdrop-faults-") as tmp:
        runs = {"kernel": (KERNEL, False), "model": (MODEL, False), "concurrent": (KERNEL, True)}
        if "reuse" in chosen:
            runs["reuse"] = ([*KERNEL, "--reuse", "8", "--reuse-from", donor_db(tmp)], False)
        results = [scenario(name, *runs[name], args.kills, rng, tmp) for name in SCENARIOS if name in chosen]
    lines = [f"## Faults, {datetime.datetime.now():%Y-%m-%d %H:%M}", "",
             f"- command: `{' '.join(['benchmarks/faults.py', *sys.argv[1:]])}`",
             f"- kernel: `{' '.join(KERNEL)}`; reuse: the kernel's with `--reuse 8 --reuse-from` a database of "
             f"{', '.join(DONORS)} (8 storm trials each); model: `{' '.join(MODEL)}`; concurrent: two kernel tunes "
             "on one database, one of them killed each round",
             "- a cycle: a fresh database, runs killed at random moments until one finishes, then one more run; "
             "records: each cycle's final count (a range over cycles); best: the median cycle's sum of the "
             "tasks' best latencies", "",
             "| scenario | runs | kills | kills by phase | cycles | records lost | measured twice | final runs ok "
             "| records | records (uninterrupted) | best (us) | best uninterrupted (us) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        us = lambda s: f"{s * 1e6:.1f}" if s else "n/a"  # noqa: E731
        by_phase = ", ".join(f"{p} {n}" for p, n in sorted(r["kills_by_phase"].items()))
        lines.append(f"| {r['scenario']} | {r['runs']} | {r['kills']} | {by_phase} | {r['cycles']} | {r['records_lost']} "
                     f"| {r['measured_twice']} "
                     f"| {'yes' if r['final_ok'] else 'NO'} | {r['records']} | {r['records_uninterrupted']} "
                     f"| {us(r['best_s'])} | {us(r['best_uninterrupted_s'])} |")
    emit(lines, args.out, args.json, results)


if __name__ == "__main__":
    main()
