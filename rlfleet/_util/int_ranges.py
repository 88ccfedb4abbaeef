"""Whether an integer array's entries all lie in ``0 .. high``, in one reduction.

Seen as the unsigned type of its size, a negative entry is huge, so one
``max`` answers both bounds: a vector step's actions are checked this way
(by the worker, and by a native env's own action space) without a second
pass or a boolean temporary.
"""

from __future__ import annotations

import numpy as np

#: The unsigned dtype of each integer dtype, of the same size.
UNSIGNED = {
    np.dtype(f"{kind}{size}"): np.dtype(f"u{size}") for kind in "iu" for size in (1, 2, 4, 8)
}

# ``ndarray.max`` without its Python wrapper (called once per vector step).
_MAX = np.maximum.reduce


def all_within(array: np.ndarray, high: int) -> bool | None:
    """Whether every entry of ``array`` lies in ``0 .. high`` (both included).

    None when one reduction cannot tell: ``array`` is not an integer array,
    or is empty.
    """
    unsigned = UNSIGNED.get(array.dtype)
    if unsigned is None or not array.size:
        return None
    return bool(_MAX(array.view(unsigned), axis=None) <= high)
