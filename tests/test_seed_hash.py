"""The episodes' seeds of a column of indices, derived in one call of the compiled hash."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import seeding
from rlfleet.core._seed_hash import seed_pairs
from rlfleet.core.seeding import episode_seed_columns, episode_seeds

WORD = 2**32


@settings(max_examples=200, deadline=None)
@given(
    base_seed=st.one_of(st.integers(0, 1000), st.integers(0, 2**70)),
    request=st.one_of(st.integers(0, 50), st.integers(0, 2**70)),
    indices=st.lists(
        st.one_of(st.integers(0, 5000), st.integers(WORD - 3, WORD + 3), st.integers(0, 2**40)),
        max_size=70,
    ),
)
def test_episode_seed_columns_are_episode_seeds_for_any_seed_and_indices(
    base_seed: int, request: int, indices: list[int]
) -> None:
    env, policy = episode_seed_columns(base_seed, request, np.array(indices, dtype=np.int64))
    assert list(zip(env.tolist(), policy.tolist(), strict=True)) == [
        episode_seeds(base_seed, request, i) for i in indices
    ]
    assert env.dtype == policy.dtype == np.int64


@settings(max_examples=100, deadline=None)
@given(
    prefix=st.lists(st.integers(0, WORD - 1), min_size=1, max_size=8),
    indices=st.lists(st.integers(0, WORD - 1), min_size=1, max_size=50),
)
def test_the_compiled_hash_is_the_numpy_hash_for_every_prefix_length(
    prefix: list[int], indices: list[int]
) -> None:
    column = np.array(indices, dtype=np.int64)
    env, policy = np.empty(len(column), np.int64), np.empty(len(column), np.int64)
    seed_pairs(tuple(prefix), column, env, policy)
    expected = seeding._hash(prefix, column.astype(np.uint32), 2)
    assert env.tolist() == expected[0].tolist() and policy.tolist() == expected[1].tolist()


def test_seeds_past_the_compiled_hash_prefix_are_still_episode_seeds() -> None:
    indices = np.arange(40, dtype=np.int64)
    env, policy = episode_seed_columns(2**300, 2**100, indices)
    assert list(zip(env.tolist(), policy.tolist(), strict=True)) == [
        episode_seeds(2**300, 2**100, i) for i in range(40)
    ]


@pytest.mark.parametrize(
    ("prefix", "sizes", "error", "match"),
    [
        ([7], (2, 2), TypeError, "prefix must be a tuple"),
        ((), (2, 2), ValueError, "prefix holds 1 to 8 words, got 0"),
        (tuple(range(9)), (2, 2), ValueError, "prefix holds 1 to 8 words, got 9"),
        ((7, -1), (2, 2), ValueError, "prefix word 1 is not in"),
        ((7, WORD), (2, 2), ValueError, "prefix word 1 is not in"),
        ((7, 2**70), (2, 2), ValueError, "prefix word 1 is not in"),
        ((7, 3.0), (2, 2), TypeError, "prefix must be a tuple of ints"),
        ((7, 3), (1, 2), ValueError, "outputs hold 1 and 2 values for 2 indices"),
        ((7, 3), (2, 3), ValueError, "outputs hold 2 and 3 values for 2 indices"),
    ],
)
def test_the_compiled_hash_refuses_what_it_cannot_hash_and_writes_nothing(
    prefix: object, sizes: tuple[int, int], error: type, match: str
) -> None:
    env_out, policy_out = np.full(sizes[0], -5, np.int64), np.full(sizes[1], -5, np.int64)
    with pytest.raises(error, match=match):
        seed_pairs(prefix, np.array([1, 2], dtype=np.int64), env_out, policy_out)  # type: ignore[arg-type]
    assert (env_out == -5).all() and (policy_out == -5).all()


@pytest.mark.parametrize("outside", [-1, WORD, 2**62])
def test_an_index_past_one_word_is_left_to_the_reference_with_nothing_written(
    outside: int,
) -> None:
    env_out, policy_out = np.full(3, -5, np.int64), np.full(3, -5, np.int64)
    indices = np.array([1, outside, 2], dtype=np.int64)
    assert seed_pairs((7, 3), indices, env_out, policy_out) is False
    assert (env_out == -5).all() and (policy_out == -5).all()
    assert seed_pairs((7, 3), np.array([1, WORD - 1, 2]), env_out, policy_out) is True


@pytest.mark.parametrize(
    ("indices", "env", "name"),
    [
        (np.array([1, 2], dtype=np.int32), np.empty(2, np.int64), "indices"),
        (np.arange(4, dtype=np.int64)[::2], np.empty(2, np.int64), "C-contiguous"),
        (np.zeros((2, 1), dtype=np.int64), np.empty(2, np.int64), "indices"),
        (np.arange(2, dtype=np.int64), np.empty(2, np.uint64), "env_out"),
        (np.arange(2, dtype=np.int64), np.empty(2, np.float64), "env_out"),
    ],
)
def test_the_compiled_hash_takes_only_1d_int64_columns(
    indices: np.ndarray, env: np.ndarray, name: str
) -> None:
    with pytest.raises((TypeError, ValueError, BufferError), match=name):
        seed_pairs((7, 3), indices, env, np.empty(2, np.int64))


def test_the_compiled_hash_writes_no_read_only_column() -> None:
    env = np.empty(2, np.int64)
    env.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        seed_pairs((7, 3), np.arange(2, dtype=np.int64), env, np.empty(2, np.int64))


def test_a_refill_derives_its_seeds_in_one_compiled_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # The numpy hash over the column was some 440 instructions a unit, the
    # largest part of a refill that hands out units.
    calls = []
    monkeypatch.setattr(seeding, "_hash", lambda *a: calls.append(a))
    env, _ = episode_seed_columns(7, 3, np.arange(1024, dtype=np.int64))
    assert calls == [] and len(env) == 1024
