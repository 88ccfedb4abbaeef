"""Per-episode seeds, derived from (base seed, request, episode index) only.

This is the single place where seeds are derived. The coordinator and
``LocalSampler`` call it and ship the results in each task, so a worker (in
any language) only *uses* seeds and never derives them; that is what makes a
batch identical whatever the number of workers and after a worker dies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet.errors import InvalidValueError

with compiled("seed hash", "rlfleet/core/_seed_hash.c"):
    from rlfleet.core._seed_hash import seed_pairs

#: Seeds are carried on the wire as uint32 so that every language and
#: gymnasium's ``reset(seed=...)`` accept them.
SEED_BITS = 32
#: The ``env_seed`` label of an episode run by a native vector env, which
#: has no seed of its own (docs/reliability.md, "Native vector-env backends").
NO_ENV_SEED = -1
#: The ``policy_seed`` label of an episode run by a native vector env: its
#: actions come from the worker's one batch generator, not from a seed of its own.
NO_POLICY_SEED = -1


def episode_seeds(base_seed: int, request: int, episode_index: int) -> tuple[int, int]:
    """Returns the (env_seed, policy_seed) of one episode.

    Args:
        base_seed: The sampler's seed (non-negative).
        request: Index of the sampling request (0, 1, ...) within the sampler.
        episode_index: Index of the episode within the request.

    Returns:
        Two uint32 seeds: one for ``env.reset(seed=...)``, one for the policy's
        action-sampling generator (``numpy.random.default_rng(seed)``).

    Raises:
        InvalidValueError: If an argument is negative.
    """
    if base_seed < 0 or request < 0 or episode_index < 0:
        raise InvalidValueError(
            "seeds are derived from non-negative integers, got "
            f"base_seed={base_seed}, request={request}, episode_index={episode_index}"
        )
    env_seed, policy_seed = np.random.SeedSequence(
        [base_seed, request, episode_index]
    ).generate_state(2, dtype=np.uint32)
    return int(env_seed), int(policy_seed)


#: The word that sets fragment streams' seeds apart from episodes' ("FRAG").
_STREAM_TAG = 0x46524147


def stream_seeds(base_seed: int, stream: int, episode_in_stream: int) -> tuple[int, int]:
    """Returns the (env_seed, policy_seed) of an episode of a fragment stream.

    Fragment sampling keeps each env slot running across requests (RLlib's
    ``truncate_episodes``), so its episodes are numbered per stream, a stream
    being one env slot of the fleet.

    Args:
        base_seed: The sampler's seed (non-negative).
        stream: The stream (global env slot) index.
        episode_in_stream: Index of the episode within that stream.

    Returns:
        Two uint32 seeds, as :func:`episode_seeds`.
    """
    if base_seed < 0 or stream < 0 or episode_in_stream < 0:
        raise InvalidValueError(
            "seeds are derived from non-negative integers, got "
            f"base_seed={base_seed}, stream={stream}, episode={episode_in_stream}"
        )
    # The constant keeps fragment seeds disjoint from episode_seeds' triples.
    env_seed, policy_seed = np.random.SeedSequence(
        [base_seed, _STREAM_TAG, stream, episode_in_stream]
    ).generate_state(2, dtype=np.uint32)
    return int(env_seed), int(policy_seed)


#: The word that sets a shard's base seed apart from other derived seeds ("SHRD").
_SHARD_TAG = 0x53485244


def shard_seed(base_seed: int, shard: int) -> int:
    """Returns the base seed coordinator ``shard`` of a sharded sampler runs its streams with.

    Fragment streams and subscriptions are numbered per coordinator, from
    0 on each, and their episodes' seeds come from ``(base seed, stream,
    episode)`` (:func:`stream_seeds`); so that two coordinators of one
    learner never run the same stream seeds, each runs them under a base
    seed of its own (docs/sharding.md). Shard 0 keeps the sampler's seed,
    so its streams are the ones a single coordinator with its workers runs.

    Args:
        base_seed: The sampler's seed (non-negative).
        shard: The coordinator's position in the sampler's address list.

    Returns:
        ``base_seed`` for shard 0; else a 63-bit seed derived from both.

    Raises:
        InvalidValueError: If an argument is negative.
    """
    if base_seed < 0 or shard < 0:
        raise InvalidValueError(
            f"seeds are derived from non-negative integers, got base_seed={base_seed}, "
            f"shard={shard}"
        )
    if shard == 0:
        return base_seed
    (word,) = np.random.SeedSequence([base_seed, _SHARD_TAG, shard]).generate_state(
        1, dtype=np.uint64
    )
    return int(word) >> 1


# --- many episodes at once ------------------------------------------------
# episode_seeds builds one SeedSequence per episode, about 8 microseconds
# each: at the fleet's rate (thousands of episodes a second, derived under
# the coordinator's lock) that was the largest single cost of a refill.
# episode_seed_columns runs SeedSequence's hash on a whole column of episode
# indices (episode_seeds_many is it as a list of pairs), bit for bit the same
# algorithm (numpy/random/bit_generator.pyx: mix_entropy over a 4-word pool,
# then generate_state(2, uint32)), in one call of a C module
# (rlfleet/core/_seed_hash.c): with numpy over the column, as
# generator_states and stream_seeds_many still do, it was about 440
# instructions a unit and the largest part of a refill that hands out units.
# tests/test_seed_hash.py, tests/test_unit_columns.py and
# tests/test_scheduler.py check it against episode_seeds.

# SeedSequence's constants (numpy/random/bit_generator.pyx).
_MASK = 0xFFFFFFFF
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = np.uint32(0xCA01F9DD)
_MIX_MULT_R = np.uint32(0x4973F715)
_XSHIFT = np.uint32(16)
_POOL_SIZE = 4

#: Below this many episodes the per-call cost of the ~60 numpy operations
#: exceeds SeedSequence's own (measured: 8 units 14 us each, 200 units 0.6 us each).
_MIN_VECTORISED = 32

#: The most entropy words before the episode index that the compiled hash
#: takes (rlfleet/core/_seed_hash.c's MAX_PREFIX).
_MAX_PREFIX_WORDS = 8


def episode_seeds_many(
    base_seed: int, request: int, episode_indices: Sequence[int]
) -> list[tuple[int, int]]:
    """``[episode_seeds(base_seed, request, i) for i in episode_indices]``, faster.

    Args:
        base_seed: The sampler's seed (non-negative).
        request: Index of the sampling request (non-negative).
        episode_indices: Episode indices (non-negative).

    Returns:
        (env_seed, policy_seed) per index, in order.

    Raises:
        InvalidValueError: If an argument is negative.
    """
    env, policy = episode_seed_columns(
        base_seed, request, np.asarray(episode_indices, dtype=np.int64).reshape(-1)
    )
    return list(zip(env.tolist(), policy.tolist(), strict=True))


def episode_seed_columns(
    base_seed: int, request: int, episode_indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`episode_seeds` of many episodes of one request, as two int64 columns.

    Args:
        base_seed: The sampler's seed (non-negative).
        request: Index of the sampling request (non-negative).
        episode_indices: (N,) int64 episode indices (non-negative).

    Returns:
        (env_seeds, policy_seeds), each (N,) int64.

    Raises:
        InvalidValueError: If an argument is negative.
    """
    count = len(episode_indices)
    if not count:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    if base_seed >= 0 and request >= 0:
        prefix = (*_words(base_seed), *_words(request))
        if len(prefix) <= _MAX_PREFIX_WORDS:
            env_seeds = np.empty(count, dtype=np.int64)
            policy_seeds = np.empty(count, dtype=np.int64)
            column = np.ascontiguousarray(episode_indices, dtype=np.int64)
            if seed_pairs(prefix, column, env_seeds, policy_seeds):
                return env_seeds, policy_seeds
    # An index past one entropy word, or seeds past 2**224 or negative.
    low, high = int(episode_indices.min()), int(episode_indices.max())
    if count < _MIN_VECTORISED or low < 0 or high > _MASK:
        # Few, or out of the one-word range the vector path handles: the
        # reference (which also raises on negative values).
        pairs = [episode_seeds(base_seed, request, i) for i in episode_indices.tolist()]
        seeds = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        return seeds[:, 0], seeds[:, 1]
    if base_seed < 0 or request < 0:
        raise InvalidValueError(
            "seeds are derived from non-negative integers, got "
            f"base_seed={base_seed}, request={request}"
        )
    env, policy = _hash(
        [*_words(base_seed), *_words(request)], episode_indices.astype(np.uint32), 2
    )
    return env.astype(np.int64), policy.astype(np.int64)


