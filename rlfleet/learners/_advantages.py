"""Per-episode returns and GAE advantages on flattened episode batches.

Episodes arrive flattened along time (EpisodeBatch layout: N episodes of
``lengths`` steps, one after the other). The backward recursions run on a
zero-padded (N, max length) view, one vectorised numpy step per time index,
so the cost is O(max length) numpy calls whatever the number of episodes.
"""

from __future__ import annotations

import numpy as np


def episode_starts(lengths: np.ndarray) -> np.ndarray:
    """Flat index of each episode's first step."""
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return starts


def undiscounted_returns(rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sum of rewards of each episode, shape (N,), float64."""
    return np.add.reduceat(rewards.astype(np.float64), episode_starts(lengths))


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_values: np.ndarray,
    lengths: np.ndarray,
    *,
    discount: float,
    gae_lambda: float,
) -> np.ndarray:
    """Generalised advantage estimates (Schulman et al., 2016).

    ``A_t = sum_k (discount * gae_lambda)^k delta_{t+k}`` within each
    episode, with ``delta_t = r_t + discount * V(s_{t+1}) - V(s_t)`` and
    ``V(s_T) = bootstrap_values`` after an episode's last step. With
    ``gae_lambda = 1`` and zero values this is the discounted reward-to-go.

    Args:
        rewards: Rewards (S,), S = lengths.sum().
        values: V(s_t) of every step (S,).
        bootstrap_values: Value of the state after each episode's last step
            (N,): 0 where the episode terminated, V(last observation) where
            it was cut off (time limit or fragment end).
        lengths: Episode lengths (N,), each >= 1.
        discount: Discount factor gamma.
        gae_lambda: The bias/variance trade-off lambda in [0, 1].

    Returns:
        Advantages (S,), float64.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = episode_starts(lengths)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.arange(len(rewards)) - np.repeat(starts, lengths)

    next_values = np.empty(len(values), dtype=np.float64)
    next_values[:-1] = values[1:]
    next_values[starts + lengths - 1] = bootstrap_values
    deltas = rewards + discount * next_values - values

    # Padding after an episode's end holds delta = 0, so the backward
    # recursion stays at 0 there and starts fresh at each episode's last step.
    padded = np.zeros((len(lengths), int(lengths.max())), dtype=np.float64)
    padded[rows, cols] = deltas
    decay = discount * gae_lambda
    running = np.zeros(len(lengths), dtype=np.float64)
    for t in range(padded.shape[1] - 1, -1, -1):
        running = padded[:, t] + decay * running
        padded[:, t] = running
    advantages: np.ndarray = padded[rows, cols]
    return advantages
