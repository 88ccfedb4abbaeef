"""Native vector envs: many envs stepped by one call, with their own autoreset.

A native vector env steps all of its envs in one call, in C (envpool) or in
numpy (gymnasium's ``vector_entry_point``, e.g. CartPole's). It is what makes
the env stop being the cost of a worker's step. The price is control: it
cannot reset one env with a seed of its own, and it resets finished envs
itself. Both backends here use the *next-step* autoreset (gymnasium's
``AutoresetMode.NEXT_STEP``, envpool's only mode): the step after an env's
episode ended ignores that env's action and returns the first observation
of its next episode, with reward 0 and neither flag set.

:class:`NativeVectorEnv` gives both backends one small interface; the
worker's engine (``rlfleet.worker._native_slots``) maps its slots onto it.
What this means for seeds and determinism is in docs/reliability.md
("Native vector-env backends").
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, EnvNotFoundError

#: gymnasium's native vector env: ``gym.make_vec(..., vectorization_mode="vector_entry_point")``.
VECTOR_ENTRY_POINT = "vector_entry_point"
#: envpool (the ``envpool`` extra): ``envpool.make_gymnasium``.
ENVPOOL = "envpool"
#: The values of ``EnvConfig.vectorization`` (None: one ``gym.make`` env per slot).
VECTORIZATIONS = (VECTOR_ENTRY_POINT, ENVPOOL)


class NativeVectorEnv:
    """One native vector env of ``num_envs`` envs, behind one interface.

    Args:
        env_id: The env id (gymnasium's registry, or envpool's list).
        kwargs: Constructor kwargs of the env.
        vectorization: ``"vector_entry_point"`` or ``"envpool"``.
        num_envs: Number of envs.
        max_episode_length: Steps after which the env truncates an episode
            itself; None takes the id's registered limit.

    Raises:
        ConfigError: If the env has no native vector entry point, envpool is
            not installed or does not have the task, or no episode limit is
            known.
        EnvNotFoundError: If gymnasium has no env registered under the id.
    """

    def __init__(
        self,
        env_id: str,
        kwargs: dict[str, Any],
        vectorization: str,
        num_envs: int,
        max_episode_length: int | None = None,
    ) -> None:
        if vectorization not in VECTORIZATIONS:
            raise ConfigError(
                f"unknown vectorization {vectorization!r} for env {env_id!r}; give one of "
                f"{list(VECTORIZATIONS)} or None (one gymnasium.make env per slot)"
            )
        _check_task(env_id, vectorization)
        self.env_id = env_id
        self.vectorization = vectorization
        self.num_envs = num_envs
        self.max_episode_length = _episode_limit(env_id, vectorization, max_episode_length)
        self._kwargs = dict(kwargs)
        self._env: Any = self._make(seed=0)
        if vectorization == VECTOR_ENTRY_POINT:
            self.single_observation_space: gym.Space = self._env.single_observation_space
            self.single_action_space: gym.Space = self._env.single_action_space
        else:
            # envpool's spaces are those of one env.
            self.single_observation_space = self._env.observation_space
            self.single_action_space = self._env.action_space

    @property
    def name(self) -> str:
        """``'CartPole-v1' (envpool)``, for messages."""
        return f"{self.env_id!r} ({self.vectorization})"

    def env_spec(self) -> EnvSpec:
        """The spaces of one env and the episode limit the env enforces."""
        return EnvSpec(
            self.single_observation_space, self.single_action_space, self.max_episode_length
        )

    def reset(self, seed: int) -> np.ndarray:
        """Starts a new episode in every env, seeded from ``seed``.

        gymnasium's native envs are reseeded by ``reset(seed=...)``. envpool
        takes its seed only when it is made (env k gets ``seed + k``), so it
        is made again (it takes int32 seeds: env k gets ``seed % (2**31 -
        num_envs) + k``); that costs about a millisecond.

        Returns:
            The first observation of every env, one row per env.
        """
        if self.vectorization == ENVPOOL:
            self._close_env()
            self._env = self._make(seed=seed % (2**31 - self.num_envs))
            observations, _ = self._env.reset()
        else:
            observations, _ = self._env.reset(seed=seed)
        return np.asarray(observations)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Steps every env (next-step autoreset); infos are not returned.

        Returns:
            ``(observations, rewards, terminated, truncated)``, one row per env.
        """
        observations, rewards, terminated, truncated, _ = self._env.step(actions)
        return observations, rewards, terminated, truncated

    def close(self) -> None:
        """Closes the env."""
        self._close_env()

    def _close_env(self) -> None:
        close = getattr(self._env, "close", None)
        if close is not None:
            close()

    def _make(self, seed: int) -> Any:
        limit: dict[str, Any] = {"max_episode_steps": self.max_episode_length}
        if self.vectorization == VECTOR_ENTRY_POINT:
            try:
                return gym.make_vec(
                    self.env_id,
                    num_envs=self.num_envs,
                    vectorization_mode=VECTOR_ENTRY_POINT,
                    **limit,
                    **self._kwargs,
                )
            except TypeError as exc:
                raise ConfigError(
                    f"env {self.name} rejected kwargs {self._kwargs!r}: {exc}"
                ) from exc
        try:
            return _envpool().make_gymnasium(
                self.env_id, num_envs=self.num_envs, seed=seed, **limit, **self._kwargs
            )
        except (TypeError, ValueError, AssertionError) as exc:
            # envpool checks its config with asserts and raises on unknown keys.
            raise ConfigError(
                f"envpool rejected env {self.env_id!r} with kwargs {self._kwargs!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc


def _check_task(env_id: str, vectorization: str) -> None:
    """Refuses an env the chosen backend cannot make, saying what to do instead."""
    if vectorization == VECTOR_ENTRY_POINT:
        if env_id not in gym.registry:
            raise EnvNotFoundError(f"no gymnasium env is registered under id {env_id!r}")
        if gym.spec(env_id).vector_entry_point is None:
            raise ConfigError(
                f"env {env_id!r} has no native vector entry point (gymnasium's "
                "vector_entry_point); use vectorization=None (one env per slot) or "
                "'envpool' if envpool has the task"
            )
    elif env_id not in _envpool().list_all_envs():
        raise ConfigError(
            f"envpool has no task {env_id!r}; envpool.list_all_envs() names its tasks, or "
            "use vectorization=None (one gymnasium.make env per slot)"
        )


def _episode_limit(env_id: str, vectorization: str, given: int | None) -> int:
    """The limit the native env is made with: given, else the registered one.

    The engine cuts episodes at the same step (TIMEOUT), so the native env
    must truncate there too: otherwise its episode would go on unseen.
    """
    if given is not None:
        return given
    registered = gym.spec(env_id).max_episode_steps if env_id in gym.registry else None
    if registered is None:
        raise ConfigError(
            f"env {env_id!r} ({vectorization}) has no registered episode limit; give "
            "EnvConfig(max_episode_length=...) so the native env truncates where the worker does"
        )
    return int(registered)


def _envpool() -> Any:
    try:
        return importlib.import_module("envpool")
    except ImportError as exc:
        raise ConfigError(
            "vectorization='envpool' needs envpool on the worker: pip install 'rlfleet[envpool]'"
        ) from exc


__all__ = ["ENVPOOL", "VECTORIZATIONS", "VECTOR_ENTRY_POINT", "NativeVectorEnv"]
