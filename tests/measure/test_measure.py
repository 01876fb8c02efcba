"""The measurement gateway: typed failures, never the end of the run."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from tvm import te

from stormdrop.measure.gateway import Gateway, MeasureConfig
from stormdrop.records import ErrorKind
from stormdrop.target import host_target
from stormdrop.workloads import parse_kernel

KEY = "mm"


@pytest.fixture(scope="module")
def kernel():
    return parse_kernel("matmul:M=128,N=128,K=128")


@pytest.fixture(scope="module")
def gateway(kernel):
    with Gateway(host_target(), MeasureConfig(repeat=3, min_repeat_ms=1)) as gw:
        gw.prepare(KEY, kernel.mod)
        yield gw


def _variant(fn):
    n = 128
    A, B = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    return tvm.IRModule({"main": te.create_prim_func([A, B, fn(A, B, n)])})


def test_the_untuned_kernel_measures_with_repeated_samples(gateway, kernel):
    (r,) = gateway.measure(KEY, [kernel.mod])
    assert r.ok and len(r.run_secs) == 3 and all(t > 0 for t in r.run_secs)
    build_s, run_s = gateway.candidate_s()  # what the time budget keeps for each re-measured best
    assert build_s > 0 and run_s >= sum(r.run_secs) / 3


def test_the_warm_up_counts_in_the_time_kept_for_a_candidate_only_until_others_are_measured(kernel):
    # each builder's first build and the first batch's runs pay the processes' warm-up (resnet18's first
    # 4 transfers took 14 s: a 119-s budget then kept 280 s for verifying and compiling 20 tasks)
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1, builders=1)) as gw:
        gw.prepare(KEY, kernel.mod)
        gw.measure(KEY, [kernel.mod])
        c = gw.costs
        assert (c.first_builds.count, c.builds.count, c.first_runs.count, c.runs.count) == (1, 0, 1, 0)
        assert gw.candidate_s() == (c.first_builds.seconds, c.first_runs.seconds) and min(gw.candidate_s()) > 0
        gw.measure(KEY, [kernel.mod, kernel.mod])
        assert (c.first_builds.count, c.builds.count, c.first_runs.count, c.runs.count) == (1, 2, 1, 2)
        assert gw.candidate_s() == (c.builds.seconds / 2, c.runs.seconds / 2)


def test_one_batch_measures_the_candidates_of_several_workloads_each_against_its_own_reference(gateway, kernel):
    # verification measures every task's best in one batch: each candidate is checked against the
    # reference of its own workload (an elementwise product is right as itself, wrong as a matmul)
    product = _variant(lambda A, B, n: te.compute((n, n), lambda i, j: A[i, j] * B[i, j], name="C"))
    gateway.prepare("product", product)
    right = gateway.measure([KEY, "product"], [kernel.mod, product])
    swapped = gateway.measure(["product", KEY], [kernel.mod, product])
    assert [r.ok for r in right] == [True, True]
    assert [r.error for r in swapped] == [ErrorKind.WRONG_RESULT, ErrorKind.WRONG_RESULT]
    build, run = gateway.candidate_s()  # two builders build side by side, the runs take turns
    assert gateway.batch_s(3) == pytest.approx(-(-3 // len(gateway._builders)) * build + 3 * run)
    # a model's compile: tvm.build's own time a kernel, less than a builder's (it also loads, checks, links)
    assert 0 < gateway.compile_s(1) < build and gateway.compile_s(3) == pytest.approx(3 * gateway.compile_s(1))


def _product():
    return _variant(lambda A, B, n: te.compute((n, n), lambda i, j: A[i, j] * B[i, j], name="C"))


def test_a_models_references_are_compiled_by_the_builders_and_each_still_tells_a_wrong_candidate(kernel):
    # make_references (a model's set-up): the builders compile the untuned builds side by side, the
    # runner loads and runs each; the libraries are gone once loaded
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1, builders=2)) as gw:
        gw.prepare(KEY, kernel.mod)
        gw.prepare("product", _product())
        gw.make_references()
        assert sum(w.jobs for w in gw._builders) == 2 and gw._runners[0].references == {KEY, "product"}
        assert not [f for f in os.listdir(gw._workdir) if f.startswith("reference")]
        right = gw.measure([KEY, "product"], [kernel.mod, _product()])
        swapped = gw.measure(["product", KEY], [kernel.mod, _product()])
    assert [r.ok for r in right] == [True, True]
    assert [r.error for r in swapped] == [ErrorKind.WRONG_RESULT, ErrorKind.WRONG_RESULT]


def test_references_compiled_in_groups_each_tell_their_own_workloads_candidates(kernel):
    # many workloads: a builder compiles several references into one library (reference_groups),
    # the runner calls each workload's own function in it
    ops = {"product": lambda a, b: a * b, "sum": lambda a, b: a + b, "difference": lambda a, b: a - b,
           "larger": lambda a, b: tvm.te.max(a, b)}
    mods = {key: _variant(lambda A, B, n, f=f: te.compute((n, n), lambda i, j: f(A[i, j], B[i, j]), name="C"))
            for key, f in ops.items()}
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1, builders=1)) as gw:
        gw.prepare(KEY, kernel.mod)
        for key, mod in mods.items():
            gw.prepare(key, mod)
        gw.make_references()
        assert gw._builders[0].jobs == 3 and gw._runners[0].references == {KEY, *ops}  # 2 + 2 + 1
        assert not [f for f in os.listdir(gw._workdir) if f.startswith("reference")]
        keys = [KEY, *ops]
        right = gw.measure(keys, [kernel.mod, *mods.values()])
        shifted = gw.measure(keys[1:] + keys[:1], [kernel.mod, *mods.values()])
    assert [r.ok for r in right] == [True] * 5
    assert [r.error for r in shifted] == [ErrorKind.WRONG_RESULT] * 5


def test_a_reference_library_the_runner_cannot_load_is_compiled_by_the_runner_instead(kernel, monkeypatch):
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1)) as gw:
        gw.prepare(KEY, kernel.mod)
        gw.prepare("product", _product())
        monkeypatch.setattr(gw, "_on_builders", lambda jobs, request, done, limit: [
            done(job, "ok", "/nonexistent/reference.so", gw._builders[0]) for job in range(jobs)])
        gw.make_references()
        monkeypatch.undo()
        assert gw._runners[0].references == {KEY, "product"}
        right = gw.measure([KEY, "product"], [kernel.mod, _product()])
    assert [r.ok for r in right] == [True, True]


def test_a_wrong_result_is_a_typed_failure(gateway):
    wrong = _variant(lambda A, B, n: te.compute((n, n), lambda i, j: A[i, j] * B[i, j], name="C"))
    (r,) = gateway.measure(KEY, [wrong])
    assert r.error is ErrorKind.WRONG_RESULT and "differ" in r.error_msg and r.run_secs is None


def test_a_kernel_that_cannot_load_is_a_typed_failure(gateway):
    bad = _variant(lambda A, B, n: te.compute(
        (n, n), lambda i, j: tvm.tirx.call_extern("float32", "stormdrop_no_such_symbol", A[i, j]), name="C"))
    (r,) = gateway.measure(KEY, [bad])
    assert r.error in (ErrorKind.BUILD_ERROR, ErrorKind.RUN_ERROR, ErrorKind.RUNNER_CRASH)  # a crash is retried once


def test_a_killed_builder_is_a_retryable_failure_and_the_next_build_runs(gateway, kernel, monkeypatch):
    """A build process that dies (the out-of-memory killer, a signal) is the machine's failure, not
    the candidate's: a retryable ``BUILDER_CRASH``, measured again by a later run; the builder is
    restarted for the next candidate."""
    from stormdrop.measure import workers

    send = workers.Worker.send

    def send_and_die(self, command, payload):
        send(self, command, payload)
        if command == "build":
            self.proc.kill()

    monkeypatch.setattr(workers.Worker, "send", send_and_die)
    (r,) = gateway.measure(KEY, [kernel.mod])
    assert r.error is ErrorKind.BUILDER_CRASH and r.error.retryable and "worker died" in r.error_msg
    monkeypatch.setattr(workers.Worker, "send", send)
    (r,) = gateway.measure(KEY, [kernel.mod])
    assert r.ok


def test_a_stop_swallowed_elsewhere_ends_the_batch_at_its_next_candidate(gateway, kernel, monkeypatch):
    """A Ctrl-C that TVM turned into an error a caller skipped (see ``stormdrop.stop``) is raised
    again by the gateway: the candidates after it are neither built nor timed."""
    import signal

    from stormdrop import stop
    from stormdrop.measure import workers

    monkeypatch.setattr(stop, "_requested", None)
    sent = []
    send = workers.Worker.send
    monkeypatch.setattr(workers.Worker, "send", lambda self, command, payload: (sent.append(command),
                                                                                send(self, command, payload)))
    heard = []

    def stop_after_the_first(i, result):
        heard.append(result)
        monkeypatch.setattr(stop, "_requested", signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        gateway.measure(KEY, [kernel.mod, kernel.mod, kernel.mod], on_result=stop_after_the_first)
    assert len(heard) == 1 and heard[0].ok and sent.count("run") == 1
    sent.clear()
    with pytest.raises(KeyboardInterrupt):
        gateway.measure(KEY, [kernel.mod])
    assert sent == []


@pytest.mark.slow
def test_a_hang_times_out_and_the_next_candidate_still_runs(kernel):
    with Gateway(host_target(), MeasureConfig(repeat=3, min_repeat_ms=2000, run_timeout_s=1.0)) as gw:
        gw.prepare(KEY, kernel.mod)
        (slow,) = gw.measure(KEY, [kernel.mod])  # 3 x 2 s of timing > 1 s: killed
        assert slow.error is ErrorKind.RUN_TIMEOUT
        gw.config = MeasureConfig(repeat=2, min_repeat_ms=1)
        (fine,) = gw.measure(KEY, [kernel.mod])  # a fresh runner, references rebuilt
        assert fine.ok


def test_a_dead_runner_is_restarted(gateway, kernel):
    gateway._runners[0].worker.ensure()
    gateway._runners[0].worker.proc.kill()
    gateway._runners[0].worker.proc.wait()
    results = gateway.measure(KEY, [kernel.mod, kernel.mod])
    assert results[1].ok  # whatever happened to the first, the run goes on


@pytest.mark.slow
def test_a_runner_grown_past_its_memory_limit_is_restarted_and_still_checks(kernel):
    # candidate libraries leak memory in TVM (see tvm_compat.runtime): a runner past its limit is replaced
    wrong = _variant(lambda A, B, n: te.compute((n, n), lambda i, j: A[i, j] * B[i, j], name="C"))
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1, runner_memory_mb=1)) as gw:
        gw.prepare(KEY, kernel.mod)
        first = gw._runners[0].worker.generation
        results = gw.measure(KEY, [kernel.mod, wrong, kernel.mod])
        assert [r.ok for r in results] == [True, False, True]
        assert results[1].error is ErrorKind.WRONG_RESULT  # references made again by the new runner
        assert gw.costs.runner_restarts == 3 and gw._runners[0].worker.generation == first + 2
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1)) as gw:  # default: no restart
        gw.prepare(KEY, kernel.mod)
        gw.measure(KEY, [kernel.mod, kernel.mod])
        assert gw.costs.runner_restarts == 0


def _listening_addresses(pids):
    """Local addresses of the TCP sockets in LISTEN state held by these processes (Linux /proc)."""
    import os

    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:
                    out.append(cols[1])
    return out


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").path.exists("/proc/net/tcp"), reason="Linux /proc needed")
def test_measuring_listens_on_no_network_port(kernel):
    import os

    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1)) as gw:
        gw.prepare(KEY, kernel.mod)
        assert gw.measure(KEY, [kernel.mod])[0].ok
        pids = [os.getpid()] + [w.proc.pid for w in (*gw._builders, *(r.worker for r in gw._runners))
                                if w.proc is not None]
        assert len(pids) >= 3
        assert _listening_addresses(pids) == []  # workers talk over socket pairs, not ports


@pytest.mark.slow
def test_a_build_failure_is_heard_as_its_build_ends_not_after_the_batch(kernel):
    """The caller commits each result as it arrives: a build failure reaches ``on_result`` before
    the batch's other builds (it used to wait for every build of the batch, so a kill then lost it)."""
    import os

    free = te.var("free")  # a variable no argument defines: the build fails
    broken = _variant(lambda A, B, n: te.compute((n, n), lambda i, j: A[i, j] + B[i, j] * free, name="C"))
    heard = []
    with Gateway(host_target(), MeasureConfig(repeat=2, min_repeat_ms=1, builders=1)) as gw:
        gw.prepare(KEY, kernel.mod)

        def libraries():
            return sum(f.endswith(".so") for f in os.listdir(gw._workdir))

        before = libraries()

        def on_result(i, r):
            heard.append((i, r.error, libraries() - before))

        results = gw.measure(KEY, [broken, kernel.mod, kernel.mod], on_result=on_result)
    assert results[0].error is ErrorKind.BUILD_ERROR and results[1].ok and results[2].ok
    assert heard[0] == (0, ErrorKind.BUILD_ERROR, 0)  # heard before the other two were built


