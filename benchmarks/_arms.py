"""The A/B arms of bench_models.py and bench_small.py: how each arm's result key, its words in the
notes and its column names are made, and the ``--storm-ab FIELD=VALUE`` specs read."""

from __future__ import annotations

# A/B arms in the notes: key -> (how it was tuned, the main build, the ratio's name, main / arm?, the arm)
_ARMS = {"cold_tuned": ("tuned with the caches flushed (--cache-flush", "tuned warm", "warm / cold", True, "cold"),
         "unpadded": ("tuned with attentions at their own length (--pad-attention ab", "padded", "unpadded / padded",
                      False, "unpadded"),
         "unpadded_rows": ("tuned with matrix products at their own row count (--pad-rows ab", "padded rows",
                           "unpadded / padded", False, "unpadded rows"),
         "padded_columns": ("tuned with constant-weight products and convolutions over padded columns (--pad-columns ab", "as lowered",
                            "padded columns / as lowered", False, "padded columns"),
         "padded_conv_columns": ("tuned with nearly free padded convolution channels (--pad-conv-columns ab",
                                 "as lowered", "padded / as lowered", False, "padded convolution channels"),
         "unpadded_conv_columns": ("tuned with convolutions at their own channel count (--pad-conv-columns ab",
                                   "padded channels", "unpadded / padded", False, "unpadded channels"),
         "select_concat": ("tuned with concatenations as TVM writes them (--concat-copies ab", "copies",
                           "TVM's / copies", False, "TVM's concatenations"),
         "concat_copies": ("tuned with concatenations alone as copies (--concat-copies ab", "as TVM writes them",
                           "copies / TVM's", False, "concatenations as copies"),
         "split_concats": ("tuned with concatenations before convolutions computed as partial convolutions "
                           "(--split-concats ab", "as lowered", "split / as lowered", False, "split concatenations"),
         "narrow_columns": ("tuned with narrow convolution channels padded too (--pad-narrow-columns ab",
                            "as lowered", "padded narrow / as lowered", False, "narrow channels padded"),
         "half_columns": ("tuned with half-width convolution channels padded too (--pad-half-columns ab",
                          "as lowered", "padded half / as lowered", False, "half-width channels padded"),
         "padded_width": ("tuned with badly tiling convolution output widths padded (--pad-conv-width ab",
                          "as lowered", "padded width / as lowered", False, "output width padded"),
         "unpadded_width": ("tuned with convolutions at their own output width (--pad-conv-width ab", "padded width",
                            "unpadded / padded", False, "unpadded width"),
         "padded_height": ("tuned with badly tiling convolution output heights padded too (--pad-conv-height ab",
                           "as lowered", "padded height / as lowered", False, "output height padded"),
         "nchw_shuffles": ("tuned with channel shuffles in NCHW (--nhwc-shuffles ab", "NHWC shuffles",
                           "NCHW / NHWC shuffles", False, "NCHW shuffles"),
         "winograd_exact": ("tuned with Winograd kept under small budgets only where the donors hold each kernel "
                            "itself (--winograd-related ab", "related donors", "exact / related", False,
                            "Winograd from exact donors only"),
         "direct": ("tuned with every convolution direct (--winograd-ab", "as lowered", "direct / as lowered", False,
                    "direct"),
         "no_hub": ("tuned without the schedule hub (--hub ab", "with the hub", "no hub / hub", False, "no hub"),
         "in_order": ("tuned with every task's first round in the model's order (--in-order-ab",
                      "heaviest first", "in order / heaviest first", False, "in order"),
         "per_trial": ("tuned with the task scheduler's returns counted in trials (--per-trial-ab", "in rounds",
                       "trials / rounds", False, "in trials"),
         "other_hub": ("tuned with the hub file of --other-hub", "with the shipped hub", "other hub / shipped", False,
                       "other hub"),
         "no_warm_up": ("tuned with candidates timed straight from idle (--warm-up ab", "warmed up",
                        "no warm-up / warm-up", False, "no warm-up"),
         "other_prior": ("tuned with the cost-model prior of --prior-ab", "with the shipped prior",
                         "other prior / shipped", False, "other prior")}


