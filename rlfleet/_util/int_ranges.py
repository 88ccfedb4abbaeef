"""Whether an integer array's entries all lie in ``0 .. high``, in one reduction.

Seen as the unsigned type of its size, a negative entry is huge, so one
``max`` answers both bounds: a vector step's actions are checked this way
(by the worker, and by a native env's own action space) without a second
pass or a boolean temporary. A numpy reduction has a fixed cost of about a
microsecond, though, whatever the size: an array of at most
:data:`SMALL` entries (a per-env worker's 8 actions) is read as a Python
list instead, whose ``min`` and ``max`` cost half of that.
"""

from __future__ import annotations

import numpy as np

#: The unsigned dtype of each integer dtype, of the same size.
UNSIGNED = {
    np.dtype(f"{kind}{size}"): np.dtype(f"u{size}") for kind in "iu" for size in (1, 2, 4, 8)
}

# ``ndarray.max`` without its Python wrapper (called once per vector step).
_MAX = np.maximum.reduce

#: Entries up to which ``min`` and ``max`` of the array's list beat one reduction.
SMALL = 32


def all_within(array: np.ndarray, high: int) -> bool | None:
    """Whether every entry of ``array`` lies in ``0 .. high`` (both included).

    None when one reduction cannot tell: ``array`` is not an integer array,
    or is empty.
    """
    unsigned = UNSIGNED.get(array.dtype)
    size = array.size
    if unsigned is None or not size:
        return None
    if size <= SMALL:
        values = (array if array.ndim == 1 else array.ravel()).tolist()
        return min(values) >= 0 and max(values) <= high
    return bool(_MAX(array.view(unsigned), axis=None) <= high)
