"""How the Relax VM runs a compiled model: its own function compiled to machine code on a CPU,
interpreted as bytecode where every kernel call must be timed (``model.run.vm_exec_mode``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from stormdrop.model.run import compile_model, kernel_times, random_inputs, run_model, vm_exec_mode
from stormdrop.model.tune import extract_tasks
from stormdrop.target import parse_target
from stormdrop.workloads.models import load_model

TARGET = parse_target(None)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exports"


def test_a_cpu_model_runs_its_compiled_function_unless_instrumented_and_a_gpu_model_its_bytecode():
    assert vm_exec_mode(TARGET) == "compiled"
    assert vm_exec_mode(TARGET, instrumented=True) == "bytecode"
    assert vm_exec_mode(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})) == "bytecode"


@pytest.mark.slow
def test_the_compiled_vm_function_computes_what_the_bytecode_does_and_only_the_bytecode_is_instrumented():
    """An exported DistilBERT (int64 token ids, an attention mask, embeddings): both builds give
    the same outputs bit for bit; ``kernel_times`` times every kernel of the instrumented build and
    says so, in one error, when handed the deployed build."""
    model = load_model(str(FIXTURES / "hf_distilbert.onnx"))
    fused, tasks = extract_tasks(model, TARGET)
    deployed = compile_model(fused, ms.database.MemoryDatabase(), TARGET)
    instrumented = compile_model(fused, ms.database.MemoryDatabase(), TARGET, instrumented=True)
    inputs = random_inputs(model, 0)
    outs, _ = run_model(deployed, inputs, TARGET, time_it=False)
    ref, _ = run_model(instrumented, inputs, TARGET, time_it=False)
    assert len(outs) == len(ref) and all(np.array_equal(o, r) for o, r in zip(outs, ref))
    assert np.std(ref[0]) > 0.05
    times = kernel_times(instrumented, inputs, TARGET, runs=2)
    assert {k.name for k, _ in tasks} <= {s.removesuffix("_prepacked") for s in times}
    with pytest.raises(ValueError, match="instrumented=True"):
        kernel_times(deployed, inputs, TARGET, runs=2)
