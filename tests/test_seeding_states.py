"""Generator states computed many at once equal ``default_rng(seed)``'s, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.core.seeding import (
    generator_states,
    set_generator_state,
    stream_seeds,
    stream_seeds_many,
)
from rlfleet.errors import InvalidValueError


def _reference(seed: int) -> tuple[int, int]:
    state = np.random.default_rng(seed).bit_generator.state["state"]
    return state["state"], state["inc"]


@pytest.mark.parametrize("count", [0, 1, 5, 40, 300])
def test_states_equal_default_rng_states(count: int) -> None:
    # Edge seeds first; 40 and 300 take the vectorised path, 1 and 5 the reference.
    edges = [0, 1, 2**31, 2**32 - 1]
    seeds = [*edges, *np.random.default_rng(count).integers(0, 2**32, count).tolist()][:count]
    assert generator_states(seeds) == [_reference(seed) for seed in seeds]


def test_a_reseeded_generator_draws_what_default_rng_draws() -> None:
    seeds = list(range(1000, 1040))
    generator = np.random.Generator(np.random.PCG64(0))
    for seed, state in zip(seeds, generator_states(seeds), strict=True):
        generator.random()  # a half-used generator: has_uint32 must be reset too
        generator.integers(0, 2**31, dtype=np.uint32)
        set_generator_state(generator, state)
        reference = np.random.default_rng(seed)
        assert generator.random(3).tolist() == reference.random(3).tolist()
        assert generator.integers(0, 2**31, 3, dtype=np.uint32).tolist() == (
            reference.integers(0, 2**31, 3, dtype=np.uint32).tolist()
        )
        assert generator.standard_normal(2).tolist() == reference.standard_normal(2).tolist()


@pytest.mark.parametrize("bad", [[-1], [2**32], [*range(40), 2**32]])
def test_seeds_outside_32_bits_are_refused(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="32 bits"):
        generator_states(bad)


@pytest.mark.parametrize("base_seed", [0, 4, 2**32 + 7, 2**63 - 1])
@pytest.mark.parametrize("count", [0, 5, 40, 300])
def test_stream_seeds_many_equal_stream_seeds(base_seed: int, count: int) -> None:
    # 40 and 300 take the vectorised hash; a stream or episode past 32 bits
    # (one column of the 40) the reference, since SeedSequence splits it.
    rng = np.random.default_rng(count)
    streams = rng.integers(0, 2**20, count)
    episodes = rng.integers(0, 2**32, count)
    if count:
        streams[0], episodes[-1] = 0, 2**32 - 1
    if count == 40:
        episodes[1] = 2**40
    env, policy = stream_seeds_many(base_seed, streams, episodes)
    expected = [
        stream_seeds(base_seed, int(s), int(e)) for s, e in zip(streams, episodes, strict=True)
    ]
    assert list(zip(env.tolist(), policy.tolist(), strict=True)) == expected
    assert env.dtype == policy.dtype == np.int64


def test_stream_seeds_many_refuse_negative_values() -> None:
    with pytest.raises(InvalidValueError, match="non-negative"):
        stream_seeds_many(0, np.array([1, -2]), np.array([0, 0]))
