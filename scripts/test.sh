#!/usr/bin/env bash
# Install stormdrop with its test extras, then run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check -e ".[test,models]"
# tests/report/test_report.py opens the HTML report in a real browser: the Debian package `chromium`
# (playwright drives it; playwright's own browser download needs a network this project does not assume)
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1 \
    || echo "scripts/test.sh: could not install chromium; the browser test will be skipped" >&2
fi
# tests/measure/test_arm*.py link candidates for aarch64 boards (the distribution's cross compiler) and
# run them under user-mode emulation (qemu-user)
if { ! command -v aarch64-linux-gnu-gcc || ! command -v qemu-aarch64; } >/dev/null 2>&1 \
    && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user; } \
    >/dev/null 2>&1 \
    || echo "scripts/test.sh: could not install gcc-aarch64-linux-gnu and qemu-user; the aarch64 tests will be skipped" >&2
fi
python -m ruff check src tests benchmarks
# Two test processes by default (the suite mostly waits on subprocesses, servers and timers), then the
# tests marked `alone` (their assertions read timings) one after another with nothing beside them;
# STORMDROP_TEST_WORKERS=0: everything in one process.
workers=${STORMDROP_TEST_WORKERS:-2}
if [ "$workers" = 0 ]; then
  exec python -m pytest -q --durations=15 tests "$@"
fi
status=0
python -m pytest -q -n "$workers" --dist loadfile -m "not alone" --durations=15 tests "$@" || status=$?
python -m pytest -q -m alone --durations=5 tests "$@" || status=$?
exit "$status"
