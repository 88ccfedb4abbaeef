"""Agent and env updates: what a worker accepts and how it turns them into
the policy and the envs it runs."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit

from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.config import SUBPROCESS, EnvConfig, make_env
from rlfleet.envs.dummy import DummyVectorEnv
from rlfleet.envs.subproc import SubprocVectorEnv
from rlfleet.errors import ConfigError, PolicyError, WrongTypeError
from rlfleet.policies.base import Policy
from rlfleet.policies.spec import PolicySpec

#: An agent update: parameters (``Policy.set_param_values``), a whole policy,
#: a policy spec (or its name / JSON), or None for no change.
AgentUpdate: TypeAlias = Mapping[str, np.ndarray] | Policy | PolicySpec | str | None
#: An env update: an EnvConfig or any env factory, a gymnasium Env (garage
#: style), or None for no change.
EnvUpdate: TypeAlias = EnvConfig | Callable[[], gym.Env] | gym.Env | None


class EnvSource:
    """Builds the envs of a worker's slots from one env update.

    A factory (an :class:`~rlfleet.envs.config.EnvConfig` is one) is called
    once per env and again to rebuild an env that crashed; an EnvConfig's
    envs are built with ``make_env(..., worker_checked=True)``, and their
    outermost ``TimeLimit`` is taken off (:attr:`time_limit`: the engine
    counts every episode's steps anyway and truncates at the same step). A
    gymnasium Env instance is used as env 0 and deep-copied for the others, as garage's
    VecWorker does; an instance cannot be rebuilt, so its crashes are final.

    Args:
        update: The env update (not None).

    Raises:
        WrongTypeError: If ``update`` is neither an Env nor callable.
    """

    def __init__(self, update: EnvConfig | Callable[[], gym.Env] | gym.Env) -> None:
        self._factory: Callable[[], gym.Env] | None = None
        self._instance: gym.Env | None = None
        self._takes_off_time_limit = False
        self._subprocess = False
        #: The limit of the ``TimeLimit`` taken off the envs (None if none was).
        self.time_limit: int | None = None
        if isinstance(update, gym.Env):
            self._instance = update
            self.name = f"{type(update.unwrapped).__name__} instance"
        elif isinstance(update, EnvConfig):
            # The engine enforces reset-before-step and checks values itself.
            self._factory = functools.partial(make_env, update, worker_checked=True)
            # A child's env keeps its TimeLimit: the parent never sees the env to take it off.
            self._subprocess = update.vectorization == SUBPROCESS
            self._takes_off_time_limit = not self._subprocess
            self.name = repr(update.id)
        elif callable(update):
            self._factory = update
            self.name = repr(update)
        else:
            raise WrongTypeError(
                "env update must be an EnvConfig, a callable returning a gymnasium Env, "
                f"a gymnasium Env, or None; got {type(update).__name__}"
            )
        self.max_episode_length = (
            update.max_episode_length if isinstance(update, EnvConfig) else None
        )

    def vector_env(self, n_envs: int) -> BaseVectorEnv:
        """The envs of ``n_envs`` slots, as one vector env.

        A subprocess config's envs run in one child process each; the others
        are built here (:meth:`make`).

        Raises:
            ConfigError: If an env cannot be built (as :meth:`make`).
            VectorEnvError: If a factory raised something else, or a child
                process failed to start.
        """
        if self._subprocess:
            assert self._factory is not None  # set for every EnvConfig
            # No call deadline: a slow step waits, as it does in-process.
            return SubprocVectorEnv([self._factory] * n_envs, call_timeout=None)
        return DummyVectorEnv([functools.partial(self.make, index) for index in range(n_envs)])

    @property
    def rebuildable(self) -> bool:
        """Whether a crashed env can be replaced by a fresh one."""
        return self._factory is not None

    def make(self, index: int) -> gym.Env:
        """Builds the env of slot ``index`` (called once per slot per update).

        Raises:
            ConfigError: If the factory returns something else than an Env,
                or an instance cannot be copied for slot ``index`` > 0.
        """
        if self._factory is None:
            assert self._instance is not None  # one of the two is set in __init__
            if index == 0:
                return self._instance
            try:
                return copy.deepcopy(self._instance)
            except Exception as exc:  # deepcopy fails in many ways (locks, handles, ...)
                raise ConfigError(
                    f"cannot deep-copy the env {self.name} for env slot {index} "
                    f"({type(exc).__name__}: {exc}); pass an EnvConfig or an env factory "
                    "instead of an instance"
                ) from exc
        env = self._factory()
        if not isinstance(env, gym.Env):
            raise ConfigError(
                f"env factory {self.name} returned {type(env).__name__}, not a gymnasium Env"
            )
        if self._takes_off_time_limit and type(env) is TimeLimit:
            # gymnasium applies a registered spec's additional_wrappers outside
            # TimeLimit: only an outermost one can go without changing the env.
            self.time_limit = env.spec.max_episode_steps if env.spec is not None else None
            if self.time_limit is not None:
                return env.env
        return env

    def check_rebuildable(self) -> None:
        """Refuses to rebuild an env given as an instance (a factory's are made again).

        Raises:
            ConfigError: Saying what to pass instead.
        """
        if self._factory is None:
            raise ConfigError(
                f"the env {self.name} was given as an instance and cannot be rebuilt; "
                "pass an EnvConfig or an env factory to let the worker restart crashed envs"
            )


def check_observation_space(space: gym.Space, where: str) -> None:
    """Rejects observation spaces that have no array shape (Dict, Tuple, ...).

    Raises:
        ConfigError: Suggesting a flattening wrapper.
    """
    if space.shape is None:
        raise ConfigError(
            f"{where}: workers store observations as arrays, and {space} has no array "
            "shape; wrap the env with gymnasium.wrappers.FlattenObservation"
        )


def check_policy_fits(policy: Policy, env_spec: EnvSpec) -> None:
    """Raises PolicyError if the policy was built for other spaces than the env's."""
    theirs = getattr(policy, "env_spec", None)
    if theirs is None:
        return
    for name in ("observation_space", "action_space"):
        mine, its = getattr(env_spec, name), getattr(theirs, name, None)
        if its is not None and its != mine:
            raise PolicyError(
                f"{type(policy).__name__} was built for {name} {its} but the worker's env "
                f"has {mine}; send an agent update built for this env (or an env update "
                "matching the policy)"
            )


def describe_update(update: Any) -> str:
    """A short description of an unsupported agent update, for TypeErrors."""
    return (
        "agent update must be a dict of parameter arrays, a Policy, a PolicySpec (or "
        f"its name or JSON), or None; got {type(update).__name__}"
    )
