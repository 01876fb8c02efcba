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
         "select_concat": ("tuned with concatenations as TVM writes them (--concat-copies ab", "copies",
                           "TVM's / copies", False, "TVM's concatenations"),
         "concat_copies": ("tuned with concatenations alone as copies (--concat-copies ab", "as TVM writes them",
                           "copies / TVM's", False, "concatenations as copies"),
         "direct": ("tuned with every convolution direct (--winograd-ab", "as lowered", "direct / as lowered", False,
                    "direct"),
         "no_hub": ("tuned without the schedule hub (--hub ab", "with the hub", "no hub / hub", False, "no hub"),
         "no_warm_up": ("tuned with candidates timed straight from idle (--warm-up ab", "warmed up",
                        "no warm-up / warm-up", False, "no warm-up"),
         "other_prior": ("tuned with the cost-model prior of --prior-ab", "with the shipped prior",
                         "other prior / shipped", False, "other prior")}


def storm_fields(spec: str) -> dict:
    """``FIELD=VALUE[,FIELD=VALUE]`` as StormConfig fields, each value of its field's type."""
    from stormdrop.search.storm import StormConfig

    defaults, out = StormConfig(), {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        if not hasattr(defaults, name):
            raise SystemExit(f"--storm-ab: StormConfig has no field {name!r}")
        kind = type(getattr(defaults, name))
        out[name] = value.lower() in ("1", "true", "yes") if kind is bool else \
            (value if kind in (str, type(None)) else kind(value))
    return out


_STORM = "storm "  # a --storm-ab arm's result key: this and its FIELD=VALUE spec


def storm_arm(spec: str) -> str:
    """The result key of a ``--storm-ab`` arm."""
    return _STORM + spec


def storm_specs(r: dict) -> dict[str, str]:
    """The ``--storm-ab`` arms a result holds: key -> spec."""
    return {k: k[len(_STORM):] for k in r if k.startswith(_STORM)}


def arm_words(r: dict) -> dict:
    """``_ARMS`` and the ``--storm-ab`` arms ``r`` holds."""
    storm = {k: (f"tuned with {s} (--storm-ab", "with the defaults", f"{s} / defaults", False, s)
             for k, s in storm_specs(r).items()}
    return {**_ARMS, **storm}


def columns(raw: list[dict]) -> list[tuple[str, str]]:
    """The arms the results hold, in ``arm_words`` order: (key, the arm's name for a column)."""
    words = {k: w for r in raw for k, w in arm_words(r).items()}
    return [(k, w[4]) for k, w in words.items() if any(k in r for r in raw)]
