"""How a model is lowered before its kernels are tuned: layout, fast math, Winograd, merged matmuls.

One value (``Lowering``) travels from the command line to task extraction, tuning, compiling
and benchmarking, so that a model is always compiled the way its tasks were tuned.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.target import Target

from stormdrop.errors import SpecError
from stormdrop.lowering import (
    attention,
    concat,
    concat_split,
    constants,
    fastmath,
    padded_columns,
    padded_rows,
    padded_width,
    reductions,
)
from stormdrop.lowering.layout import LAYOUTS, convert_layout, op_calls
from stormdrop.lowering.layout import legalizations as layout_legalizations
from stormdrop.lowering.winograd import MIN_TRIALS_PER_TASK, TRIAL_S, planned_key
from stormdrop.lowering.winograd import MODES as WINOGRAD_MODES
from stormdrop.lowering.winograd import legalization as winograd_legalization
from stormdrop.tvm_compat.intrinsics import load_tensor_intrinsics
from stormdrop.tvm_compat.relax_passes import combine_parallel_matmuls

# switches a tune notes (``Lowering.noted``): a note without one was of a tune before it
NOTED_SWITCHES = ("pad_conv_columns", "concat_copies", "nhwc_shuffles", "pad_narrow_columns", "pad_half_columns",
                  "pad_conv_width", "pad_conv_height")


@dataclass(frozen=True)
class Lowering:
    """``layout``: the convolutions' layout, ``auto`` (NHWC on CPUs), ``nhwc``, ``blocked``
    (``NCHW{b}c``) or ``nchw`` (the model's own); see ``layout.convert_layout``.
    ``fast_math``: vectorizable erf/exp/tanh/sigmoid/softmax on CPUs (``fastmath``).
    ``winograd``: 3x3 stride-1 NHWC convolutions as Winograd F(m x m, 3 x 3) on CPUs:
    ``auto`` (where ``winograd.choose_tile`` expects a gain), ``off``, ``2`` or ``4`` (all).
    ``combine_matmuls``: matmuls of one input by constant weights (a transformer's Q, K and
    V projections) merged into one GEMM and a split. Off by default: not yet measured to
    pay (tuned, BERT-base's three projections already ran at its wide GEMMs' speed, and the
    split is one more kernel).
    ``tiled_reductions``: means and sums over outer axes (NHWC's global pooling) written so
    that the search tiles them (``reductions``), on CPUs.
    ``pad_attention``: attentions over a sequence that tiles badly (a ViT's 197 tokens)
    computed at a padded length, masked (``attention.pad_sequences``), on CPUs.
    ``pad_rows``: matrix products whose row count tiles badly (a ViT's 197 tokens) computed
    over a few more rows and cropped (``padded_rows``), on CPUs.
    ``pad_columns``: matrix products and convolutions with constant weights whose column
    (output-channel) count is no multiple of the vector width (a classifier's 1000) computed
    over zero-weight columns up to the next multiple and cropped (``padded_columns``), on CPUs.
    Off by default until measured on models.
    ``pad_conv_columns``: where ``pad_columns`` is off, ungrouped convolutions whose output channels
    pad to the vector width for at most 1/32 more of them (a SqueezeNet's 1000-channel classifier;
    ``padded_columns.nearly_free``) computed padded all the same, on CPUs. On by default.
    ``pad_narrow_columns``: with ``pad_conv_columns``, also those whose channel count tiles to a
    quarter of the vector width or less, for at most 1/8 more channels (``padded_columns.narrow``:
    a ShuffleNet's 58 and 116). On by default.
    ``pad_half_columns``: with ``pad_narrow_columns``, also channel counts that tile to half the
    vector width, for at most 1/16 more channels (a ShuffleNet's 232). On by default.
    ``pad_conv_width``: convolutions whose output width has no divisor from 4 to 16 (a 59- or
    29-wide image) computed over a few more output columns and cropped (``padded_width``), on CPUs.
    On by default.
    ``pad_conv_height``: with ``pad_conv_width``, output heights that tile so padded too (more output
    rows, cropped alike). Off by default.
    ``concat_copies``: concatenations that fusion leaves alone as one vectorizable copy per input
    into its slice of the output (``concat``) instead of TVM's per-element choice of input, on CPUs.
    On by default.
    ``split_concats``: channel concatenations that feed only convolutions (a SqueezeNet's fire
    modules) computed as partial convolutions of their inputs, summed (``concat_split``), on CPUs.
    ``nhwc_shuffles``: an NHWC model's channel shuffles (ShuffleNet's) computed in NHWC, and the
    slices and concatenations around them (``shuffles``). On by default.
    ``winograd_related``: under a budget too small for Winograd kernels (``for_budget``), ``auto``
    keeps them where reuse's donors (the schedule hub) hold Winograd kernels of the same tile size
    for every one of them, tuned for other shapes (transfers), and every one reads and writes at
    least 64 channels; not only where they hold each one itself (``model.tune.budgeted_tasks``).
    On by default.
    """

    layout: str = "auto"
    fast_math: bool = True
    winograd: str = "auto"
    combine_matmuls: bool = False
    tiled_reductions: bool = True
    pad_attention: bool = True
    pad_rows: bool = True
    pad_columns: bool = False
    pad_conv_columns: bool = True
    pad_narrow_columns: bool = True
    pad_half_columns: bool = True
    pad_conv_width: bool = True
    pad_conv_height: bool = False
    concat_copies: bool = True
    split_concats: bool = False
    nhwc_shuffles: bool = True
    winograd_related: bool = True

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise SpecError(f"--layout: expected one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if self.winograd not in WINOGRAD_MODES:
            raise SpecError(f"--winograd: expected one of {', '.join(WINOGRAD_MODES)}, got {self.winograd!r}")

    def for_budget(self, trials: int | None, num_tasks: int, time_budget: float | None = None) -> Lowering:
        """This lowering for a model tuned under a global trial cap or a time budget: ``winograd="auto"``
        keeps every convolution direct when the budget gives its tasks fewer than
        ``winograd.MIN_TRIALS_PER_TASK`` trials each (a Winograd kernel tuned that little loses to the
        direct one), a time budget taken at ``winograd.TRIAL_S`` a trial."""
        if time_budget:
            by_time = int(time_budget / TRIAL_S)
            trials = by_time if trials is None else min(trials, by_time)
        if self.winograd != "auto" or trials is None or num_tasks <= 0 or trials >= num_tasks * MIN_TRIALS_PER_TASK:
            return self
        return dataclasses.replace(self, winograd="off")

    def as_tuned(self, note: dict) -> Lowering:
        """This lowering as a model's last tune used it (its ``note``): ``auto`` Winograd that the
        tune's trial cap turned off (``for_budget``) stays off, and so do padded convolution columns
        and concatenations as copies where the tune did without them (or was before them), so that
        its tasks are the tuned ones."""
        off = {name: False for name in NOTED_SWITCHES  # tuned before the switch, or without it
               if getattr(self, name) and not note.get(name, False)}
        if self.winograd == "auto" and note.get("winograd") == "off":
            off["winograd"] = "off"
        return dataclasses.replace(self, **off) if off else self

    def noted(self) -> dict:
        """What a model's tune notes of this lowering, for ``as_tuned`` to read back."""
        return {"winograd": self.winograd, **{name: getattr(self, name) for name in NOTED_SWITCHES}}

    def _laid_out(self, mod: tvm.IRModule, target: Target) -> tvm.IRModule:
        """``lower``'s steps before legalization (under ``with target``): the convolutions in their layout."""
        mod = relax.transform.CanonicalizeBindings()(mod)
        if self.pad_attention and target.kind.name == "llvm":
            mod = attention.pad_sequences(mod)
        if self.combine_matmuls:  # Q, K and V projections (matmuls sharing their input) as one GEMM
            mod = combine_parallel_matmuls(mod)
        return relax.transform.Normalize()(convert_layout(mod, target, self.layout, self.nhwc_shuffles))

    def _before_legalization(self, mod: tvm.IRModule, target: Target) -> tvm.IRModule:
        """``_laid_out`` with the weights' layouts computed (``constants.fold``), and the graph
        rewrites that need constant weights."""
        mod = constants.fold(self._laid_out(mod, target))  # weights laid out in NumPy, not compiled
        if self.split_concats and target.kind.name == "llvm":
            mod = concat_split.split(mod)
        return mod

    def convolutions(self, mod: tvm.IRModule, target: Target) -> tuple[int, list[tuple]]:
        """The model's distinct convolutions (each is a kernel of its own: at least this many
        tasks), and the Winograd kernels this lowering makes of them (``winograd.planned_key``),
        without legalizing or compiling anything."""
        mode = self.winograd if target.kind.name == "llvm" else "off"
        with target:
            mod = self._before_legalization(mod, target)
        distinct, keys = set(), []
        for func in mod.functions.values():
            if not isinstance(func, relax.Function):
                continue
            for call in op_calls(func):
                if call.op.name != "relax.nn.conv2d":
                    continue
                distinct.add((str(call.args[0].ty), str(call.args[1].ty), str(call.attrs)))
                key = planned_key(call, mode)
                if key is not None and key not in keys:
                    keys.append(key)
        return len(distinct), keys

    def lower(self, mod: tvm.IRModule, target: Target, prepack_weights: bool) -> tvm.IRModule:
        """The model's Relax module, legalized and fused into kernels for ``target``.
        ``prepack_weights``: weights and constants become layout-free buffers of the kernels."""
        load_tensor_intrinsics(target)
        cpu = target.kind.name == "llvm"
        with target:
            mod = self._before_legalization(mod, target)
            rules = dict(layout_legalizations())
            if self.fast_math and cpu:
                rules.update(fastmath.legalizations())
            if self.tiled_reductions and cpu:
                rules.update(reductions.legalizations())
            if self.pad_rows and cpu:
                rules.update(padded_rows.legalizations())
            if self.pad_conv_width and cpu:  # direct convolutions only: inside the Winograd rule
                rules["relax.nn.conv2d"] = padded_width.legalization(rules["relax.nn.conv2d"], self.pad_conv_height)
            if self.winograd != "off" and cpu:
                rules["relax.nn.conv2d"] = winograd_legalization(self.winograd, rules["relax.nn.conv2d"])
            if (self.pad_columns or self.pad_conv_columns) and cpu:
                inner = rules.get("relax.matmul") or tvm.ir.Op.get("relax.matmul").get_attr("FLegalize")
                convs = None if self.pad_columns else padded_columns.conv_rule(self.pad_narrow_columns,
                                                                               self.pad_half_columns)
                rules.update(padded_columns.legalizations(inner, rules["relax.nn.conv2d"], convs_only=convs))
            mod = relax.transform.LegalizeOps(rules)(mod)
            fused = relax.get_pipeline("zero")(mod)
            if self.concat_copies and cpu:
                fused = concat.as_copies(fused)
            if prepack_weights:
                fused = relax.transform.AttachAttrLayoutFreeBuffers()(fused)
        return fused