# PCG64's 128-bit LCG multiplier (numpy/random/src/pcg64/pcg64.h).
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
_MASK_128 = (1 << 128) - 1


def generator_states(seeds: Sequence[int]) -> list[tuple[int, int]]:
    """The PCG64 ``(state, inc)`` of ``numpy.random.default_rng(seed)`` per seed.

    An episode's action-sampling generator is ``default_rng(policy_seed)``;
    building one costs about 8 microseconds (a SeedSequence, then PCG64's
    seeding), paid once per episode. This computes the same states for many
    seeds with numpy, bit for bit numpy's algorithm (SeedSequence's
    ``generate_state(4, uint64)``, then ``pcg64_set_seed``), so a worker
    can give a reused generator each episode's state
    (:func:`set_generator_state`). tests/test_seeding_states.py checks it
    against ``default_rng``.

    Args:
        seeds: Seeds below ``2**32`` (:data:`SEED_BITS`).

    Returns:
        ``(state, inc)`` per seed, in order.

    Raises:
        InvalidValueError: If a seed is negative or does not fit in 32 bits.
    """
    if not seeds:
        return []
    if min(seeds) < 0 or max(seeds) > _MASK:
        raise InvalidValueError(f"generator seeds must fit in {SEED_BITS} bits, got {seeds!r}")
    if len(seeds) < _MIN_VECTORISED:
        states = [np.random.PCG64(seed).state["state"] for seed in seeds]
        return [(state["state"], state["inc"]) for state in states]
    # generate_state(4, uint64) is generate_state(8, uint32) read as
    # little-endian pairs: uint64 k = word 2k | word 2k+1 << 32.
    words = _hash([], np.asarray(seeds, dtype=np.uint32), 8)
    u = [
        (words[2 * k].astype(np.uint64) | words[2 * k + 1].astype(np.uint64) << np.uint64(32))
        for k in range(4)
    ]
    result = []
    for u0, u1, u2, u3 in zip(*(column.tolist() for column in u), strict=True):
        # pcg_setseq_128_srandom_r(initstate = u0:u1, initseq = u2:u3): from
        # state 0, one step (state = inc), add initstate, one more step.
        inc = ((u2 << 64 | u3) << 1 | 1) & _MASK_128
        state = ((inc + (u0 << 64 | u1)) * _PCG_MULT + inc) & _MASK_128
        result.append((state, inc))
    return result


