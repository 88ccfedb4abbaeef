"""Type stub of the compiled refill dealing (rlfleet/scheduling/_deal.c)."""

from collections.abc import Sequence

import numpy as np

def deal(
    taken: np.ndarray,
    slots: Sequence[int],
    idle: Sequence[int],
    room: Sequence[int],
    out: np.ndarray,
    /,
) -> list[int] | None: ...
