"""IdentityCache: values of unhashable objects (spaces, bound arrays), computed once each."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from rlfleet.core._identity_cache import IdentityCache


def test_a_value_is_computed_once_per_object_and_extra_key() -> None:
    cache: IdentityCache[int] = IdentityCache()
    calls: list[str] = []
    space = gym.spaces.Box(-1.0, 1.0, (3,))

    def compute(tag: str) -> int:
        calls.append(tag)
        return len(calls)

    assert cache.get(space, "a", lambda: compute("a")) == 1
    assert cache.get(space, "a", lambda: compute("again")) == 1
    assert cache.get(space, "b", lambda: compute("b")) == 2
    # An equal but other object is another entry: identity, not equality.
    twin = gym.spaces.Box(-1.0, 1.0, (3,))
    assert cache.get(twin, "a", lambda: compute("twin")) == 3
    assert calls == ["a", "b", "twin"]


def test_past_its_limit_the_cache_starts_over() -> None:
    cache: IdentityCache[int] = IdentityCache(limit=2)
    arrays = [np.zeros(1) for _ in range(4)]
    for i, array in enumerate(arrays):
        assert cache.get(array, None, lambda: i) == i  # noqa: B023  (called at once)
    # The first entries were dropped: asking again computes again.
    assert cache.get(arrays[0], None, lambda: 99) == 99
