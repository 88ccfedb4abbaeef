"""DummyVectorEnv: envs stepped one after the other in this process."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from rlfleet.envs._base import (
    BaseVectorEnv,
    EnvFactory,
    EnvFailure,
    build_env,
    check_env_fns,
    run_command,
)


class DummyVectorEnv(BaseVectorEnv):
    """Runs its envs sequentially in the calling process (tianshou's name).

    Cheap and easy to debug; use :class:`~rlfleet.envs.SubprocVectorEnv`
    when env steps are slow enough to be worth parallel processes. The API
    and its rules are :class:`~rlfleet.envs.BaseVectorEnv`'s.

    Example::

        venv = DummyVectorEnv([EnvConfig("CartPole-v1")] * 4)
        venv.seed(0)
        obs, infos = venv.reset()

    Args:
        env_fns: One factory per env: callables returning a gymnasium env,
            e.g. :class:`~rlfleet.envs.EnvConfig` objects.

    Raises:
        ConfigError: If ``env_fns`` is not a non-empty list of callables, or
            a factory raised it.
        VectorEnvError: If a factory raised or did not return a gymnasium env.
    """

    def __init__(self, env_fns: Sequence[EnvFactory]) -> None:
        factories = check_env_fns(env_fns)
        envs: list[gym.Env] = []
        try:
            for index, factory in enumerate(factories):
                envs.append(build_env(factory, index))
        except BaseException:
            _close_envs(envs)
            raise
        #: The envs themselves, for inspection in tests and debugging.
        self.envs = envs
        super().__init__(len(envs), functools.partial(_close_envs, envs))

    def _run(self, ids: list[int], command: str, args: Sequence[Any]) -> list[Any]:
        results = []
        for env_index, arg in zip(ids, args, strict=True):
            try:
                results.append(run_command(self.envs[env_index], command, arg))
            except Exception as exc:
                raise EnvFailure.from_exception(exc).error(env_index, command) from exc
        return results


def _close_envs(envs: list[gym.Env]) -> list[BaseException]:
    """Closes every env, returning the errors instead of stopping at the first."""
    errors: list[BaseException] = []
    for env in envs:
        try:
            env.close()
        except Exception as exc:
            errors.append(exc)
    return errors


__all__ = ["DummyVectorEnv"]
