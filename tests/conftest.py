from __future__ import annotations

import atexit
import fcntl
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import tvm
import tvm.s_tir.meta_schedule as ms
from dbutil import TARGET, matmul_mod

from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics
from stormdrop.tvm_compat.trace_json import trace_to_json

# The test folders mirror the packages; a test module imports another's helpers by module name
# (``from test_model import tiny_net``) whichever folder each is in and whatever order they are collected in.
for _folder in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir()):
    if any(_folder.glob("test_*.py")) and str(_folder) not in sys.path:
        sys.path.append(str(_folder))

# No shipped schedule hub in the tests (subprocesses included): what a test tunes and counts must not
# depend on whether this machine's ISA class has a hub. tests/storage/test_hub.py opts in.
os.environ["STORMDROP_HUB"] = "off"

# The cost-model prior's trained booster (search.prior_cache) is kept in the session's own directory, never
# the user's cache: trained once a session, shared by its tests and their subprocesses, removed at the end.
os.environ["STORMDROP_CACHE"] = tempfile.mkdtemp(prefix="stormdrop-test-cache-")
atexit.register(shutil.rmtree, os.environ["STORMDROP_CACHE"], True)


@pytest.fixture(autouse=True)
def _private_db(tmp_path, monkeypatch):
    """Never touch the user's database from a test."""
    monkeypatch.setenv("STORMDROP_DB", os.fspath(tmp_path / "default.db"))


@pytest.fixture(autouse=True)
def _stormdrop_logger_restored():
    """A CLI run in the test process (``main([...])``) gives the ``stormdrop`` logger its own handler
    and stops it propagating, which hides later tests' records from ``caplog``: each test starts
    from the logger as it was."""
    log = logging.getLogger("stormdrop")
    saved = (log.handlers[:], log.level, log.propagate)
    yield
    log.handlers[:], log.level, log.propagate = saved[0], saved[1], saved[2]


@pytest.fixture(autouse=True)
def _alone_when_timed(request):
    """In several test processes (pytest-xdist, as scripts/test.sh runs them), a test marked
    ``alone`` (its assertions read timings: a re-timed latency, what a time budget allows) runs
    while no other test does; the others share. One process: nothing to do."""
    uid = getattr(request.config, "workerinput", {}).get("testrunuid")
    if uid is None:
        yield
        return
    fd = os.open(os.path.join(tempfile.gettempdir(), f"stormdrop-tests-{uid}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if request.node.get_closest_marker("alone") else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


@pytest.fixture(scope="module")
def mod() -> tvm.IRModule:
    return matmul_mod()


@pytest.fixture(scope="module")
def traces(mod: tvm.IRModule) -> list[str]:
    """Full (post-processed) trace JSON of each design space of the matmul."""
    load_tensor_intrinsics(TARGET)
    ctx = ms.TuneContext(
        mod,
        target=TARGET,
        space_generator="post-order-apply",
        search_strategy="replay-trace",
        num_threads=1,
    )
    out = []
    for sch in ctx.generate_design_space():
        sch.enter_postproc()
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        out.append(trace_to_json(sch.trace))
    assert len(set(out)) >= 3
    return out