def test_a_models_tasks_are_timed_cold_on_a_cpu_and_a_kernel_warm_unless_said():
    """Inside a model a kernel's weights were evicted by the other kernels': a model's candidates are
    timed with the caches flushed on a CPU by default (--no-cache-flush turns it off), a kernel's warm."""
    cpu, gpu = host_target(), tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    assert MeasureConfig().for_models(cpu).cache_flush is True
    assert MeasureConfig().for_models(gpu).cache_flush is False  # no CPU cache to flush there
    assert MeasureConfig(cache_flush=False).for_models(cpu).cache_flush is False
    assert MeasureConfig().for_kernels().cache_flush is False
    assert MeasureConfig(cache_flush=True).for_kernels().cache_flush is True


@pytest.mark.alone
def test_a_cold_timing_gives_one_flushed_run_per_sample(kernel):
    with Gateway(host_target(), MeasureConfig(repeat=4, min_repeat_ms=1000, cache_flush=True)) as gw:
        gw.prepare(KEY, kernel.mod)
        t0 = __import__("time").monotonic()
        (r,) = gw.measure(KEY, [kernel.mod])
        elapsed = __import__("time").monotonic() - t0
    assert r.ok and len(r.run_secs) == 4
    assert elapsed < 4.0  # one run per sample: min_repeat_ms (4 x 1 s warm) does not apply


