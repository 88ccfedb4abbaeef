"""Type stub of the compiled unit booking (rlfleet/scheduling/_unit_book.c)."""

from collections.abc import Sequence

import numpy as np

def outstanding(
    held: np.ndarray,
    out: np.ndarray,
    count: int,
    results: Sequence[object],
    lengths: Sequence[object] | None,
    mark: bool,
    /,
) -> bool: ...
def scatter(known: np.ndarray, base: int, indices: object, lengths: object, /) -> None: ...
