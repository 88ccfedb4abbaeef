"""Multi-agent envs on the fleet: a PettingZoo env as one joint gymnasium env.

A fleet worker runs episodes of one gymnasium env with one policy, and every
guarantee of the fleet (per-episode seeds, batches independent of the
number of workers, nothing lost or doubled when a worker dies) is about
those episodes. So a PettingZoo env reaches the fleet as a
:class:`MultiAgentJointEnv`: one step of it is one parallel step of all
agents, its observation concatenates every agent's (flattened) observation
and an "acts" mask, its action every agent's flattened action.
:class:`~rlfleet.rllib.joint_policy.MultiAgentJointPolicy` holds one policy
per policy id and asks each, in one batched call, for the actions of the
agents mapped to it. :func:`~rlfleet.rllib.joint_batches.split_joint_batch`
turns the fleet's joint batch back into one ``EpisodeBatch`` per policy id,
exactly as a local RolloutWorker builds them.

Nothing but names and data travel: the env is a name registered by the
worker's ``--import`` module (:func:`register_multi_agent_env`, an id in the
``multi-agent/`` namespace), the policy an import path (workers started
with ``--import rlfleet.rllib``) whose sub-policies must be built-ins, and
parameters are named ``<policy id>/<parameter>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.errors import ConfigError
from rlfleet.protocol.multi_agent import MULTI_AGENT_NAMESPACE
from rlfleet.rllib._envs import AgentEnv

#: env_infos of a joint batch (each (S, n_agents)): per-agent rewards, end flags, step counts.
REWARDS, TERMINATED, TRUNCATED, AGENT_STEPS = (
    "ma.rewards",
    "ma.terminated",
    "ma.truncated",
    "ma.steps",
)
#: Prefix of an agent's own env info in a joint step's info: ``ma.info/<agent>/<key>``.
AGENT_INFO = "ma.info/"

_CREATORS: dict[str, Callable[..., Any]] = {}


def register_multi_agent_env(name: str, creator: Callable[..., Any]) -> str:
    """Registers a PettingZoo env under the gymnasium id ``multi-agent/<name>``.

    Call it in the module fleet workers import (``rlfleet worker --import
    MODULE``); the learner names the env by the returned id. The id's
    namespace tells the coordinator the env is multi-agent, so it goes only
    to workers with the ``rlfleet.multi-agent`` capability.

    Args:
        name: The env's name, e.g. ``"simple_spread-v3"`` (no ``/`` or ``:``).
        creator: ``creator(**kwargs)`` returns a PettingZoo Parallel or AEC env.

    Returns:
        The gymnasium id, e.g. ``"multi-agent/simple_spread-v3"``.

    Raises:
        ConfigError: If the name is malformed or the creator not callable.
    """
    if not isinstance(name, str) or not name or "/" in name or ":" in name:
        raise ConfigError(
            f"multi-agent env name must be a non-empty string without '/' or ':', got {name!r}"
        )
    if not callable(creator):
        raise ConfigError(f"multi-agent env {name!r}: the creator must be callable")
    env_id = f"{MULTI_AGENT_NAMESPACE}/{name}"
    _CREATORS[env_id] = creator
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_joint_entry(env_id), disable_env_checker=True)
    return env_id


def make_agent_env(env_id: str, kwargs: Mapping[str, Any] | None = None) -> Any:
    """Builds the PettingZoo env registered under ``env_id`` (as a local RolloutWorker runs it).

    Raises:
        ConfigError: If nothing is registered under the id.
    """
    creator = _CREATORS.get(env_id)
    if creator is None:
        raise ConfigError(
            f"no multi-agent env is registered as {env_id!r} (known: {sorted(_CREATORS)}); "
            "call rlfleet.rllib.register_multi_agent_env in a module the workers import "
            "(--import MODULE)"
        )
    return creator(**dict(kwargs or {}))


def _joint_entry(env_id: str) -> Callable[..., gym.Env]:
    def make(**kwargs: Any) -> gym.Env:
        return MultiAgentJointEnv(make_agent_env(env_id, kwargs))

    return make


@dataclass(frozen=True)
class JointLayout:
    """Where each agent's observation and action sit in the joint vectors.

    Attributes:
        agents: The env's ``possible_agents``, in order.
        observation_spaces: Each agent's observation space as policies see it.
        action_spaces: Each agent's action space.
    """

    agents: tuple[str, ...]
    observation_spaces: tuple[gym.Space, ...]
    action_spaces: tuple[gym.Space, ...]

    @classmethod
    def of(cls, env: AgentEnv) -> JointLayout:
        """The layout of an env."""
        agents = tuple(env.agents_seen)
        return cls(
            agents,
            tuple(env.observation_space(a) for a in agents),
            tuple(env.action_space(a) for a in agents),
        )

    def _offsets(self, spaces: Sequence[gym.Space]) -> list[tuple[int, int]]:
        bounds, start = [], 0
        for space in spaces:
            size = int(gym.spaces.flatdim(space))
            bounds.append((start, start + size))
            start += size
        return bounds

    @cached_property
    def observation_slices(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each agent's flattened observation."""
        return self._offsets(self.observation_spaces)

    @cached_property
    def action_slices(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each agent's flattened action."""
        return self._offsets(self.action_spaces)

    @cached_property
    def mask_start(self) -> int:
        """Where the "acts" mask (one 0/1 per agent) begins in the joint observation."""
        return self.observation_slices[-1][1]

    def joint_spaces(self) -> tuple[gym.spaces.Box, gym.spaces.Box]:
        """The joint observation and action spaces (float64 Boxes)."""
        n = len(self.agents)
        obs_low, obs_high = _flat_bounds(self.observation_spaces)
        act_low, act_high = _flat_bounds(self.action_spaces)
        observation_space: gym.spaces.Box = gym.spaces.Box(
            np.concatenate([obs_low, np.zeros(n)]),
            np.concatenate([obs_high, np.ones(n)]),
            dtype=np.float64,
        )
        action_space: gym.spaces.Box = gym.spaces.Box(
            act_low,
            act_high,
            dtype=np.float64,
        )
        return observation_space, action_space

    def agent_observation(self, joint: np.ndarray, index: int) -> np.ndarray:
        """Agent ``index``'s observation (its own space's dtype) from one joint row."""
        start, stop = self.observation_slices[index]
        return np.asarray(gym.spaces.unflatten(self.observation_spaces[index], joint[start:stop]))

    def agent_action(self, joint: np.ndarray, index: int) -> np.ndarray:
        """Agent ``index``'s action from one joint action row."""
        start, stop = self.action_slices[index]
        return np.asarray(gym.spaces.unflatten(self.action_spaces[index], joint[start:stop]))

    def write_action(self, joint: np.ndarray, index: int, action: Any) -> None:
        """Writes agent ``index``'s action (in its own space) into one joint action row."""
        start, stop = self.action_slices[index]
        joint[start:stop] = np.asarray(gym.spaces.flatten(self.action_spaces[index], action))

    def agent_observations(self, joint: np.ndarray) -> dict[str, np.ndarray]:
        """The observations of the agents that act, by agent id, from one joint observation row.

        How a user of the joint env (e.g. leased through a RemoteVectorEnv)
        finds who acts and what each agent sees.
        """
        acts = np.asarray(joint)[self.mask_start :] > 0.5
        return {
            agent: self.agent_observation(joint, i)
            for i, agent in enumerate(self.agents)
            if acts[i]
        }

    def joint_action(self, actions: Mapping[str, Any]) -> np.ndarray:
        """One joint action row from the acting agents' actions, by agent id.

        Agents not named get zeros, which the env ignores for agents that do not act.

        Raises:
            ConfigError: For an agent id the env does not have.
        """
        joint = np.zeros(self.action_slices[-1][1], np.float64)
        for agent, action in actions.items():
            if agent not in self.agents:
                raise ConfigError(
                    f"joint_action: agent {agent!r} is not one of the env's agents {self.agents}"
                )
            self.write_action(joint, self.agents.index(agent), action)
        return joint


def _flat_bounds(spaces: Sequence[gym.Space]) -> tuple[np.ndarray, np.ndarray]:
    boxes: list[Any] = [gym.spaces.flatten_space(s) for s in spaces]
    return (
        np.concatenate([np.asarray(b.low, np.float64) for b in boxes]),
        np.concatenate([np.asarray(b.high, np.float64) for b in boxes]),
    )


class MultiAgentJointEnv(gym.Env):
    """A PettingZoo env as one gymnasium env whose steps are parallel steps of all agents.

    The observation is every agent's flattened observation (the last one it
    got; zeros before its first) followed by a mask of the agents that act
    at this step. The action holds every agent's flattened action; agents
    that do not act are ignored. The reward is the team's (the sum over
    agents); ``env_infos`` carry each agent's reward, end flags and step
    count (:data:`REWARDS`, ...), which :func:`split_joint_batch` uses. The
    episode ends when no agent is left.

    Args:
        env: A PettingZoo Parallel or AEC env.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's own attribute)

    def __init__(self, env: Any) -> None:
        self.agent_env = AgentEnv(env)
        if not self.agent_env.multi_agent:
            raise ConfigError(
                f"a multi-agent env creator must return a PettingZoo env, got {type(env).__name__}"
            )
        self.layout = JointLayout.of(self.agent_env)
        self.observation_space, self.action_space = self.layout.joint_spaces()
        self._size = int(self.observation_space.shape[0])
        self._observation = np.zeros(self._size, np.float64)
        self._steps = np.zeros(len(self.layout.agents), np.int64)
        self._observed = np.zeros(len(self.layout.agents), bool)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets the PettingZoo env with ``seed``."""
        super().reset(seed=seed)  # gymnasium's contract; the PettingZoo env draws its own
        observations, _ = self.agent_env.reset(seed)
        self._observation = np.zeros(self._size, np.float64)
        self._steps[:] = 0
        self._observed[:] = False
        self._write(observations)
        return self._observation.copy(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One parallel step of the agents that act."""
        layout = self.layout
        mask = self._observation[layout.mask_start :] > 0.5
        joint = np.asarray(action, dtype=np.float64)
        actions = {
            agent: layout.agent_action(joint, i) for i, agent in enumerate(layout.agents) if mask[i]
        }
        observations, rewards, terms, truncs, agent_infos = self.agent_env.step(actions)
        info: dict[str, Any] = {
            REWARDS: np.array([float(rewards.get(a, 0.0)) for a in layout.agents]),
            TERMINATED: np.array([bool(terms.get(a, False)) for a in layout.agents]),
            TRUNCATED: np.array([bool(truncs.get(a, False)) for a in layout.agents]),
        }
        self._steps += mask
        info[AGENT_STEPS] = self._steps.copy()
        for agent, values in agent_infos.items():
            for key, value in (values or {}).items():
                info[f"{AGENT_INFO}{agent}/{key}"] = value
        self._write(observations)
        done = not self.agent_env.live_agents()
        terminated = done and bool(info[TERMINATED][mask].any())
        truncated = done and not terminated
        return self._observation.copy(), float(info[REWARDS].sum()), terminated, truncated, info

    def close(self) -> None:
        """Closes the PettingZoo env."""
        self.agent_env.close()

    def _write(self, observations: Mapping[str, np.ndarray]) -> None:
        layout = self.layout
        for i, agent in enumerate(layout.agents):
            if agent in observations:
                start, stop = layout.observation_slices[i]
                self._observation[start:stop] = np.asarray(
                    gym.spaces.flatten(layout.observation_spaces[i], observations[agent])
                )
                self._observed[i] = True
        # As a local RolloutWorker: an agent acts while the env lists it and it has an observation.
        live = set(self.agent_env.live_agents())
        self._observation[layout.mask_start :] = [
            agent in live and self._observed[i] for i, agent in enumerate(layout.agents)
        ]