def test_a_half_precision_output_is_checked_at_its_own_precision():
    from stormdrop.measure.outputs import mismatches

    want = np.linspace(-40.0, 40.0, 64, dtype=np.float32)
    off = want + 5e-3 * np.abs(want).max()  # a sum over K taken in another order, in float16's last places
    assert mismatches(off, want).all()  # float32: wrong
    assert not mismatches(off.astype(np.float16), want.astype(np.float16)).any()
    assert mismatches((want + 1.0).astype(np.float16), want.astype(np.float16)).all()  # still a check
    assert mismatches(np.array([1, 2]), np.array([1, 3])).tolist() == [False, True]


def test_a_nan_where_the_reference_has_one_agrees_and_nowhere_else():
    """Random inputs give a batch norm a negative variance under its square root: the reference
    computes NaN there, and a candidate that computes the same is right (before, every candidate of
    such a kernel failed its check and the task ran untuned in the model)."""
    from stormdrop.measure.outputs import mismatches

    want = np.array([1.0, np.nan, 3.0, np.inf, 1e6], dtype=np.float32)
    assert not mismatches(want.copy(), want).any()
    got = want.copy()
    got[0], got[1], got[3] = np.nan, 2.0, 1.0
    assert mismatches(got, want).tolist() == [True, True, False, True, False]
    assert mismatches(want + 2e3, want).tolist() == [True, False, True, False, False]  # tolerance of 1e6's finite scale


