"""Fuzzing the files and rows stormdrop reads, at scale: ``tests/storage/test_fuzz.py`` (Hypothesis,
seeded) with ``--examples`` cases per test, in a child process (a crash would be its death by a
signal), each command's exit codes counted.

    python benchmarks/fuzz_inputs.py --examples 2000
    python benchmarks/fuzz_inputs.py --examples 20000 -k traces   # the trace test alone
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=2000, help="cases per test (three tests)")
    p.add_argument("-k", dest="select", default="", help="only the tests pytest's -k selects (e.g. traces)")
    p.add_argument("--out", default="benchmarks/RESULTS.md")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _peers import machine, publish

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        tally_path = os.path.join(tmp, "tally.json")
        env = dict(os.environ, FUZZ_EXAMPLES=str(args.examples), FUZZ_TALLY=tally_path)
        t0 = time.monotonic()
        select = ["-k", args.select] if args.select else []
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/storage/test_fuzz.py", *select],
                           cwd=root, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        tally = json.load(open(tally_path)) if os.path.exists(tally_path) else {}
    summary = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    crashed = r.returncode < 0
    failures = [ln for ln in r.stdout.splitlines() if ln.startswith("E  ")][:12]  # pytest's assertion lines
    doc = {"command": " ".join(sys.argv), "examples": args.examples, "pytest_exit": r.returncode,
           "pytest_summary": summary, "crashed_by_signal": crashed, "wall_s": wall, "tally": tally,
           "failure": [ln[:4000] for ln in failures]}
    print(json.dumps(doc, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    tracebacks = sum(n for k, n in tally.items() if "traceback" in k)
    other = sum(n for k, n in tally.items() if " exit " in k and not k.endswith((" exit 0", " exit 2")))
    lines = ["", f"## Fuzzing, {datetime.datetime.now():%Y-%m-%d %H:%M}", "", f"- machine: {machine()}",
             f"- command: `{' '.join(sys.argv)}`", f"- tests/storage/test_fuzz.py{' -k ' + args.select if args.select else ''}, "
             f"{args.examples} cases per test, "
             f"{wall:.0f} s: pytest `{summary}` (exit {r.returncode}{', killed by a signal' if crashed else ''})", "",
             "| command, outcome | cases |", "| --- | --- |",
             *(f"| {k} | {n} |" for k, n in sorted(tally.items())), "",
             f"- crashes (a signal) {int(crashed)}, tracebacks {tracebacks}, other exit codes {other}; databases "
             "changed by a refused import or by show/export: 0 unless pytest failed (the tests assert it)", ""]
    publish(lines, args.out)
    return 0 if r.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
