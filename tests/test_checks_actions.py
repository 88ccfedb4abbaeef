"""The worker's action check agrees with gymnasium's ``contains``, row by row.

``ActionChecker`` checks a whole batch with a few numpy calls (the worker's
hot path); these tests hold it to gymnasium's answer for each row, over
random batches of every integer dtype, and to the error text a bad batch
gets (the first bad row's env and action).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.errors import PolicyError
from rlfleet.worker._checks import ActionChecker

SPACES = [
    gym.spaces.Discrete(3),
    gym.spaces.Discrete(4, start=-2),
    gym.spaces.MultiDiscrete([3, 4]),
    gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, 0], [0, -2]])),
    gym.spaces.MultiDiscrete([3, 4], dtype=np.int32),
    # start + nvec overflows int8: the largest valid action is 127.
    gym.spaces.MultiDiscrete([2, 2], dtype=np.int8, start=[-128, 126]),
    gym.spaces.MultiDiscrete([2**62, 5], start=[-(2**62), 2**62]),
    gym.spaces.MultiBinary(3),
    gym.spaces.MultiBinary([2, 2]),
]
DTYPES = [np.int64, np.int32, np.int16, np.int8, np.uint64, np.uint8]
ROWS = 5


def first_bad_row(space: gym.Space, actions: np.ndarray) -> int | None:
    """gymnasium's answer: the first row outside the space (or changed by the cast to it)."""
    for row, action in enumerate(actions):
        cast = action.astype(space.dtype)
        if not space.contains(cast) or np.any(action.astype(object) != cast.astype(object)):
            return row
    return None


def batches(space: gym.Space, dtype: type, rng: np.random.Generator) -> list[np.ndarray]:
    """Valid batches, batches with one entry moved, random and extreme values."""
    info = np.iinfo(dtype)
    out = []
    for _ in range(40):
        valid = np.stack([space.sample() for _ in range(ROWS)]).astype(object)
        moved = valid.copy()
        moved.flat[rng.integers(moved.size)] += int(rng.choice([-1, 1, 5]))
        shape = (ROWS, *(space.shape or ()))
        out += [
            valid,
            moved,
            rng.integers(-130, 130, size=shape).astype(object),
            rng.choice([info.min, info.max, 0, 1, -1, 2], size=shape),
        ]
    kept = []
    for batch in out:
        # Only batches whose values the dtype holds: a cast must not wrap.
        values = np.asarray(batch, dtype=object)
        if all(info.min <= int(v) <= info.max for v in values.flat):
            flat: np.ndarray = np.array([int(v) for v in values.flat], dtype=dtype)
            array = flat.reshape(values.shape)
            kept += [array, np.asfortranarray(array), array[::-1]]
    return kept


@pytest.mark.parametrize("space", SPACES, ids=str)
def test_action_checks_agree_with_gymnasiums_contains_row_by_row(space: gym.Space) -> None:
    checker = ActionChecker(space)
    rng = np.random.default_rng(0)
    slots = [10 + k for k in range(ROWS)]
    for dtype in DTYPES:
        for actions in batches(space, dtype, rng):
            expected = first_bad_row(space, actions)
            if expected is None:
                checker(actions, slots, "P")
                continue
            with pytest.raises(PolicyError) as failure:
                checker(actions, slots, "P")
            action = actions[expected].tolist()
            assert (
                f"P.get_actions returned an invalid action for env {slots[expected]}: "
                f"{action!r} is outside action space {space}"
            ) in str(failure.value)


def test_an_int8_multi_discrete_space_takes_its_largest_action() -> None:
    """start + nvec overflows the space's dtype: 127 is still in the space."""
    space = gym.spaces.MultiDiscrete([2, 2], dtype=np.int8, start=[-128, 126])
    actions = np.array([[-127, 127], [-128, 126]], dtype=np.int8)
    assert all(space.contains(row) for row in actions)
    assert ActionChecker(space)(actions, [0, 1], "P") is actions
