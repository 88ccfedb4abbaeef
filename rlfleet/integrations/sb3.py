"""FleetVecEnv: any rlfleet vector env as a Stable-Baselines3 ``VecEnv``.

Needs the extra ``rlfleet[sb3]`` (install ``torch==2.13.0``, or your own
torch build, first: an unpinned torch requirement pulls a CUDA build).

Example::

    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecMonitor
    from rlfleet.envs import SubprocVectorEnv
    from rlfleet.integrations.sb3 import FleetVecEnv

    venv = VecMonitor(FleetVecEnv(SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 4)))
    PPO("MlpPolicy", venv).learn(20_000)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from rlfleet.envs import BaseVectorEnv
from rlfleet.envs.batching import stack_batch
from rlfleet.errors import UsageError
from rlfleet.integrations._venv import (
    batch_row,
    common_spaces,
    env_indices,
    local_vector_env,
    plain_info,
    set_batch_rows,
)


class FleetVecEnv(VecEnv):
    """A Stable-Baselines3 ``VecEnv`` over an rlfleet :class:`~rlfleet.envs.BaseVectorEnv`.

    It behaves like SB3's ``DummyVecEnv``/``SubprocVecEnv``: an env whose
    episode ends is reset in the same ``step_wait``; its last observation is
    ``infos[i]["terminal_observation"]``, ``infos[i]["TimeLimit.truncated"]``
    says whether it was cut by a time limit, and ``reset_infos[i]`` holds
    the new episode's reset info. Seeds (``seed``) and options
    (``set_options``) apply at the next ``reset()``, as in SB3. The wrapped
    vector env must be synchronous (no ``wait_num``/``timeout``); the
    adapter owns it and closes it.

    Args:
        venv: Dummy, Subproc or Remote vector env, its envs sharing one
            observation and one action space.

    Raises:
        ConfigError: If ``venv`` is asynchronous, closed, not a
            BaseVectorEnv, or its envs' spaces differ.
    """

    def __init__(self, venv: BaseVectorEnv) -> None:
        observation_space, action_space = common_spaces(venv, "FleetVecEnv")
        self.venv = venv
        self._actions: np.ndarray | None = None
        super().__init__(len(venv), observation_space, action_space)

    @classmethod
    def from_env_fns(
        cls, env_fns: Sequence[Callable[[], gym.Env]], *, subprocess: bool = True, **kwargs: Any
    ) -> FleetVecEnv:
        """Builds the vector env too: a SubprocVectorEnv, or a DummyVectorEnv.

        Args:
            env_fns: One env factory per env (lambdas are fine).
            subprocess: One process per env (SubprocVectorEnv) or all in
                this process (DummyVectorEnv).
            **kwargs: More arguments of that class (``call_timeout``, ...).
        """
        venv = local_vector_env(env_fns, subprocess, **kwargs)
        return cls(venv)

    def reset(self) -> VecEnvObs:
        """Resets every env with the pending seeds and options; returns the observations."""
        options = self._options
        if all(option == options[0] for option in options):
            groups = [(list(range(self.num_envs)), options[0])]
        else:
            groups = [([k], option) for k, option in enumerate(options)]
        rows: list[Any] = [None] * self.num_envs
        for ids, option in groups:
            extra: dict[str, Any] = {"options": option} if option else {}
            obs, infos = self.venv.reset(ids, seed=[self._seeds[k] for k in ids], **extra)
            for j, (k, info) in enumerate(zip(ids, infos, strict=True)):
                rows[k] = batch_row(obs, j)
                self.reset_infos[k] = plain_info(info)
        self._reset_seeds()
        self._reset_options()
        self._actions = None
        return stack_batch(rows)

    def step_async(self, actions: np.ndarray) -> None:
        """Records the actions; ``step_wait`` steps every env with them."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Steps every env, resetting those whose episode ended.

        Raises:
            UsageError: Without a ``step_async`` since the last step or reset.
            VectorEnvError: If an env raised, died or timed out.
        """
        if self._actions is None:
            raise UsageError("FleetVecEnv.step_wait() without step_async(actions) first")
        actions, self._actions = self._actions, None
        obs, rewards, terminated, truncated, raw_infos = self.venv.step(actions)
        if _holds_dicts(obs):  # SB3 batches Dict observations key by key
            obs = stack_batch(list(obs))
        dones = terminated | truncated
        infos = [plain_info(info) for info in raw_infos]
        for k, info in enumerate(infos):
            info["TimeLimit.truncated"] = bool(truncated[k] and not terminated[k])
        ended = [int(k) for k in np.flatnonzero(dones)]
        if ended:
            for k in ended:
                infos[k]["terminal_observation"] = batch_row(obs, k)
            # A fresh batch: the terminal rows above must not be overwritten.
            obs = _copy_batch(obs)
            first, reset_infos = self.venv.reset(ended)
            if _holds_dicts(first):
                first = stack_batch(list(first))
            set_batch_rows(obs, ended, first)
            for k, info in zip(ended, reset_infos, strict=True):
                self.reset_infos[k] = plain_info(info)
        return obs, rewards.astype(np.float32), dones, infos

    def close(self) -> None:
        """Closes the wrapped vector env."""
        self.venv.close()

    def get_images(self) -> Sequence[np.ndarray | None]:
        """One frame per env when the envs render ``rgb_array``, else Nones."""
        if self.render_mode != "rgb_array":
            return [None] * self.num_envs
        return self.venv.render()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Attribute ``attr_name`` of each env (through gymnasium wrappers)."""
        return self.venv.get_env_attr(attr_name, env_indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Sets attribute ``attr_name`` on each env."""
        self.venv.set_env_attr(attr_name, value, env_indices(indices))

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        """Calls method ``method_name`` of each env; returns their results."""
        return self.venv.call_env_method(
            method_name, method_args, method_kwargs, env_indices(indices)
        )

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Whether each env is wrapped in ``wrapper_class`` (or a subclass of it).

        Answered from class names, so no class travels to where the envs run.
        """
        name = f"{wrapper_class.__module__}.{wrapper_class.__qualname__}"
        return [name in names for names in self.venv.class_names(env_indices(indices))]


def _copy_batch(batch: Any) -> Any:
    if isinstance(batch, dict):
        return {key: _copy_batch(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_copy_batch(value) for value in batch)
    return np.array(batch, copy=True)


def _holds_dicts(obs: Any) -> bool:
    """Whether a vector env's observations are its envs' dicts (Dict spaces)."""
    return isinstance(obs, np.ndarray) and obs.dtype == object and isinstance(obs[0], dict)


__all__ = ["FleetVecEnv"]