@pytest.mark.slow  # compiles every task of two fixture networks twice
@pytest.mark.parametrize("fixture", ["tv_mobilenet_v3.onnx", "hf_distilbert.onnx"])
def test_the_reference_compiled_at_o1_computes_what_o3_does(fixture):
    """References are compiled at LLVM -O1 (``reference_target``): every task of a CNN with hardswish
    and SE blocks and of a transformer with GELU, layer norm and softmax gives outputs the check
    cannot tell from those it gives at the target's own -O3 (most of them bitwise: LLVM contracts
    multiply-adds into FMAs in other places at the two levels)."""
    from pathlib import Path

    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from stormdrop.measure.outputs import mismatches
    from stormdrop.measure.reference import reference_target
    from stormdrop.model.tune import extract_tasks
    from stormdrop.target import host_target
    from stormdrop.workloads.models import load_model

    target = host_target()
    assert reference_target(target).attrs["opt-level"] == 1
    assert reference_target(tvm.target.Target("cuda")).kind.name == "cuda"
    _, tasks = extract_tasks(load_model(str(Path(__file__).resolve().parents[1] / "fixtures" / "exports" / fixture)),
                             target)
    assert len(tasks) >= 5
    same = 0
    for kernel, _ in tasks:
        rng = np.random.default_rng(0)
        infos = ArgInfo.from_prim_func(kernel.mod["main"])
        start = [rng.uniform(-1, 1, [int(x) for x in a.shape]).astype(str(a.dtype))
                 if not str(a.dtype).startswith("int") else np.zeros([int(x) for x in a.shape], str(a.dtype))
                 for a in infos]  # integer arguments (a gather's indices) zero: always in range
        outs = []
        for t in (target, target, reference_target(target)):
            args = [tvm.runtime.tensor(a) for a in start]
            tvm.build(kernel.mod, target=t)["main"](*args)
            outs.append([a.numpy() for a in args])
        assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(outs[0], outs[1])), kernel.name
        outs = outs[::2]
        assert not any(mismatches(b, a).any() for a, b in zip(*outs)), kernel.name
        same += all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*outs))
    assert same >= len(tasks) // 2, (same, len(tasks))
