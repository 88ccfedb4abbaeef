"""FleetVectorEnv: any rlfleet vector env as a ``gymnasium.vector.VectorEnv``.

CleanRL-style scripts and gymnasium's vector wrappers (``RecordEpisodeStatistics``,
``NormalizeObservation``, ...) then run unchanged on local processes or on
the fleet.

Example::

    from rlfleet.envs import SubprocVectorEnv
    from rlfleet.integrations.gymnasium import FleetVectorEnv

    envs = FleetVectorEnv(SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 8))
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    obs, infos = envs.reset(seed=1)

``gym.make_vec("rlfleet/Fleet-v0", num_envs=8, vectorization_mode="vector_entry_point",
fleet=ADDRESS, env="CartPole-v1")`` builds one over envs leased on a fleet
(:func:`make_fleet_vector_env`; the id is registered by importing rlfleet).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from rlfleet.envs import BaseVectorEnv, EnvConfig
from rlfleet.errors import ConfigError, InvalidArgumentError
from rlfleet.integrations._venv import batch_row, common_spaces, local_vector_env, plain_info

if TYPE_CHECKING:
    from rlfleet.client import Fleet, RemoteSampler


class FleetVectorEnv(gym.vector.VectorEnv):
    """A gymnasium ``VectorEnv`` over an rlfleet :class:`~rlfleet.envs.BaseVectorEnv`.

    It behaves like gymnasium's ``SyncVectorEnv`` with the same envs (tested
    step for step against it): batched spaces from the envs' common single
    spaces, ``metadata["autoreset_mode"]`` honoured (``NEXT_STEP``: an
    ended env is reset by the next ``step``, which ignores its action and
    returns its first observation with reward 0; ``SAME_STEP``: it is reset
    in the same step, its last observation and info in ``infos["final_obs"]``
    and ``infos["final_info"]``; ``DISABLED``: reset it yourself with
    ``reset(options={"reset_mask": mask})``), and gymnasium's info dict
    (each key an array over envs with a ``_key`` mask). The wrapped vector
    env must be synchronous; the adapter owns it and closes it.

    Args:
        venv: Dummy, Subproc or Remote vector env, its envs sharing one
            observation and one action space.
        autoreset_mode: An ``AutoresetMode`` or its value (``"NextStep"``,
            ``"SameStep"``, ``"Disabled"``).

    Raises:
        ConfigError: If ``venv`` is asynchronous, closed, not a
            BaseVectorEnv, or its envs' spaces differ, or the mode is unknown.
    """

    def __init__(
        self, venv: BaseVectorEnv, autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP
    ) -> None:
        try:
            mode = AutoresetMode(autoreset_mode)
        except ValueError:
            raise ConfigError(
                f"FleetVectorEnv(autoreset_mode={autoreset_mode!r}): use one of "
                f"{[m.value for m in AutoresetMode]}"
            ) from None
        single_observation_space, single_action_space = common_spaces(venv, "FleetVectorEnv")
        self.venv = venv
        self.num_envs = len(venv)
        self.autoreset_mode = mode
        self.single_observation_space = single_observation_space
        self.single_action_space = single_action_space
        self.observation_space = batch_space(single_observation_space, self.num_envs)
        self.action_space = batch_space(single_action_space, self.num_envs)
        metadata, render_mode = (
            venv.get_env_attr(name, id=0)[0] for name in ("metadata", "render_mode")
        )
        self.metadata = {**metadata, "autoreset_mode": mode}
        self.render_mode = render_mode
        self._observations: Any = create_empty_array(single_observation_space, self.num_envs)
        self._env_obs: list[Any] = list(iterate(self.observation_space, self._observations))
        self._autoreset_envs = np.zeros(self.num_envs, dtype=bool)

    @classmethod
    def from_env_fns(
        cls,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        subprocess: bool = True,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        **kwargs: Any,
    ) -> FleetVectorEnv:
        """Builds the vector env too: a SubprocVectorEnv, or a DummyVectorEnv.

        Args:
            env_fns: One env factory per env (lambdas are fine).
            subprocess: One process per env (SubprocVectorEnv) or all in
                this process (DummyVectorEnv).
            autoreset_mode: As for the constructor.
            **kwargs: More arguments of that class (``call_timeout``, ...).
        """
        venv = local_vector_env(env_fns, subprocess, **kwargs)
        return cls(venv, autoreset_mode)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets every env, or those of ``options["reset_mask"]``.

        Args:
            seed: None, an int ``s`` (env ``i`` gets ``s + i``) or one seed
                (or None) per env.
            options: Passed to each env's ``reset``, except ``"reset_mask"``:
                a bool array with one entry per env, the envs to reset.

        Returns:
            ``(observations, infos)`` for all envs (those not reset keep
            their current observation).

        Raises:
            InvalidArgumentError: If the seeds or the mask do not fit.
        """
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int | np.integer):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise InvalidArgumentError(
                f"reset(seed=...): got {len(seeds)} seeds for {self.num_envs} envs"
            )
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        ids = list(range(self.num_envs)) if mask is None else self._masked(mask)
        extra: dict[str, Any] = {"options": options} if options else {}
        obs, raw_infos = self.venv.reset(ids, seed=[seeds[i] for i in ids], **extra)
        infos: dict[str, Any] = {}
        for k, i in enumerate(ids):
            self._env_obs[i] = batch_row(obs, k)
            infos = self._add_info(infos, plain_info(raw_infos[k]), i)
        self._autoreset_envs[ids] = False
        return self._batched_observations(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every env (see the class docstring for ended episodes).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``.
        """
        rows = list(iterate(self.action_space, actions))
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminations = np.zeros(self.num_envs, dtype=bool)
        truncations = np.zeros(self.num_envs, dtype=bool)
        env_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        final: dict[int, dict[str, Any]] = {}
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            resetting = [i for i in range(self.num_envs) if self._autoreset_envs[i]]
        else:
            resetting = []
        stepping = [i for i in range(self.num_envs) if i not in resetting]
        # Next-step autoreset: the ended envs reset while the others step,
        # in one round.
        (obs, step_rewards, step_terminated, step_truncated, raw_infos), reset = (
            self.venv.step_and_reset([rows[i] for i in stepping], stepping, resetting)
        )
        for k, i in enumerate(stepping):
            self._env_obs[i] = batch_row(obs, k)
            rewards[i] = step_rewards[k]
            terminations[i] = step_terminated[k]
            truncations[i] = step_truncated[k]
            env_infos[i] = plain_info(raw_infos[k])
        if self.autoreset_mode == AutoresetMode.SAME_STEP:
            resetting = [i for i in stepping if terminations[i] or truncations[i]]
            for i in resetting:
                final[i] = {"final_obs": self._env_obs[i], "final_info": env_infos[i]}
            reset = self.venv.reset(resetting) if resetting else reset
        for k, i in enumerate(resetting):
            self._env_obs[i] = batch_row(reset[0], k)
            env_infos[i] = plain_info(reset[1][k])
        infos: dict[str, Any] = {}
        for i in range(self.num_envs):
            if i in final:
                infos = self._add_info(infos, final[i], i)
            infos = self._add_info(infos, env_infos[i], i)
        self._autoreset_envs = terminations | truncations
        return self._batched_observations(), rewards, terminations, truncations, infos

    def render(self) -> tuple[Any, ...] | None:
        """One frame (or None) per env."""
        return tuple(self.venv.render())

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Calls method ``name`` of every env, like ``SyncVectorEnv.call`` (use
        :meth:`get_attr` for plain attributes)."""
        return tuple(self.venv.call_env_method(name, args, kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (through wrappers), like ``SyncVectorEnv``."""
        return tuple(self.venv.get_env_attr(name))

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | object) -> None:
        """Sets attribute ``name`` on every env: one value for all, or a list/tuple of one each."""
        if not isinstance(values, list | tuple):
            self.venv.set_env_attr(name, values)
            return
        if len(values) != self.num_envs:
            raise InvalidArgumentError(
                f"set_attr({name!r}): got {len(values)} values for {self.num_envs} envs"
            )
        for i, value in enumerate(values):
            self.venv.set_env_attr(name, value, id=i)

    def close_extras(self, **kwargs: Any) -> None:
        """Closes the wrapped vector env (``close()`` calls this)."""
        self.venv.close()

    def _masked(self, mask: Any) -> list[int]:
        if (
            not isinstance(mask, np.ndarray)
            or mask.dtype != np.bool_
            or mask.shape != (self.num_envs,)
        ):
            raise InvalidArgumentError(
                f"reset(options={{'reset_mask': ...}}) takes a bool numpy array of shape "
                f"({self.num_envs},), got {mask!r}"
            )
        if not mask.any():
            raise InvalidArgumentError("reset(options={'reset_mask': ...}): no env is selected")
        return [int(i) for i in np.flatnonzero(mask)]

    def _batched_observations(self) -> Any:
        self._observations = concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        return copy.deepcopy(self._observations)


def make_fleet_vector_env(
    num_envs: int,
    *,
    env: str | EnvConfig | None = None,
    fleet: str | RemoteSampler | Fleet | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    max_episode_steps: int | None = None,
    autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
    **remote_kwargs: Any,
) -> FleetVectorEnv:
    """``rlfleet/Fleet-v0``'s vector entry point: ``num_envs`` envs leased on a fleet.

    ``gym.make_vec("rlfleet/Fleet-v0", num_envs=N, vectorization_mode=
    "vector_entry_point", **kwargs)`` calls it with ``make_vec``'s keyword
    arguments (RLlib passes its ``env_config`` this way).

    Args:
        num_envs: How many envs to lease.
        env: The env on the workers: a gymnasium id (custom ones registered
            there with ``--import``) or an EnvConfig.
        fleet: A coordinator's ``HOST:PORT``, a RemoteSampler, an embedded
            :class:`~rlfleet.client.Fleet`, or None for an embedded fleet of
            the env's own (closed with it).
        env_kwargs: The env's keyword arguments (JSON-able), with a gymnasium id.
        max_episode_steps: Overrides the env's episode limit.
        autoreset_mode: As for :class:`FleetVectorEnv`.
        **remote_kwargs: More :class:`~rlfleet.client.RemoteVectorEnv`
            arguments (``call_timeout``, ``open_timeout``, ``token``, ``tls_ca``, ...).

    Raises:
        ConfigError: For bad arguments (an async ``wait_num`` included:
            gymnasium steps every env every step).
    """
    from rlfleet.client import RemoteVectorEnv  # the fleet client, only when used

    if isinstance(env, EnvConfig):
        if env_kwargs or max_episode_steps is not None:
            raise ConfigError(
                "make_fleet_vector_env: give env_kwargs and max_episode_steps inside the "
                "EnvConfig, or give env as a gymnasium id"
            )
        config = env
    elif isinstance(env, str):
        config = EnvConfig(env, dict(env_kwargs or {}), max_episode_steps)
    else:
        raise ConfigError(
            f"rlfleet/Fleet-v0 needs env= a gymnasium id or an EnvConfig, got {env!r}"
        )
    venv = RemoteVectorEnv(fleet, config, num_envs, **remote_kwargs)
    try:
        return FleetVectorEnv(venv, autoreset_mode)
    except BaseException:
        venv.close()
        raise


__all__ = ["FleetVectorEnv", "make_fleet_vector_env"]
