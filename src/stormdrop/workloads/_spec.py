"""Tokenizer of built-in kernel specs: ``NAME:key=value,key=value,...``."""

from __future__ import annotations

import re

from stormdrop.errors import SpecError

_INT_RE = re.compile(r"[+-]?\d+")


def split_spec(spec: str) -> tuple[str, str | None]:
    """Split ``spec`` into its (stripped) operator name and parameter text.

    The parameter text is ``None`` when the spec has no ``:`` at all.
    """
    if not spec or not spec.strip():
        raise SpecError(
            "empty kernel spec: expected NAME:key=value,... or path/to/file.py:function"
        )
    name, sep, rest = spec.strip().partition(":")
    return name.strip(), (rest if sep else None)


def parse_params(op: str, text: str) -> dict[str, str]:
    """Parse ``key=value,key=value`` into an ordered dict of stripped strings.

    Raises ``SpecError`` on a token without ``=``, an empty key or value, an empty
    token (e.g. ``,,``) and a duplicate key.
    """
    params: dict[str, str] = {}
    if not text.strip():
        return params
    for raw in text.split(","):
        token = raw.strip()
        if not token:
            raise SpecError(
                f"{op}: empty parameter in '{text.strip()}': expected key=value,key=value"
            )
        key, eq, value = token.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise SpecError(f"{op}: bad parameter '{token}': expected key=value")
        if not value:
            raise SpecError(f"{op}: parameter {key} has no value: expected {key}=<value>")
        if key in params:
            raise SpecError(f"{op}: duplicate parameter {key} (given {params[key]} and {value})")
        params[key] = value
    return params


def parse_int(op: str, key: str, value: str, *, minimum: int = 1) -> int:
    """Parse an integer parameter that must be ``>= minimum`` (1: positive, 0: non-negative)."""
    kind = "positive" if minimum >= 1 else "non-negative"
    if not _INT_RE.fullmatch(value):
        raise SpecError(
            f"{op}: parameter {key}={value} is not an integer: expected a {kind} integer"
        )
    number = int(value)
    if number < minimum:
        raise SpecError(f"{op}: parameter {key}={value} is out of range: expected a {kind} integer")
    return number
