"""stormdrop: explore as a storm, exploit as a raindrop.

An auto-scheduler for deep-learning kernels on Apache TVM: Ansor-style exploration
(MetaSchedule's design space, evolutionary search, learned cost model), Droplet
Search exploitation, and a persistent SQLite database of every measurement.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["KernelOptions", "Lowering", "MeasureConfig", "ModelOptions", "Phase", "RaindropConfig", "SearchOptions",
           "StormConfig", "__version__", "extract_tasks", "load_model", "open_database", "parse_kernel",
           "tune_kernel", "tune_model"]

# Public modules beside these names: ``stormdrop.timing`` (a tuned model timed beside ONNX Runtime
# and OpenVINO) and ``stormdrop.target`` (the host target, parsing, canonical form).


_PUBLIC = {  # name -> the module that defines it, imported on first use
    "tune_kernel": "stormdrop.tuning.kernel_tune",
    "tune_model": "stormdrop.model.tune",
    "KernelOptions": "stormdrop.tuning.options",
    "ModelOptions": "stormdrop.model.options",
    "SearchOptions": "stormdrop.search.options",
    "parse_kernel": "stormdrop.workloads",
    "Lowering": "stormdrop.lowering.pipeline",
    "load_model": "stormdrop.workloads.models",
    "extract_tasks": "stormdrop.model.tune",
    "StormConfig": "stormdrop.search.storm",
    "RaindropConfig": "stormdrop.search.raindrop",
    "MeasureConfig": "stormdrop.measure.gateway",
    "Phase": "stormdrop.records",
}


def __getattr__(name: str):  # lazy: `import stormdrop` stays cheap (no TVM import)
    import importlib

    if name == "open_database":
        from stormdrop.storage.database import Database

        return Database
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(name)
