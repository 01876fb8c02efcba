"""stormdrop: explore as a storm, exploit as a raindrop.

An auto-scheduler for deep-learning kernels on Apache TVM: Ansor-style exploration
(MetaSchedule's design space, evolutionary search, learned cost model), Droplet
Search exploitation, and a persistent SQLite database of every measurement.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["KernelOptions", "Lowering", "ModelOptions", "SearchOptions", "__version__", "open_database",
           "parse_kernel", "tune_kernel", "tune_model"]


def __getattr__(name: str):  # lazy: `import stormdrop` stays cheap (no TVM import)
    if name == "tune_kernel":
        from stormdrop.tuning.kernel_tune import tune_kernel

        return tune_kernel
    if name == "tune_model":
        from stormdrop.model.tune import tune_model

        return tune_model
    if name == "parse_kernel":
        from stormdrop.workloads import parse_kernel

        return parse_kernel
    if name == "KernelOptions":
        from stormdrop.tuning.options import KernelOptions

        return KernelOptions
    if name == "ModelOptions":
        from stormdrop.model.options import ModelOptions

        return ModelOptions
    if name == "SearchOptions":
        from stormdrop.search.options import SearchOptions

        return SearchOptions
    if name == "Lowering":
        from stormdrop.lowering.pipeline import Lowering

        return Lowering
    if name == "open_database":
        from stormdrop.storage.database import Database

        return Database
    raise AttributeError(name)
