"""DummyVectorEnv: envs stepped one after the other in this process."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.batching import EnvRows, step_each
from rlfleet.envs.commands import (
    EnvFactory,
    EnvFailure,
    FailedCall,
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

    In async mode (``wait_num``/``timeout``) every env steps at once when
    sent its action, so each ``step`` returns all the envs it stepped: the
    same code runs unchanged on Subproc and Remote envs, where it pays off.

    Args:
        env_fns: One factory per env: callables returning a gymnasium env,
            e.g. :class:`~rlfleet.envs.EnvConfig` objects.
        wait_num: tianshou's async mode (see :class:`~rlfleet.envs.BaseVectorEnv`).
        timeout: tianshou's async mode (see :class:`~rlfleet.envs.BaseVectorEnv`).

    Raises:
        ConfigError: If ``env_fns`` is not a non-empty list of callables, or
            a factory raised it.
        VectorEnvError: If a factory raised or did not return a gymnasium env.
    """

    def __init__(
        self,
        env_fns: Sequence[EnvFactory],
        wait_num: int | None = None,
        timeout: float | None = None,
    ) -> None:
        factories = check_env_fns(env_fns)
        envs: list[Any] = []
        try:
            for index, factory in enumerate(factories):
                envs.append(build_env(factory, index))
        except BaseException:
            _close_envs(envs)
            raise
        #: The envs themselves, for inspection in tests and debugging.
        self.envs = envs
        self._factories = factories
        self._answers: dict[int, Any] = {}
        try:
            super().__init__(
                len(envs),
                functools.partial(_close_envs, envs),
                wait_num=wait_num,
                timeout=timeout,
            )
        except BaseException:
            _close_envs(envs)
            raise

    @property
    def workers(self) -> list[EnvHandle]:
        """tianshou's ``venv.workers``: per env, an object whose ``env`` is the env."""
        return [EnvHandle(env) for env in self.envs]

    def _send(self, ids: list[int], command: str, args: Sequence[Any]) -> None:
        for env_index, arg in zip(ids, args, strict=True):
            try:
                self._answers[env_index] = run_command(self.envs[env_index], command, arg)
            except Exception as exc:
                error = EnvFailure.from_exception(exc).error(env_index, command)
                error.__cause__ = exc
                self._answers[env_index] = FailedCall(error)

    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, Any]:
        return {i: self._answers.pop(i) for i in ids if i in self._answers}

    # --- a worker's engine: the envs called directly, the env's own exceptions -----

    def reset_env(self, id: int, seed: int | None) -> Any:
        """:meth:`BaseVectorEnv.reset_env`, raising what the env raised."""
        if self._closed:
            self._check_open()
        observation, _ = self.envs[id].reset(seed=seed)
        return observation

    def step_envs(self, ids: list[int], actions: Sequence[Any] | np.ndarray) -> EnvRows:
        """:meth:`BaseVectorEnv.step_envs`, calling the envs; failures are their own exceptions."""
        if self._closed:
            self._check_open()
        return step_each(self.envs, ids, actions)

    def rebuild_env(self, id: int) -> None:
        """:meth:`BaseVectorEnv.rebuild_env`: the env's factory is called again here.

        Raises:
            ConfigError: If the factory raised it.
            VectorEnvError: If the factory raised anything else.
        """
        self._check_open()
        self._check_idle([id], "rebuild_env")
        old = self.envs[id]
        # A crashed env may fail to close too; the new one replaces it either way.
        _close_envs([old])
        self._needs_reset[id] = True
        self.envs[id] = build_env(self._factories[id], id)


class EnvHandle:
    """What tianshou code reads from ``DummyVectorEnv.workers[i]``: the env, as ``.env``."""

    __slots__ = ("env",)

    def __init__(self, env: Any) -> None:
        self.env = env


#: The in-process vector env under tianshou's other name.
VectorEnv = DummyVectorEnv


def _close_envs(envs: list[Any]) -> list[BaseException]:
    """Closes every env, returning the errors instead of stopping at the first."""
    errors: list[BaseException] = []
    for env in envs:
        close = getattr(env, "close", None)  # a duck-typed env may have none
        try:
            if callable(close):
                close()
        except Exception as exc:
            errors.append(exc)
    return errors


__all__ = ["DummyVectorEnv", "VectorEnv"]
