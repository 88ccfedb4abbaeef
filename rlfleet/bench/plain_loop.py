"""The plain single-process sampling loop every rlfleet sampler is measured against.

The loop a user writes without rlfleet: K envs from ``gym.make``, one
batched numpy MLP (plain ``@``, tanh) with a categorical sample, every
step's observation, action, reward and log-probability stored in
preallocated arrays, and each new episode reset with its own seed. It
keeps no determinism across batch layouts (one generator for all rows, BLAS
gemm), no checks and no episode bookkeeping: it is the speed of the
hardware with gymnasium, not a sampler.

With ``vectorization`` (``"vector_entry_point"`` or ``"envpool"``) the K
envs are one native vector env instead, stepped by one call and reset by
itself (next-step autoreset, seeded once): the strongest plain alternative
to a fleet of native workers. Its reset steps (action ignored, reward 0)
are stored, as such a user would, but not counted as steps.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlfleet.envs.native import NativeVectorEnv
from rlfleet.errors import ConfigError


@dataclass(frozen=True)
class LoopRun:
    """What one timed run did.

    Attributes:
        steps: Env steps taken (transitions).
        cpu: CPU seconds of the process over the run.
        wall: Wall-clock seconds of the run.
    """

    steps: int
    cpu: float
    wall: float


def plain_loop(
    env_id: str,
    n_envs: int,
    steps: int,
    *,
    seed: int = 0,
    hidden_sizes: Sequence[int] = (32, 32),
    vectorization: str | None = None,
) -> LoopRun:
    """Runs the plain loop for at least ``steps`` env steps.

    Args:
        env_id: A gymnasium id with a Discrete action space and flat Box
            observations (CartPole-v1).
        n_envs: Envs stepped together (K).
        steps: Env steps to take (rounded up to whole vector steps).
        seed: Seeds the weights, the sampling generator and the episodes.
        hidden_sizes: Hidden widths of the MLP.
        vectorization: None for K ``gym.make`` envs, else the native vector
            env backend (see the module's docstring).

    Returns:
        The run's steps and times (env construction excluded).

    Raises:
        ConfigError: If the env's actions are not Discrete.
    """
    if vectorization is not None:
        return _native_loop(
            env_id, n_envs, steps, seed=seed, hidden_sizes=hidden_sizes, vectorization=vectorization
        )
    envs = [gym.make(env_id) for _ in range(n_envs)]
    space = envs[0].action_space
    if not isinstance(space, gym.spaces.Discrete):
        for env in envs:
            env.close()
        raise _not_discrete(env_id, space)
    obs_dim = int(np.prod(envs[0].observation_space.shape or ()))
    n_actions = int(space.n)
    rng = np.random.default_rng(seed)
    layers = _layers(rng, obs_dim, hidden_sizes, n_actions)
    vector_steps = -(-steps // n_envs)
    observations = np.empty((vector_steps + 1, n_envs, obs_dim), dtype=np.float32)
    actions = np.empty((vector_steps, n_envs), dtype=np.int64)
    rewards = np.empty((vector_steps, n_envs), dtype=np.float64)
    log_probs = np.empty((vector_steps, n_envs), dtype=np.float32)
    episode_seed = seed * 1_000_003
    for i, env in enumerate(envs):
        observations[0, i] = env.reset(seed=episode_seed + i)[0]
    episode_seed += n_envs
    rows = np.arange(n_envs)
    cpu, wall = time.process_time(), time.perf_counter()
    for t in range(vector_steps):
        action = _act(layers, observations[t], rng, rows, log_probs[t])
        actions[t] = action
        next_obs = observations[t + 1]
        for i, (env, a) in enumerate(zip(envs, action, strict=True)):
            obs, reward, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                obs, _ = env.reset(seed=episode_seed)
                episode_seed += 1
            next_obs[i] = obs
            rewards[t, i] = reward
    run = LoopRun(vector_steps * n_envs, time.process_time() - cpu, time.perf_counter() - wall)
    for env in envs:
        env.close()
    return run


Layers = list[tuple[np.ndarray, np.ndarray]]


def _layers(
    rng: np.random.Generator, obs_dim: int, hidden_sizes: Sequence[int], n_actions: int
) -> Layers:
    sizes = (obs_dim, *hidden_sizes, n_actions)
    return [
        (
            (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
            np.zeros(b, dtype=np.float32),
        )
        for a, b in itertools.pairwise(sizes)
    ]


def _act(
    layers: Layers,
    observations: np.ndarray,
    rng: np.random.Generator,
    rows: np.ndarray,
    log_probs: np.ndarray,
) -> np.ndarray:
    """The MLP's categorical sample for every row; writes the log-probabilities."""
    h = observations
    for weight, bias in layers[:-1]:
        h = np.tanh(h @ weight + bias)
    logits = h @ layers[-1][0] + layers[-1][1]
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    u = rng.random(len(rows))
    action = np.minimum((probs.cumsum(axis=1) < u[:, None]).sum(axis=1), probs.shape[1] - 1)
    log_probs[:] = np.log(probs[rows, action])
    return action


def _native_loop(
    env_id: str,
    n_envs: int,
    steps: int,
    *,
    seed: int,
    hidden_sizes: Sequence[int],
    vectorization: str,
) -> LoopRun:
    env = NativeVectorEnv(env_id, {}, vectorization, n_envs)
    try:
        space = env.single_action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise _not_discrete(env_id, space)
        obs_dim = int(np.prod(env.single_observation_space.shape or ()))
        rng = np.random.default_rng(seed)
        layers = _layers(rng, obs_dim, hidden_sizes, int(space.n))
        vector_steps = -(-steps // n_envs)
        observations = np.empty((vector_steps + 1, n_envs, obs_dim), dtype=np.float32)
        actions = np.empty((vector_steps, n_envs), dtype=np.int64)
        rewards = np.empty((vector_steps, n_envs), dtype=np.float64)
        log_probs = np.empty((vector_steps, n_envs), dtype=np.float32)
        observations[0] = env.reset_all(seed * 1_000_003)
        rows = np.arange(n_envs)
        reset_steps = 0
        resetting = np.zeros(n_envs, dtype=bool)
        cpu, wall = time.process_time(), time.perf_counter()
        for t in range(vector_steps):
            action = _act(layers, observations[t], rng, rows, log_probs[t])
            actions[t] = action
            observations[t + 1], rewards[t], terminated, truncated = env.step_all(action)
            reset_steps += int(np.count_nonzero(resetting))
            resetting = terminated | truncated
        taken = vector_steps * n_envs - reset_steps
        return LoopRun(taken, time.process_time() - cpu, time.perf_counter() - wall)
    finally:
        env.close()


def _not_discrete(env_id: str, space: gym.Space) -> ConfigError:
    return ConfigError(
        f"the plain loop samples a categorical policy and needs a Discrete action space; "
        f"{env_id} has {space}"
    )
