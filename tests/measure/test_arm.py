"""ARM CPUs without one: candidates for aarch64 targets (Neoverse N1, A64FX with SVE) are sampled,
built and linked on this x86 host by the distribution's cross compiler (``gcc-aarch64-linux-gnu``,
which ``scripts/test.sh`` installs), their Droplet neighbours replay and build; such a target is
timed on a device behind an RPC tracker, and refused without one."""

from __future__ import annotations

import platform
import shutil

import pytest
import tvm

from stormdrop.cli.main import main
from stormdrop.measure import _worker
from stormdrop.search.space import DecisionSpace
from stormdrop.search.storm import Storm, StormConfig
from stormdrop.target import parse_target
from stormdrop.tvm_compat import cross
from stormdrop.workloads import parse_kernel

EM_AARCH64 = 183
NEOVERSE = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 4}
A64FX = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "a64fx", "num-cores": 12}

needs_cross = pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which("aarch64-linux-gnu-gcc") is None,
    reason="an x86 host with the aarch64 cross compiler (apt install gcc-aarch64-linux-gnu)")


@pytest.mark.slow
@needs_cross
@pytest.mark.parametrize("config", [NEOVERSE, A64FX], ids=["neoverse-n1", "a64fx"])
def test_aarch64_candidates_are_sampled_and_cross_linked_on_this_host(tmp_path, config):
    target = parse_target(config)
    assert cross.is_foreign(target) and str(target.attrs["mcpu"]) == config["mcpu"]
    kernel = parse_kernel("dense:M=64,N=256,K=256")
    storm = Storm(kernel.mod, target, trials=4, seed=0,
                  config=StormConfig(batch_size=4, population_size=16, genetic_num_iters=1, init_min_unmeasured=16))
    cands = storm.propose()
    assert cands
    built = _worker._build(target, tvm.ir.save_json(cands[0].mod), str(tmp_path / "c0.so"))
    assert cross.elf_machine(built["timed"]) == EM_AARCH64  # linked for the board, not for this machine

    space = DecisionSpace(kernel.mod, storm.sketches.postprocs, cands[0].sch.trace, num_cores=1)
    valid = [s for s in (space.apply(p) for p in space.neighbours(space.start, 1)[:12]) if s is not None]
    assert valid, "no radius-1 neighbour of an aarch64 schedule replays"
    built = _worker._build(target, tvm.ir.save_json(valid[0].mod), str(tmp_path / "n0.so"))
    assert cross.elf_machine(built["timed"]) == EM_AARCH64
    storm.close()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86 host")
def test_an_aarch64_target_without_an_rpc_device_is_refused_before_any_work(tmp_path, capsys):
    db = tmp_path / "arm.db"
    code = main(["tune", "--kernel", "matmul:M=64,N=64,K=64", "--target", str(NEOVERSE).replace("'", '"'),
                 "--db", str(db)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--rpc-tracker" in err[0] and not db.exists()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86 host")
def test_a_missing_cross_compiler_is_named_with_its_package(monkeypatch):
    target = parse_target(NEOVERSE)
    monkeypatch.setattr(cross.shutil, "which", lambda name: None)
    assert "apt install gcc-aarch64-linux-gnu" in cross.unrunnable(target, remote=True)
    assert cross.unrunnable(parse_target("llvm"), remote=False) is None  # this machine's own CPU
