"""Time a tuned model beside ONNX Runtime and OpenVINO, on the same inputs, in turns.

The public toolkit for comparing runtimes (the benchmark scripts use nothing else of the model
code): ``tuned_build`` compiles a model with the records a database holds for its tasks;
``peers`` runs ONNX Runtime (the reference outputs) and OpenVINO at their best fair settings on
the target's cores; a *timer* is a function returning one latency sample in seconds
(``tvm_timer`` for a compiled model); ``in_turns`` takes every timer's samples round by round, so
that a slow spell of a shared machine falls on all of them alike. ``max_abs_diff`` compares
outputs with a reference; ``task_times`` times each tuned kernel inside the model.

    from stormdrop import load_model, open_database
    from stormdrop.target import host_target, num_cores
    from stormdrop.timing import in_turns, peers, random_inputs, tuned_build, tvm_timer

    model, target = load_model("resnet18", resolution=56), host_target()
    inputs = random_inputs(model)
    found = peers(model, inputs, num_cores(target))
    with open_database("stormdrop.db", read_only=True) as db:
        executable, tasks = tuned_build(model, db, target)
    latency_s = in_turns({**found.timers, "stormdrop": tvm_timer(executable, inputs, target)}, rounds=5)
"""

from __future__ import annotations

from stormdrop.model.bench import TaskRow, task_times_in_model, tuned_build
from stormdrop.model.run import (
           Peers,
           compile_model,
           kernel_times,
           max_abs_diff,
           peers,
           random_inputs,
)
from stormdrop.model.run import interleaved as in_turns
from stormdrop.model.run import model_timer as tvm_timer
from stormdrop.model.run import run_model as run_tvm
from stormdrop.model.runtimes import onnxruntime_timer, openvino_timer

__all__ = ["Peers", "TaskRow", "compile_model", "in_turns", "kernel_times", "max_abs_diff", "peers",
           "onnxruntime_timer", "openvino_timer", "random_inputs", "run_tvm", "task_times_in_model", "tuned_build",
           "tvm_timer"]
