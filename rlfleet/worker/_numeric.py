"""A fast finiteness check for batches (the worker's NaN handling)."""

from __future__ import annotations

import math

import numpy as np


def all_finite(values: np.ndarray) -> bool:
    """Whether every element is finite (True for integer dtypes).

    One BLAS dot product in the common case: ``vdot(v, v)``, a sum of
    squares, is finite when every element is (NaN and inf propagate). It
    can also overflow for huge finite values, so the exact elementwise
    check runs whenever it is not finite.
    """
    kind = values.dtype.kind
    if kind not in "fc":
        return True
    if kind == "f" and math.isfinite(np.vdot(values, values)):
        return True
    return bool(np.isfinite(values).all())