def set_generator_state(generator: np.random.Generator, state: tuple[int, int]) -> None:
    """Puts a PCG64 generator in a state from :func:`generator_states`.

    Args:
        generator: A Generator over PCG64.
        state: ``(state, inc)``.
    """
    generator.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": state[0], "inc": state[1]},
        "has_uint32": 0,
        "uinteger": 0,
    }


def _words(value: int) -> list[int]:
    """numpy's ``_int_to_uint32_array``: little-endian 32-bit words, [0] for 0."""
    if value == 0:
        return [0]
    words = []
    while value:
        words.append(value & _MASK)
        value >>= 32
    return words


def stream_seeds_many(
    base_seed: int, streams: np.ndarray, episodes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`stream_seeds` of every (stream, episode) pair, as two int64 columns.

    The coordinator checks every piece of a fragment window against its
    stream's seeds: one SeedSequence per piece cost about 8 us, numpy's
    hash over the columns a fraction of that (bit for bit the same
    algorithm; tests/test_seeding_states.py checks it against
    :func:`stream_seeds`).

    Args:
        base_seed: The sampler's seed (non-negative).
        streams: (N,) stream indices (non-negative).
        episodes: (N,) episode indices within their streams (non-negative).

    Returns:
        (env_seeds, policy_seeds), each (N,) int64.

    Raises:
        InvalidValueError: If a value is negative.
    """
    streams = np.asarray(streams, dtype=np.int64).reshape(-1)
    episodes = np.asarray(episodes, dtype=np.int64).reshape(-1)
    if base_seed < 0 or (streams.size and min(streams.min(), episodes.min()) < 0):
        raise InvalidValueError(
            "seeds are derived from non-negative integers, got base_seed="
            f"{base_seed}, streams down to {streams.min() if streams.size else 0}, episodes "
            f"down to {episodes.min() if episodes.size else 0}"
        )
    if len(streams) < _MIN_VECTORISED or max(streams.max(), episodes.max()) > _MASK:
        pairs = [
            stream_seeds(base_seed, s, e)
            for s, e in zip(streams.tolist(), episodes.tolist(), strict=True)
        ]
        seeds = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        return seeds[:, 0], seeds[:, 1]
    constant = [*_words(base_seed), *_words(_STREAM_TAG)]
    env, policy = _hash_columns(
        [np.uint32(word) for word in constant]
        + [streams.astype(np.uint32), episodes.astype(np.uint32)],
        2,
    )
    return env.astype(np.int64), policy.astype(np.int64)


def _hash(prefix: list[int], last: np.ndarray, n_words: int) -> list[np.ndarray]:
    """SeedSequence(prefix + [last[k]]).generate_state(n_words) for every k, as columns."""
    return _hash_columns([np.uint32(word) for word in prefix] + [last], n_words)


def _hash_columns(entropy: list[Any], n_words: int) -> list[np.ndarray]:
    """SeedSequence(row k of the entropy words).generate_state(n_words), as columns.

    Args:
        entropy: Per word, a uint32 column, or one np.uint32 for a word every
            row shares (the base seed's, the request's): it is mixed as a
            scalar until it meets a column, a third fewer array operations.
        n_words: Words of state per row.
    """
    # The hash constant evolves independently of the data, so one Python int
    # serves every column; uint32 arithmetic wraps exactly as the C code does
    # (numpy warns of the wrap on scalars only: silenced).
    with np.errstate(over="ignore"):
        return _mixed(entropy, n_words)


def _mixed(entropy: list[Any], n_words: int) -> list[np.ndarray]:
    hash_const = _INIT_A

    def hashmix(value: Any) -> Any:
        nonlocal hash_const
        value = value ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_A) & _MASK
        value = value * np.uint32(hash_const)
        return value ^ (value >> _XSHIFT)

    def mix(x: Any, y: Any) -> Any:
        result = _MIX_MULT_L * x - _MIX_MULT_R * y
        return result ^ (result >> _XSHIFT)

    zero = np.uint32(0)
    mixer = [hashmix(entropy[i] if i < len(entropy) else zero) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                mixer[dst] = mix(mixer[dst], hashmix(mixer[src]))
    for src in range(_POOL_SIZE, len(entropy)):
        for dst in range(_POOL_SIZE):
            mixer[dst] = mix(mixer[dst], hashmix(entropy[src]))
    hash_const = _INIT_B
    state = []
    for i in range(n_words):
        value = mixer[i % _POOL_SIZE] ^ np.uint32(hash_const)
        hash_const = (hash_const * _MULT_B) & _MASK
        value = value * np.uint32(hash_const)
        state.append(value ^ (value >> _XSHIFT))
    return state
