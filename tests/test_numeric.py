"""all_finite: the worker's quick finiteness check of a batch."""

from __future__ import annotations

import numpy as np

from rlfleet.worker._numeric import all_finite


def test_all_finite_finds_nan_and_inf_and_tolerates_huge_finite_values() -> None:
    values = np.ones((5, 3), dtype=np.float32)
    assert all_finite(values)
    for bad in (np.nan, np.inf, -np.inf):
        spoiled = values.copy()
        spoiled[3, 1] = bad
        assert not all_finite(spoiled)
    # The squares overflow the quick check; the exact check still says finite.
    assert all_finite(np.full((2, 2), 3e38, dtype=np.float32))
    assert all_finite(np.array([[1, 2]], dtype=np.int64))
    assert all_finite(np.empty((0, 4), dtype=np.float64))
    assert not all_finite(np.array([1 + 1j, complex(np.nan, 0)]))
