"""What a model tune is asked to do (``ModelOptions``), as one value built once and only read
below; how each task is searched is a ``SearchOptions`` inside it. Where the target and the
database go are arguments of their own, not options."""

from __future__ import annotations

from dataclasses import dataclass, field

from stormdrop.lowering.pipeline import Lowering
from stormdrop.measure.gateway import MeasureConfig
from stormdrop.search.options import SearchOptions
from stormdrop.tuning.scheduler import UNITS, WARM_UPS


@dataclass(frozen=True)
class ModelOptions:
    """``tune_model``: ``trials`` for all tasks together (None: no global cap; the time budget and
    ``trials_per_task`` end the tuning), ``time_budget`` seconds for everything up to the compiled
    model. ``lowering``: how the model is lowered before its kernels are extracted (None: NHWC on
    CPUs, fast math, Winograd where it pays). ``output``: where the deployable library is written.
    ``untuned``: time the untuned build too (always run, as the reference, for a model without an
    ONNX graph). ``in_model_candidates``: each task deploys the fastest inside the compiled model of
    its best that many records (1: the best record as tuned; local devices only). ``measure``
    None: the model defaults (``MeasureConfig.for_models``). ``lowering_for_budget``: False keeps
    the lowering as given whatever the budget (``Lowering.for_budget`` turns Winograd off under a
    small one): a hub build that tunes the Winograd kernels a short tune then finds in the hub.
    ``warm_up``: the order of the tasks' first rounds (``tuning.scheduler.WARM_UPS``: "in order",
    the model's, or "heaviest" first). ``gradient_unit``: what the task scheduler counts a task's
    diminishing returns in (``tuning.scheduler.UNITS``: Ansor's rounds, or its trials)."""

    trials: int | None = 1000
    trials_per_task: int = 128
    time_budget: float | None = None
    seed: int = 0
    search: SearchOptions = field(default_factory=SearchOptions)
    measure: MeasureConfig | None = None
    lowering: Lowering | None = None
    output: str | None = None
    untuned: bool = False
    in_model_candidates: int = 1
    progress: bool = False
    lowering_for_budget: bool = True
    warm_up: str = WARM_UPS[0]
    gradient_unit: str = UNITS[0]
