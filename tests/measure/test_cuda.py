"""NVIDIA GPUs without one: CUDA candidates are sampled, built and compiled to cubins for their arch
on this CPU-only host (TVM's CUDA codegen + NVRTC from the `cuda` extra), their Droplet neighbours
replay, and a model's tasks extract for CUDA. Timing them needs a GPU (here or behind an RPC tracker)."""

from __future__ import annotations

import os

import pytest
import tvm
from test_model import tiny_net

from stormdrop.measure import _worker
from stormdrop.model.tune import extract_tasks
from stormdrop.search.space import DecisionSpace
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import parse_target
from stormdrop.tvm_compat import nvrtc as _nvrtc
from stormdrop.workloads import parse_kernel
from stormdrop.workloads.models import load_model

pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC bindings: pip install -e '.[cuda]'")

SMALL = StormConfig(batch_size=3, population_size=16, genetic_num_iters=1, init_min_unmeasured=16)


def _device_sms(mod, target) -> set[int]:
    """The SM versions of the cubins NVRTC makes of the candidate's CUDA kernels (machine code, not
    source: the library TVM exports holds only source, compiled when a GPU loads it)."""
    lib = tvm.build(mod, target=target)
    arch = str(target.attrs["arch"])
    return {_nvrtc.cubin_sm(_nvrtc.cuda_cubin(m.inspect_source(), arch)) for m in lib.imports if m.kind == "cuda"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cuda_candidates_are_sampled_and_built_to_device_code(tmp_path, arch, monkeypatch):
    target = parse_target({"kind": "cuda", "arch": arch})
    assert int(target.attrs["max_threads_per_block"]) == 1024  # filled in: MetaSchedule's rules need it
    kernel = parse_kernel("matmul:M=128,N=128,K=128")
    storm = Storm(kernel.mod, target, trials=3, seed=0, config=SMALL)
    cands = storm.propose()
    assert cands and len(cands) <= 3
    text = cands[0].sch.mod.script()
    assert "threadIdx.x" in text and "blockIdx" in text  # bound to the GPU's threads
    compiled = []
    real = _nvrtc.cuda_cubin
    monkeypatch.setattr(_nvrtc, "cuda_cubin", lambda src, a: compiled.append(a) or real(src, a))
    built = _worker._build(target, tvm.ir.save_json(cands[0].mod), str(tmp_path / "c0.so"))
    assert built["cubin_bytes"] > 10_000 and built["pack"] is None  # the builder compiled it
    assert compiled == [arch]  # once (on a GPU's host tvm.build's own compile is the check's)
    monkeypatch.undo()
    assert _device_sms(cands[0].mod, target) == {int(arch[3:])}

    # the raindrop's coordinates cover the CUDA decisions, and neighbours replay and build
    space = DecisionSpace(kernel.mod, storm.sketches.postprocs, cands[0].sch.trace, num_cores=1)
    assert space.coordinates
    valid = [s for s in (space.apply(p) for p in space.neighbours(space.start, 1)[:12]) if s is not None]
    assert valid, "no radius-1 neighbour of a CUDA schedule replays"
    built = _worker._build(target, tvm.ir.save_json(valid[0].mod), str(tmp_path / "n0.so"))
    assert built["cubin_bytes"] > 10_000 and _device_sms(valid[0].mod, target) == {int(arch[3:])}
    storm.close()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_float16_matmuls_are_sampled_for_tensor_cores_and_built_to_device_code(tmp_path, arch):
    target = parse_target({"kind": "cuda", "arch": arch})
    kernel = parse_kernel("matmul:M=256,N=256,K=256,dtype=float16")
    storm = Storm(kernel.mod, target, trials=4, seed=0,
                  config=StormConfig(batch_size=4, population_size=32, genetic_num_iters=1, init_min_unmeasured=32))
    cands = storm.propose()
    assert cands
    lib = tvm.build(cands[0].mod, target=target)
    source = "".join(m.inspect_source() for m in lib.imports if m.kind == "cuda")
    assert "wmma::mma_sync" in source  # the tensor cores' matrix product, not a scalar loop
    built = _worker._build(target, tvm.ir.save_json(cands[0].mod), str(tmp_path / "c0.so"))
    assert built["cubin_bytes"] > 10_000 and _device_sms(cands[0].mod, target) == {int(arch[3:])}

    # the raindrop walks a tensor-core schedule's decisions: its neighbours replay and build
    space = DecisionSpace(kernel.mod, storm.sketches.postprocs, cands[0].sch.trace, num_cores=1)
    valid = [s for s in (space.apply(p) for p in space.neighbours(space.start, 1)[:12]) if s is not None]
    assert valid, "no radius-1 neighbour of a tensor-core schedule replays"
    built = _worker._build(target, tvm.ir.save_json(valid[0].mod), str(tmp_path / "n0.so"))
    assert built["cubin_bytes"] > 10_000
    storm.close()


class _Source:
    kind = "cuda"

    def inspect_source(self) -> str:
        return 'extern "C" __global__ void main_kernel(float* a) { a[0] = undefined_name; }'


class _Library:
    imports = [_Source()]


def test_a_cuda_kernel_that_does_not_compile_fails_its_build_on_the_host():
    with pytest.raises(RuntimeError, match="undefined_name"):
        _nvrtc.library_cubins(_Library(), "sm_90")  # the builder's check


_KERNEL = 'extern "C" __global__ void main_kernel(float* a) { a[threadIdx.x] += 1.0f; }'


def test_a_source_tvm_compiles_while_building_is_not_compiled_again_by_the_check(monkeypatch):
    # On a GPU's host tvm.build compiles the CUDA source itself, through this function
    import tvm_ffi

    class Lib:
        imports = [type("Source", (), {"kind": "cuda", "inspect_source": lambda self: _KERNEL})()]

    nvrtc_calls, tvm_calls = [], []
    real = _nvrtc.cuda_cubin
    monkeypatch.setattr(_nvrtc, "cuda_cubin", lambda src, arch: nvrtc_calls.append(arch) or real(src, arch))
    with _nvrtc.compiling("sm_90"):
        compile_cuda = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
        monkeypatch.setattr(_nvrtc, "_PREVIOUS", [lambda code, *rest: tvm_calls.append(code) or b"tvm's"])
        cubin = bytes(compile_cuda(_KERNEL))  # what tvm.build calls
        assert _nvrtc.cubin_sm(cubin) == 90 and nvrtc_calls == ["sm_90"]
        cubins = _nvrtc.library_cubins(Lib(), "sm_90")  # the check
    assert cubins == {_nvrtc.source_digest(_KERNEL): cubin} and nvrtc_calls == ["sm_90"] and not tvm_calls
    assert bytes(compile_cuda(_KERNEL)) == b"tvm's"  # outside a builder's block: TVM's own compile
    assert _nvrtc.library_cubins(Lib(), "sm_80") and nvrtc_calls == ["sm_90", "sm_80"]  # none kept: compiled


def test_headers_nvrtc_cannot_compile_with_are_passed_over(tmp_path, monkeypatch):
    # e.g. a GPU machine's torch install: CUDA runtime headers without the cccl folder they need
    good_root = _nvrtc.cuda_headers()[0]
    bare = tmp_path / "cuda" / "include"
    bare.mkdir(parents=True)
    for f in (os.path.join(good_root, "include", n) for n in os.listdir(os.path.join(good_root, "include"))):
        if os.path.isfile(f):
            (bare / os.path.basename(f)).symlink_to(f)
    _nvrtc.cuda_headers.cache_clear()
    try:
        monkeypatch.setattr(_nvrtc, "_cuda_roots", lambda: [str(bare.parent), good_root])
        assert _nvrtc.cuda_headers()[0] == good_root
        _nvrtc.cuda_headers.cache_clear()
        monkeypatch.setattr(_nvrtc, "_cuda_roots", lambda: [str(bare.parent)])
        with pytest.raises(RuntimeError, match="(?s)no CUDA headers NVRTC compiles with.*cuda/std"):
            _nvrtc.cuda_headers()
    finally:
        _nvrtc.cuda_headers.cache_clear()


@pytest.mark.slow
def test_a_models_tasks_extract_for_cuda_without_cpu_weight_packing(tmp_path):
    model = load_model(tiny_net(str(tmp_path / "tiny.onnx")))
    fused, tasks = extract_tasks(model, parse_target({"kind": "cuda", "arch": "sm_90"}))
    assert len(tasks) >= 3 and all(k.flops > 0 for k, _ in tasks if "conv" in k.name)
    assert "layout_free_buffers" not in fused.script()


def _gpu_visible() -> bool:
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no CUDA driver/runtime in this TVM or on this machine
        return False


needs_gpu = pytest.mark.skipif(not _gpu_visible(), reason="needs an NVIDIA GPU visible to TVM's CUDA runtime "
                               "(none here: CUDA candidates are built above, timing them needs the GPU)")


@pytest.mark.slow
@needs_gpu
def test_a_cuda_kernel_is_tuned_on_the_gpu_and_its_best_computes_the_right_answer(tmp_path):
    import numpy as np

    from stormdrop.search.options import SearchOptions
    from stormdrop.storage.database import Database
    from stormdrop.tuning.kernel_tune import tune_kernel
    from stormdrop.tuning.options import KernelOptions
    from stormdrop.tvm_compat.trace_json import schedule_from_trace_json

    spec = "matmul:M=256,N=256,K=256"
    db = tmp_path / "gpu.db"
    # (SMALL's population of 16 is too few on a GPU: most random CUDA schedules fail its checks)
    result = tune_kernel(spec,
                         KernelOptions(trials=16, exploit_trials=8, seed=0,
                                       search=SearchOptions(storm=StormConfig(batch_size=8))),
                         target="cuda", db=db)
    task = result.tasks[0]
    assert task.verified and 0 < task.latency_s < 1e-2
    assert task.trials["storm"] == 16 and task.trials["failed"] < 16
    with Database(db) as d:
        records = d.records(d.find_workload(parse_kernel(spec).mod).workload_id)
    assert len(records) == task.trials["storm"] + task.trials["raindrop"]
    # the best schedule, built again here, computes A @ B on the GPU
    target = parse_target(result.target)
    sch = schedule_from_trace_json(parse_kernel(spec).mod, task.trace_json)
    lib = tvm.compile(sch.mod, target=target)
    dev = tvm.cuda(0)
    a, b = (np.random.default_rng(i).standard_normal((256, 256)).astype("float32") for i in (1, 2))
    out = tvm.runtime.tensor(np.full((256, 256), np.nan, "float32"), dev)
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-3, atol=1e-3)