def fields(spec: str, defaults, flag: str) -> dict:
    """``FIELD=VALUE[,FIELD=VALUE]`` as fields of the dataclass value ``defaults``, each value of its
    field's type (a bool: true for 1, true or yes); a field it does not have ends the script."""
    out = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if not hasattr(defaults, name):
            raise SystemExit(f"{flag}: {type(defaults).__name__} has no field {name!r}")
        kind = type(getattr(defaults, name))
        out[name] = value.lower() in ("1", "true", "yes") if kind is bool else \
            (value if kind in (str, type(None)) else kind(value))
    return out


def existing_file(path: str) -> str:
    """An argparse ``type`` for a file that must exist (``--other-hub``): a missing one ends the script
    with one error line before anything is tuned."""
    import argparse
    import os

    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    return path


# Arms of FIELD=VALUE specs (--storm-ab, --measure-ab, --raindrop-ab): kind -> the stormdrop config class
# whose fields they change; an arm's result key is the kind, a space and its spec.
CONFIG_ARMS = {"storm": "StormConfig", "measure": "MeasureConfig", "raindrop": "RaindropConfig"}


def config_arm(kind: str, spec: str) -> str:
    """The result key of a ``--KIND-ab`` arm."""
    return f"{kind} {spec}"


def add_config_arm_flags(p) -> None:
    """The ``--KIND-ab FIELD=VALUE[,FIELD=VALUE]`` flags of ``CONFIG_ARMS`` on an argument parser."""
    for kind, config in CONFIG_ARMS.items():
        p.add_argument(f"--{kind}-ab", action="append", default=[], metavar="FIELD=VALUE[,FIELD=VALUE]",
                       help=f"also tune with these {config} fields changed (e.g. a bool field=0), timed in turns "
                            "with the peers; repeatable, one arm each")


def config_arm_argv(args) -> list[str]:
    """The ``CONFIG_ARMS`` flags of parsed ``args`` as command-line arguments again (to pass on)."""
    return [a for kind in CONFIG_ARMS for spec in getattr(args, f"{kind}_ab") for a in (f"--{kind}-ab", spec)]


def config_fields(kind: str, spec: str) -> dict:
    """``FIELD=VALUE[,FIELD=VALUE]`` of a ``--KIND-ab`` arm as fields of its config class (``fields``)."""
    import stormdrop

    return fields(spec, getattr(stormdrop, CONFIG_ARMS[kind])(), f"--{kind}-ab")


# Lowering switches of bench_models.py: field -> (its A/B arm's key, the flag's help). Each is a flag
# --FIELD on|off|ab, its default the library's; ab tunes once more with the field flipped.
LOWERING_SWITCHES = {
    "pad_attention": ("unpadded", "stormdrop computes attentions over a badly tiling sequence at a padded length"),
    "pad_rows": ("unpadded_rows", "matrix products whose row count tiles badly computed over padded rows"),
    "pad_columns": ("padded_columns", "products with constant weights whose column count is no multiple of the "
                    "vector width computed over zero-weight columns"),
    "pad_conv_columns": ("unpadded_conv_columns", "convolutions whose channel count pads to the vector width for "
                         "at most 1/32 more channels computed over zero-weight channels"),
    "pad_narrow_columns": ("narrow_columns", "with --pad-conv-columns, convolutions whose channel count tiles to "
                           "a quarter of the vector width or less computed over zero-weight channels"),
    "pad_half_columns": ("half_columns", "with --pad-narrow-columns, channel counts that tile to half the vector "
                         "width padded too (at most 1/16 more)"),
    "pad_conv_width": ("unpadded_width", "convolutions whose output width has no divisor from 4 to 16 computed "
                       "over a few more output columns"),
    "pad_conv_height": ("padded_height", "with --pad-conv-width, convolution output heights that tile so padded too"),
    "concat_copies": ("select_concat", "concatenations alone as one copy per input"),
    "split_concats": ("split_concats", "channel concatenations that feed only convolutions computed as partial "
                      "convolutions of their inputs"),
    "nhwc_shuffles": ("nchw_shuffles", "an NHWC model's channel shuffles (and the slices and concatenations "
                      "around them) computed in NHWC"),
    "winograd_related": ("winograd_exact", "under a budget too small for Winograd kernels, auto Winograd kept "
                         "where the donors hold Winograd kernels of each one's tile size, not only each itself"),
}


