"""Agent and env updates of a worker: which policy and which envs its slots run.

An update aborts the episodes in flight (the caller re-queues their units)
before the new policy or envs are installed on the engine, so every episode
is produced by one agent version and one env. A policy spec given before
the first env waits for it; the default policy (random) follows each new
env's spaces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from rlfleet._util.closing import close_quietly
from rlfleet._util.values import check_int
from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs._base import BaseVectorEnv
from rlfleet.envs.config import EnvConfig, make_native
from rlfleet.errors import PolicyError, WrongTypeError
from rlfleet.policies.base import Policy
from rlfleet.policies.random import RandomPolicy
from rlfleet.policies.spec import PolicySpec, make_policy
from rlfleet.worker._engine import SlotEngine
from rlfleet.worker._native_slots import NativeSlots
from rlfleet.worker._updates import (
    AgentUpdate,
    EnvSource,
    EnvUpdate,
    check_observation_space,
    describe_update,
)

logger = logging.getLogger("rlfleet.worker")


class WorkerInstalls:
    """Applies agent and env updates to a worker's engine.

    Args:
        engine: The worker's engine.
        seed: Seed of policies built from specs and of the default policy.
        max_episode_length: The worker's own cut-off (None: the env's).
        abort: Aborts the episodes in flight (their units are re-queued).
        abandon_streams: Ends the fragment streams' current episodes.
    """

    def __init__(
        self,
        engine: SlotEngine,
        *,
        seed: int,
        max_episode_length: int | None,
        abort: Callable[[], None],
        abandon_streams: Callable[[], None],
    ) -> None:
        self._engine = engine
        self._n_envs = engine.n_envs
        self._seed = seed
        self._max_episode_length = max_episode_length
        self._abort = abort
        self._abandon_streams = abandon_streams
        self._pending_policy: PolicySpec | str | None = None  # waits for the first env
        self._policy_is_default = True
        #: Version of the current agent (0 initially, +1 per agent update).
        self.agent_version = 0

    def update_agent(self, agent_update: AgentUpdate, version: int | None) -> int:
        """``VecWorker.update_agent`` on an open worker."""
        if agent_update is None:
            return self.agent_version
        if version is not None:
            check_int("version", version, minimum=0)
        engine = self._engine
        if isinstance(agent_update, Mapping):
            if engine.policy is None:
                raise PolicyError(
                    "got parameters but the worker has no policy to set them on yet; "
                    "send a Policy or PolicySpec first (and an env update)"
                )
            engine.policy.set_param_values(agent_update)
            new_policy = engine.policy
        elif isinstance(agent_update, Policy):
            new_policy, self._pending_policy = agent_update, None
            self._policy_is_default = False
        elif isinstance(agent_update, PolicySpec | str):
            if engine.spec is None:
                self._pending_policy, new_policy = agent_update, None  # built by update_env
            else:
                # Seeded with the worker's seed: workers build the same initial weights.
                new_policy = make_policy(agent_update, engine.spec, seed=self._seed)
                self._pending_policy = None
            self._policy_is_default = False
        else:
            raise WrongTypeError(describe_update(agent_update))
        self.agent_version = self.agent_version + 1 if version is None else version
        self._abort()
        if new_policy is not None:
            engine.install_policy(new_policy)
        return self.agent_version

    def update_env(self, env_update: EnvUpdate) -> None:
        """``VecWorker.update_env`` on an open worker."""
        if env_update is None:
            return
        source = EnvSource(env_update)
        if isinstance(env_update, EnvConfig) and env_update.native:
            self._install_native(source, env_update)
            return
        venv = source.vector_env(self._n_envs)
        try:
            max_len = self._max_episode_length or source.max_episode_length or source.time_limit
            spec = _slot_spec(venv, max_len)
            check_observation_space(spec.observation_space, f"env {source.name}")
        except BaseException:
            close_quietly(venv, f"env {source.name}", logger)
            raise
        self._abort()
        self._abandon_streams()
        self._engine.install_envs(source, venv, spec)
        self._install_policy_for(spec)

    def _install_native(self, source: EnvSource, config: EnvConfig) -> None:
        """Makes one native vector env step every slot (docs/reliability.md)."""
        native = make_native(config, self._n_envs, max_episode_length=self._max_episode_length)
        try:
            spec = native.env_spec()
            check_observation_space(spec.observation_space, f"env {native.name}")
        except BaseException:
            native.close()
            raise
        self._abort()
        self._abandon_streams()
        self._engine.install_native(source, NativeSlots(native), spec)
        self._install_policy_for(spec)

    def _install_policy_for(self, spec: EnvSpec) -> None:
        """Builds the pending policy for a new env, or re-checks the current one."""
        if self._pending_policy is not None:
            self._engine.install_policy(make_policy(self._pending_policy, spec, seed=self._seed))
            self._pending_policy = None
        elif self._engine.policy is None or self._policy_is_default:
            self._engine.install_policy(RandomPolicy(spec, seed=self._seed))
        else:
            self._engine.install_policy(self._engine.policy)  # re-checked against the env


def _slot_spec(venv: BaseVectorEnv, max_episode_length: int | None) -> EnvSpec:
    """The EnvSpec of env 0 of ``venv`` (wherever it runs), as ``EnvSpec.from_env``."""
    observation_space, action_space, registered = (
        venv.get_env_attr(key, id=0)[0] for key in ("observation_space", "action_space", "spec")
    )
    if max_episode_length is None and registered is not None:
        max_episode_length = registered.max_episode_steps
    return EnvSpec(observation_space, action_space, max_episode_length)
