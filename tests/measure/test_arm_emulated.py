"""ARM candidates run without a board: built and linked here for Neoverse N1 and A64FX (SVE), then
run under user-mode emulation (``qemu-aarch64``, which ``scripts/test.sh`` installs with the cross
compiler), their outputs compared with the workload's reference computed on this x86 machine."""

from __future__ import annotations

import platform
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import te

from stormdrop.measure import _worker
from stormdrop.search.space import DecisionSpace
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import parse_target
from stormdrop.tvm_compat import cross, emulated
from stormdrop.workloads import parse_kernel

NEOVERSE = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4}
A64FX = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "a64fx", "num-cores": 12}
DENSE = "dense:M=64,N=96,K=128"
CONV = "conv2d_bias_relu:N=1,C=16,H=14,W=14,K=32,R=3,S=3,pad=1,layout=NHWC"

needs_emulator = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("aarch64-linux-gnu-gcc") is None
    or shutil.which("qemu-aarch64") is None,
    reason="an x86 host with the aarch64 cross compiler and qemu-user (apt install gcc-aarch64-linux-gnu qemu-user)")


def _candidates(kernel, target, n: int):
    """Up to ``n`` storm samples of ``kernel`` and radius-1 raindrop neighbours of the first."""
    storm = Storm(kernel.mod, target, trials=n, seed=0,
                  config=StormConfig(batch_size=n, population_size=16, genetic_num_iters=1, init_min_unmeasured=16))
    try:
        cands = storm.propose()[:n]
        space = DecisionSpace(kernel.mod, storm.sketches.postprocs, cands[0].sch.trace, num_cores=1)
        moves = [s for s in (space.apply(p) for p in space.neighbours(space.start, 1)[:16]) if s is not None]
    finally:
        storm.close()
    return [c.mod for c in cands] + [m.mod for m in moves[:n]]


def _sve_instructions(library: str) -> int:
    dump = subprocess.run(["aarch64-linux-gnu-objdump", "-d", library], capture_output=True, text=True).stdout
    return sum(" z" in line and "." in line.split(" z", 1)[1][:6] for line in dump.splitlines())


@pytest.mark.slow
@needs_emulator
@pytest.mark.parametrize("config", [NEOVERSE, A64FX], ids=["neoverse-n1", "a64fx"])
@pytest.mark.parametrize("spec", [DENSE, CONV], ids=["dense", "conv2d-nhwc"])
def test_aarch64_candidates_compute_the_reference_under_emulation(tmp_path, config, spec):
    target = parse_target(config)
    kernel = parse_kernel(spec)
    mods = _candidates(kernel, target, 3)
    assert len(mods) >= 4, "too few storm samples and raindrop neighbours to check"
    packed = sve = 0
    for n, mod in enumerate(mods):
        built = _worker._build(target, tvm.ir.save_json(mod), str(tmp_path / f"c{n}.so"))
        assert cross.elf_machine(built["timed"]) == 183  # an aarch64 library, run only under emulation
        assert emulated.check_emulated(target, kernel.mod, built) == "", f"candidate {n} of {spec}"
        packed += built.get("pack") is not None
        sve += _sve_instructions(built["timed"]) > 0
    if spec == CONV:
        assert packed, "no candidate packed its weights: the pack-then-main path went unchecked"
    if config is A64FX:
        assert sve, "no A64FX candidate uses SVE: the emulator's scalable vectors went unchecked"


@pytest.mark.slow
@needs_emulator
def test_a_wrong_aarch64_kernel_is_caught_under_emulation(tmp_path):
    """A product that skips the last term of its reduction: built for the board, it runs under
    emulation and its output is told apart from the reference's."""
    target = parse_target(NEOVERSE)
    kernel = parse_kernel(DENSE)
    a = te.placeholder((64, 128), name="A")
    b = te.placeholder((96, 128), name="B")
    k = te.reduce_axis((0, 127), name="k")  # one term short
    c = te.compute((64, 96), lambda i, j: te.sum(a[i, k] * b[j, k], axis=k), name="T_matmul_NT")
    lib = str(tmp_path / "wrong.so")
    tvm.build(tvm.IRModule({"main": te.create_prim_func([a, b, c])}), target=target).export_library(
        lib, fcompile=cross.fcompile(target))
    wrong = emulated.check_emulated(target, kernel.mod, {"timed": lib})
    assert wrong.startswith("output 2:") and "differ from the reference" in wrong
    right = str(tmp_path / "right.so")
    tvm.build(kernel.mod, target=target).export_library(right, fcompile=cross.fcompile(target))
    assert emulated.check_emulated(target, kernel.mod, {"timed": right}) == ""


@pytest.mark.slow
@needs_emulator
def test_a_library_refusing_its_arguments_is_one_line_under_emulation(tmp_path):
    target = parse_target(NEOVERSE)
    kernel = parse_kernel(DENSE)
    lib = str(tmp_path / "k.so")
    tvm.build(kernel.mod, target=target).export_library(lib, fcompile=cross.fcompile(target))
    inputs, _, _ = emulated.reference_outputs(kernel.mod, seed=0)
    got = emulated.run_emulated(target, lib, inputs, [("main", [0, 1, 2])])
    np.testing.assert_allclose(got[2], inputs[0] @ inputs[1].T, rtol=1e-4, atol=1e-4)
    with pytest.raises(emulated.EmulatedRunFailed) as err:  # the library's own shape check fails
        emulated.run_emulated(target, lib, [inputs[0][:32], inputs[1], inputs[2]], [("main", [0, 1, 2])])
    assert "\n" not in str(err.value) and "k.so" in str(err.value) and "shape" in str(err.value).lower()


def test_a_missing_emulator_is_named_with_its_package(monkeypatch):
    target = parse_target(NEOVERSE)
    monkeypatch.setattr(emulated.shutil, "which", lambda name: None)
    with pytest.raises(emulated.EmulatorMissing, match="apt install qemu-user"):
        emulated.emulator(target)
    with pytest.raises(ValueError):
        emulated.emulator(parse_target("llvm"))  # this machine's own CPU