def add_lowering_switches(p) -> None:
    """The ``LOWERING_SWITCHES`` flags of an argument parser."""
    from stormdrop import Lowering

    for field, (_, what) in LOWERING_SWITCHES.items():
        default = "on" if getattr(Lowering(), field) else "off"
        p.add_argument("--" + field.replace("_", "-"), default=default, choices=["on", "off", "ab"],
                       help=f"{what} (on), not (off), or both, timed in turns with the peers (ab); default: "
                            "the library's")


def lowering_switch_argv(args) -> list[str]:
    """The ``LOWERING_SWITCHES`` flags of parsed ``args`` as command-line arguments again (to pass on)."""
    return [a for field in LOWERING_SWITCHES for a in ("--" + field.replace("_", "-"), getattr(args, field))]


def lowering_switches(args) -> dict:
    """The ``Lowering`` fields the flags set: on, off, or the library's default under ab."""
    from stormdrop import Lowering

    return {field: {"on": True, "off": False}.get(getattr(args, field), getattr(Lowering(), field))
            for field in LOWERING_SWITCHES}


def lowering_arms(args, lowering) -> list[tuple[str, dict]]:
    """The A/B arms of the switches given as ab: (key, {"lowering": ``lowering`` with the field flipped})."""
    import dataclasses

    return [(key, {"lowering": dataclasses.replace(lowering, **{field: not getattr(lowering, field)})})
            for field, (key, _) in LOWERING_SWITCHES.items() if getattr(args, field) == "ab"]


def arm_words(r: dict) -> dict:
    """``_ARMS`` and the ``CONFIG_ARMS`` arms ``r`` holds."""
    specs = {k: (k[len(kind) + 1:], f"--{kind}-ab") for kind in CONFIG_ARMS for k in r if k.startswith(kind + " ")}
    return {**_ARMS, **{k: (f"tuned with {s} ({flag}", "with the defaults", f"{s} / defaults", False, s)
                        for k, (s, flag) in specs.items()}}


def tuning_arms(args, lowering) -> list[tuple[str, dict]]:
    """bench_models.py's A/B arms as its flags ask for them: (result key, what the arm's tuning changes:
    keywords of its ``tune``), each tuned and timed like stormdrop's."""
    import dataclasses

    arms = []
    if args.cache_flush == "ab":  # candidates timed with the caches flushed
        arms.append(("cold_tuned", {"cache_flush": True}))
    arms += lowering_arms(args, lowering)  # one lowering switch flipped
    if args.winograd_ab:  # every convolution direct
        arms.append(("direct", {"lowering": dataclasses.replace(lowering, winograd="off")}))
    if args.hub == "ab":  # without the schedule hub
        arms.append(("no_hub", {"hub": False}))
    if args.other_hub:  # with another hub file
        arms.append(("other_hub", {"hub": args.other_hub}))
    if args.in_order_ab:  # the tasks' first rounds in the model's order
        arms.append(("in_order", {"warm_up": "in order"}))
    if args.per_trial_ab:  # the scheduler's diminishing returns counted in trials (not rounds)
        arms.append(("per_trial", {"gradient_unit": "trials"}))
    if args.warm_up == "ab":  # candidates timed straight from idle
        arms.append(("no_warm_up", {"warmup_ms": 0.0}))
    if args.prior_ab:  # the cost model starting from another prior
        arms.append(("other_prior", {"prior_file": args.prior_ab, "prior_alone": args.prior_ab_alone}))
    for kind in CONFIG_ARMS:  # other storm, measurement or raindrop parameters
        arms += [(config_arm(kind, spec), {kind: config_fields(kind, spec)}) for spec in getattr(args, f"{kind}_ab")]
    return arms


def columns(raw: list[dict]) -> list[tuple[str, str]]:
    """The arms the results hold, in ``arm_words`` order: (key, the arm's name for a column)."""
    words = {k: w for r in raw for k, w in arm_words(r).items()}
    return [(k, w[4]) for k, w in words.items() if any(k in r for r in raw)]
