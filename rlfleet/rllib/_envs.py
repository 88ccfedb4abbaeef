"""One shape for every env a RolloutWorker runs: PettingZoo's Parallel API.

A gymnasium env becomes a one-agent parallel env (agent id ``"agent0"``); a
PettingZoo AEC env goes through PettingZoo's own ``aec_to_parallel``.
Composite observation spaces (Dict, Tuple) are flattened with
``gymnasium.spaces.flatten``, as EpisodeBatch requires.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.errors import ConfigError

#: The agent id of a single-agent (gymnasium) env.
SINGLE_AGENT_ID = "agent0"

_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def is_multi_agent(env: Any) -> bool:
    """True for PettingZoo envs (Parallel or AEC)."""
    return hasattr(env, "possible_agents")


class AgentEnv:
    """A parallel-API view of one env, with flattened observations.

    Args:
        env: A gymnasium env, a PettingZoo ParallelEnv or a PettingZoo AECEnv.

    Attributes:
        env: What the user's ``foreach_env`` functions see: the gymnasium env,
            the ParallelEnv, or the AEC env's parallel conversion.
    """

    def __init__(self, env: Any) -> None:
        self.multi_agent = is_multi_agent(env)
        if self.multi_agent and hasattr(env, "agent_iter"):
            from pettingzoo.utils.conversions import aec_to_parallel

            if not env.metadata.get("is_parallelizable", False):
                raise ConfigError(
                    f"PettingZoo AEC env {env.metadata.get('name', type(env).__name__)!r} is not "
                    "parallelizable (its metadata lacks is_parallelizable=True, as turn-based "
                    "games do), so PettingZoo's aec_to_parallel cannot serve it"
                )
            env = aec_to_parallel(env)
        elif not self.multi_agent and not isinstance(env, gym.Env):
            raise ConfigError(
                "env_creator must return a gymnasium.Env or a PettingZoo env (Parallel or "
                f"AEC), got {type(env).__name__}"
            )
        self.env = env
        self.agents_seen: list[str] = (
            list(env.possible_agents) if self.multi_agent else [SINGLE_AGENT_ID]
        )

    def raw_observation_space(self, agent: str) -> gym.Space:
        """The env's own observation space of an agent."""
        space: gym.Space = (
            self.env.observation_space(agent) if self.multi_agent else self.env.observation_space
        )
        return space

    def observation_space(self, agent: str) -> gym.Space:
        """The observation space policies see (composite spaces flattened)."""
        space = self.raw_observation_space(agent)
        return space if isinstance(space, _ARRAY_SPACES) else gym.spaces.flatten_space(space)

    def action_space(self, agent: str) -> gym.Space:
        """An agent's action space."""
        space: gym.Space = (
            self.env.action_space(agent) if self.multi_agent else self.env.action_space
        )
        return space

    def reset(self, seed: int | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Resets; returns observations and infos keyed by agent."""
        observations, infos = self.env.reset(seed=seed)
        if not self.multi_agent:
            observations, infos = {SINGLE_AGENT_ID: observations}, {SINGLE_AGENT_ID: infos}
        return self._flat(observations), dict(infos)

    def position(self, agent: str) -> int:
        """The agent's index in ``possible_agents`` (agents added later come after)."""
        if agent not in self.agents_seen:
            self.agents_seen.append(agent)
        return self.agents_seen.index(agent)

    def ordered(self, agents: list[str]) -> list[str]:
        """``agents`` in ``possible_agents`` order."""
        return sorted(agents, key=self.position)

    def live_agents(self) -> list[str]:
        """The agents that act at the next step."""
        return list(self.env.agents) if self.multi_agent else [SINGLE_AGENT_ID]

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, bool], dict[str, bool], dict]:
        """Steps; returns observations, rewards, terminations, truncations, infos."""
        if self.multi_agent:
            obs, rewards, terms, truncs, infos = self.env.step(dict(actions))
            return self._flat(obs), dict(rewards), dict(terms), dict(truncs), dict(infos)
        ob, reward, term, trunc, info = self.env.step(actions[SINGLE_AGENT_ID])
        a = SINGLE_AGENT_ID
        return self._flat({a: ob}), {a: reward}, {a: term}, {a: trunc}, {a: info}

    def close(self) -> None:
        """Closes the env."""
        self.env.close()

    def _flat(self, observations: Mapping[str, Any]) -> dict[str, np.ndarray]:
        flat: dict[str, np.ndarray] = {}
        for agent, ob in observations.items():
            space = self.raw_observation_space(agent)
            flat[agent] = (
                np.asarray(ob)
                if isinstance(space, _ARRAY_SPACES)
                else np.asarray(gym.spaces.flatten(space, ob))
            )
        return flat
