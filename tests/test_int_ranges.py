"""rlfleet._util.int_ranges: one reduction (or a short list's min and max) against the
two comparisons it stands for."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rlfleet._util import int_ranges
from rlfleet._util.int_ranges import SMALL, all_within


# Sizes read as a list (5, a 2-D 4x2) and by the reduction (SMALL + 1 and more).
@pytest.mark.parametrize("shape", [(5,), (4, 2), (SMALL + 1,), (20, 3)])
@pytest.mark.parametrize("dtype", ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"])
def test_all_within_answers_as_both_comparisons_do(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype)
    for _ in range(200):
        high = int(rng.integers(0, min(info.max, 300) + 1))
        low, top = max(info.min, -3), min(info.max, high + 3)
        array = rng.integers(low, top + 1, size=shape).astype(dtype)
        expected = bool(np.all((array >= 0) & (array <= high)))
        assert all_within(array, high) is expected, (array, high)
    # The extremes of the dtype: the most negative value is the largest unsigned one.
    for size in (2, 2 * SMALL):
        extremes = np.zeros(size, dtype)
        extremes[0] = info.min
        assert all_within(extremes, info.max) is (info.min == 0)


def test_a_small_batch_is_answered_without_a_numpy_reduction(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A reduction's fixed cost is twice a short list's min and max: a per-env
    # worker's 8 actions are checked at every vector step.
    calls = []
    reduce = int_ranges._MAX

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return reduce(*args, **kwargs)

    monkeypatch.setattr(int_ranges, "_MAX", counted)
    assert all_within(np.array([1, 0, 1, 1, 0, 1, 0, 1]), 1) is True
    assert all_within(np.array([1, 0, -1, 1]), 1) is False
    assert calls == []
    assert all_within(np.zeros(SMALL + 1, np.int64), 1) is True
    assert calls == [1]


def test_all_within_leaves_what_one_reduction_cannot_tell() -> None:
    assert all_within(np.array([0.5]), 1) is None
    assert all_within(np.array([True]), 1) is None
    assert all_within(np.zeros(0, np.int64), 1) is None
