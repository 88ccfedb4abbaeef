"""rlfleet._util.int_ranges: one reduction against the two comparisons it stands for."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet._util.int_ranges import all_within


@pytest.mark.parametrize("dtype", ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"])
def test_all_within_answers_as_both_comparisons_do(dtype: str) -> None:
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    for _ in range(200):
        high = int(rng.integers(0, min(info.max, 300) + 1))
        array = rng.integers(max(info.min, -3), min(info.max, high + 3) + 1, size=5).astype(dtype)
        expected = bool(np.all((array >= 0) & (array <= high)))
        assert all_within(array, high) is expected, (array, high)
    # The extremes of the dtype: the most negative value is the largest unsigned one.
    assert all_within(np.array([info.min, 0], dtype), info.max) is (info.min == 0)


def test_all_within_leaves_what_one_reduction_cannot_tell() -> None:
    assert all_within(np.array([0.5]), 1) is None
    assert all_within(np.array([True]), 1) is None
    assert all_within(np.zeros(0, np.int64), 1) is None
