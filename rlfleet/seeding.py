"""Per-episode seeds, derived from (base seed, request, episode index) only.

This is the single place where seeds are derived. The coordinator and
``LocalSampler`` call it and ship the results in each task, so a worker (in
any language) only *uses* seeds and never derives them; that is what makes a
batch identical whatever the number of workers and after a worker dies.
"""

from __future__ import annotations

import numpy as np

#: Seeds are carried on the wire as uint32 so that every language and
#: gymnasium's ``reset(seed=...)`` accept them.
SEED_BITS = 32


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
        ValueError: If an argument is negative.
    """
    if base_seed < 0 or request < 0 or episode_index < 0:
        raise ValueError(
            "seeds are derived from non-negative integers, got "
            f"base_seed={base_seed}, request={request}, episode_index={episode_index}"
        )
    env_seed, policy_seed = np.random.SeedSequence(
        [base_seed, request, episode_index]
    ).generate_state(2, dtype=np.uint32)
    return int(env_seed), int(policy_seed)


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
        raise ValueError(
            "seeds are derived from non-negative integers, got "
            f"base_seed={base_seed}, stream={stream}, episode={episode_in_stream}"
        )
    # The constant keeps fragment seeds disjoint from episode_seeds' triples.
    env_seed, policy_seed = np.random.SeedSequence(
        [base_seed, 0x46524147, stream, episode_in_stream]
    ).generate_state(2, dtype=np.uint32)
    return int(env_seed), int(policy_seed)
