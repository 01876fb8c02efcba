"""Whether a candidate computed its workload's reference outputs: the runner's check of each output
against the reference build's, at the precision of the output's dtype. Pure NumPy: no TVM, no device."""

from __future__ import annotations

from typing import Any

import numpy as np

# relative tolerance of a candidate's output by dtype: float32's 1e-3, and for the half-precision
# types a few units of their last place (a product over K sums in another order than the reference's)
_RTOL = {"float16": 1e-2, "bfloat16": 5e-2}


def mismatches(got: Any, want: Any) -> Any:
    """The elements of a candidate's output ``got`` that differ from the reference ``want``: beyond
    the dtype's relative tolerance (``_RTOL``, 1e-3 otherwise) of the element and of the largest
    finite reference value; exact for integers. A NaN (or infinity) where the reference has the
    same agrees: random inputs make them (a batch norm's random variance below zero under a square
    root), and a kernel that computes them where its reference does is right."""
    if not np.issubdtype(want.dtype, np.floating):
        return got != want
    rtol = _RTOL.get(str(want.dtype), 1e-3)
    ref = want.astype(np.float32)
    finite = np.abs(ref[np.isfinite(ref)])
    tol = rtol * max(1.0, float(finite.max()) if finite.size else 1.0)
    return ~np.isclose(got.astype(np.float32), ref, rtol=rtol, atol=tol, equal_nan=True)


def difference(i: int, got: Any, want: Any) -> str:
    """How output ``i`` differs from the reference, in one line; "" where it does not."""
    if got.shape != want.shape:
        return f"output {i}: shape {got.shape} != {want.shape}"
    bad = mismatches(got, want)
    if not bad.any():
        return ""
    idx = np.unravel_index(int(np.argmax(bad)), bad.shape)
    return (f"output {i}: {int(bad.sum())} of {bad.size} elements differ "
            f"from the reference (at {tuple(int(x) for x in idx)}: {got[idx]} vs {want[idx]})")
