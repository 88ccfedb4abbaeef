"""Multi-agent envs on the fleet: one joint gymnasium env and one joint policy per episode.

A fleet worker runs episodes of one gymnasium env with one policy, and every
guarantee of the fleet (per-episode seeds, batches independent of the
number of workers, nothing lost or doubled when a worker dies) is about
those episodes. So a PettingZoo env reaches the fleet as a
:class:`MultiAgentJointEnv`: one step of it is one parallel step of all
agents, its observation concatenates every agent's (flattened) observation
and an "acts" mask, its action every agent's flattened action.
:class:`MultiAgentJointPolicy` holds one policy per policy id and asks each,
in one batched call, for the actions of the agents mapped to it.
:func:`split_joint_batch` turns the fleet's joint batch back into one
``EpisodeBatch`` per policy id, exactly as a local RolloutWorker builds them.

Nothing but names and data travel: the env is a name registered by the
worker's ``--import`` module (:func:`register_multi_agent_env`, an id in the
``multi-agent/`` namespace), the policy the import path
:data:`JOINT_POLICY_PATH` (workers started with ``--import rlfleet.rllib``)
whose sub-policies must be built-ins, and parameters are named
``<policy id>/<parameter>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet._multi_agent import MULTI_AGENT_NAMESPACE
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.multi_agent_batch import MultiAgentEpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.errors import ConfigError, InvalidBatchError, PolicyError
from rlfleet.policies import Policy, PolicySpec, make_policy
from rlfleet.policies._distributions import row_generators
from rlfleet.policies.base import AgentInfos, ParamDict
from rlfleet.rllib._collector import ROLLOUT_INFO_KEYS
from rlfleet.rllib._envs import AgentEnv
from rlfleet.worker._episode_buffer import Segment, build_batch

#: The import path fleet workers build the joint policy by.
JOINT_POLICY_PATH = "rlfleet.rllib.multi_agent:MultiAgentJointPolicy"
#: env_infos of a joint batch (each (S, n_agents)): per-agent rewards, end flags, step counts.
REWARDS, TERMINATED, TRUNCATED, AGENT_STEPS = (
    "ma.rewards",
    "ma.terminated",
    "ma.truncated",
    "ma.steps",
)
#: Prefix of an agent's own env info in a joint step's info: ``ma.info/<agent>/<key>``.
AGENT_INFO = "ma.info/"
#: Separator of policy id and parameter name in a joint policy's parameters.
SEPARATOR = "/"

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

    @property
    def observation_slices(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each agent's flattened observation."""
        return self._offsets(self.observation_spaces)

    @property
    def action_slices(self) -> list[tuple[int, int]]:
        """``(start, stop)`` of each agent's flattened action."""
        return self._offsets(self.action_spaces)

    @property
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


class MultiAgentJointPolicy(Policy):
    """One policy per policy id acting for the agents of a :class:`MultiAgentJointEnv`.

    For each policy (in id order), the acting agents mapped to it, row by row
    and in ``possible_agents`` order within a row, get their actions in one
    batched call; row ``b``'s agents draw from ``rngs[b]``, the episode's
    generator. That is the order a local RolloutWorker draws in, so an
    episode gets the same actions on the fleet and locally. Agents that do
    not act get zeros, and agent_infos ``"<agent>/<key>"`` zeros there.

    Args:
        env_spec: The joint env's spaces.
        env: The multi-agent env id (its registered creator gives the agents' spaces).
        env_kwargs: The env's kwargs.
        mapping: Agent id -> policy id, for every agent.
        policies: Policy id -> ``{"name": built-in name, "kwargs": {...}}``.
            Import paths are refused: the worker's allow-list covers this
            class, not what its parameters name.
        seed: Seeds the policies' own generators.

    Raises:
        ConfigError: If an agent is unmapped, maps to an unknown policy,
            agents of one policy have different spaces, or a spec is not built-in.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        *,
        env: str,
        env_kwargs: Mapping[str, Any] | None = None,
        mapping: Mapping[str, str],
        policies: Mapping[str, Mapping[str, Any]],
        seed: int | None = None,
    ) -> None:
        super().__init__(env_spec, seed=seed)
        probe = AgentEnv(make_agent_env(env, env_kwargs))
        try:
            self.layout = JointLayout.of(probe)
        finally:
            probe.close()
        layout = self.layout
        if (env_spec.observation_space, env_spec.action_space) != layout.joint_spaces():
            raise ConfigError(
                f"MultiAgentJointPolicy for {env!r}: the env's spaces are not those of the joint "
                "env the worker runs; build both from the same env id and kwargs"
            )
        unmapped = [a for a in layout.agents if a not in mapping]
        if unmapped:
            raise ConfigError(f"MultiAgentJointPolicy: agents {unmapped} map to no policy")
        self.mapping = {a: str(mapping[a]) for a in layout.agents}
        self.policies: dict[str, Policy] = {}
        self._members: dict[str, list[int]] = {}
        for policy_id in sorted(set(self.mapping.values())):
            if policy_id not in policies:
                raise ConfigError(
                    f"MultiAgentJointPolicy: agents map to policy {policy_id!r}, which is not one "
                    f"of {sorted(policies)}"
                )
            members = [i for i, a in enumerate(layout.agents) if self.mapping[a] == policy_id]
            spaces = {
                (repr(layout.observation_spaces[i]), repr(layout.action_spaces[i])) for i in members
            }
            if len(spaces) != 1:
                raise ConfigError(
                    f"MultiAgentJointPolicy: the agents of policy {policy_id!r} have different "
                    f"spaces {sorted(spaces)}; map them to different policies"
                )
            i = members[0]
            spec = policies[policy_id]
            sub_spec = PolicySpec(str(spec.get("name", "")), dict(spec.get("kwargs", {})))
            self.policies[policy_id] = make_policy(
                sub_spec,
                EnvSpec(layout.observation_spaces[i], layout.action_spaces[i]),
                seed=seed,
                allowed_modules=(),
            )
            self._members[policy_id] = members
        self._info_shapes = self._probe_infos()

    def _probe_infos(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        # Every call must return the same agent_info keys, even when no agent of
        # a policy acts: learn each policy's keys, shapes and dtypes once.
        shapes = {}
        for policy_id, members in self._members.items():
            # A sample of the probe env's space: only the infos' shapes are kept.
            first = np.asarray(self.layout.observation_spaces[members[0]].sample())
            _, infos = self.policies[policy_id].get_actions(first[None], [np.random.default_rng(0)])
            for key, value in infos.items():
                for i in members:
                    shapes[f"{self.layout.agents[i]}/{key}"] = (value.shape[1:], value.dtype)
        return shapes

    def get_actions(
        self, observations: Any, rngs: Sequence[np.random.Generator] | None = None
    ) -> tuple[np.ndarray, AgentInfos]:
        """Joint actions for joint observations (see the class docstring)."""
        joint = np.asarray(observations, dtype=np.float64)
        n = len(joint)
        rows = row_generators(rngs, n, self.rng, type(self).__name__)
        layout = self.layout
        acts = joint[:, layout.mask_start :] > 0.5
        out = np.zeros((n, layout.action_slices[-1][1]), np.float64)
        infos: AgentInfos = {
            key: np.zeros((n, *shape), dtype) for key, (shape, dtype) in self._info_shapes.items()
        }
        slices = layout.action_slices
        for policy_id, members in self._members.items():
            chosen = [(b, i) for b in range(n) for i in members if acts[b, i]]
            if not chosen:
                continue
            batch = np.stack([layout.agent_observation(joint[b], i) for b, i in chosen])
            actions, agent_infos = self.policies[policy_id].get_actions(
                batch, [rows[b] for b, _ in chosen]
            )
            for k, (b, i) in enumerate(chosen):
                start, stop = slices[i]
                out[b, start:stop] = np.asarray(
                    gym.spaces.flatten(layout.action_spaces[i], actions[k])
                )
                for key, value in agent_infos.items():
                    infos[f"{layout.agents[i]}/{key}"][b] = value[k]
        return out, infos

    def get_param_values(self) -> ParamDict:
        """Every policy's parameters as ``"<policy id>/<name>"``."""
        return {
            f"{policy_id}{SEPARATOR}{name}": value
            for policy_id, policy in self.policies.items()
            for name, value in policy.get_param_values().items()
        }

    def set_param_values(self, params: Mapping[str, np.ndarray]) -> None:
        """Sets the parameters of the policies named (each policy's whole set).

        Raises:
            PolicyError: For a name of no policy, or a policy's incomplete set;
                nothing is changed then.
        """
        grouped: dict[str, dict[str, np.ndarray]] = {}
        for key, value in params.items():
            policy_id, _, name = key.partition(SEPARATOR)
            if policy_id not in self.policies or not name:
                raise PolicyError(
                    f"MultiAgentJointPolicy: parameter {key!r} names no policy of "
                    f"{sorted(self.policies)}; names are '<policy id>/<parameter>'"
                )
            grouped.setdefault(policy_id, {})[name] = value
        previous = {pid: self.policies[pid].get_param_values() for pid in grouped}
        try:
            for policy_id, values in grouped.items():
                self.policies[policy_id].set_param_values(values)
        except PolicyError:
            for policy_id, values in previous.items():
                self.policies[policy_id].set_param_values(values)
            raise


def joint_policy_spec(
    env_id: str,
    env_kwargs: Mapping[str, Any],
    mapping: Mapping[str, str],
    policies: Mapping[str, PolicySpec],
) -> PolicySpec:
    """The spec fleet workers build a :class:`MultiAgentJointPolicy` from."""
    return PolicySpec(
        JOINT_POLICY_PATH,
        {
            "env": env_id,
            "env_kwargs": dict(env_kwargs),
            "mapping": dict(mapping),
            "policies": {
                pid: {"name": spec.name, "kwargs": dict(spec.kwargs)}
                for pid, spec in policies.items()
            },
        },
    )


def split_joint_batch(
    joint: EpisodeBatch,
    layout: JointLayout,
    mapping: Mapping[str, str],
    env_specs: Mapping[str, EnvSpec],
) -> MultiAgentEpisodeBatch:
    """One EpisodeBatch per policy from a fleet batch of a :class:`MultiAgentJointEnv`.

    Each row of a policy's batch is one agent's trajectory within one row
    (episode or fragment) of ``joint``, in joint-row then
    ``possible_agents`` order, with the step types, rewards and last
    observations a local RolloutWorker gives it. ``episode_infos`` carry
    ``agent_id``, ``env_episode`` (``stream << 32 | episode`` for fragments),
    ``fragment``, ``env_index`` (the stream, -1 for whole episodes) and the
    joint row's own labels (``worker``, ``agent_version``, seeds).

    Args:
        joint: The fleet's batch.
        layout: The joint env's layout.
        mapping: Agent id -> policy id.
        env_specs: Policy id -> the spaces its batch is in.
    """
    infos = joint.episode_infos
    labels = [k for k in ("worker", "agent_version", "env_seed", "policy_seed") if k in infos]
    keys = (*ROLLOUT_INFO_KEYS, *labels)
    starts = np.concatenate([[0], np.cumsum(joint.lengths)[:-1]]).astype(np.int64)
    segments: dict[str, list[tuple[str, Segment]]] = {}
    for row in range(joint.n_episodes):
        try:
            _split_row(
                joint,
                row,
                start=int(starts[row]),
                layout=layout,
                mapping=mapping,
                env_specs=env_specs,
                labels=labels,
                segments=segments,
            )
        except ValueError as exc:  # gymnasium's unflatten: not a valid one-hot, ...
            raise InvalidBatchError(
                f"row {row} of a joint multi-agent batch does not fit the layout of "
                f"{list(layout.agents)}: {exc}"
            ) from exc
    batches = {}
    for policy_id, members in segments.items():
        batch = build_batch(env_specs[policy_id], [s for _, s in members], keys)
        batches[policy_id] = dataclasses.replace(
            batch,
            episode_infos={
                **batch.episode_infos,
                "agent_id": np.array([agent for agent, _ in members]),
            },
        )
    return MultiAgentEpisodeBatch(batches, int(joint.lengths.sum()))


def _split_row(
    joint: EpisodeBatch,
    row: int,
    *,
    start: int,
    layout: JointLayout,
    mapping: Mapping[str, str],
    env_specs: Mapping[str, EnvSpec],
    labels: Sequence[str],
    segments: dict[str, list[tuple[str, Segment]]],
) -> None:
    """Appends row ``row``'s agent trajectories to ``segments``, by policy id."""
    infos, env_infos = joint.episode_infos, joint.env_infos
    fragments = "stream" in infos
    length = int(joint.lengths[row])
    stop = start + length
    observations = joint.observations[start:stop]
    acts = observations[:, layout.mask_start :] > 0.5
    following = np.concatenate([observations[1:], joint.last_observations[row][None]])
    joint_end = int(joint.step_types[stop - 1])
    episode = int(infos["episode_index"][row])
    stream = int(infos["stream"][row]) if fragments else -1
    fragment = int(infos["fragment_index"][row]) if fragments else 0
    row_labels = tuple(int(infos[k][row]) for k in labels)
    for i, agent in enumerate(layout.agents):
        steps = np.flatnonzero(acts[:, i])
        if not len(steps):
            continue
        last = int(steps[-1])
        rows = start + steps
        terminated = bool(env_infos[TERMINATED][start + last, i])
        truncated = bool(env_infos[TRUNCATED][start + last, i])
        ended = last == length - 1 and joint_end in (StepType.TERMINAL, StepType.TIMEOUT)
        kind: int | None = None
        if terminated:
            kind = int(StepType.TERMINAL)
        elif truncated or ended:
            kind = int(StepType.TIMEOUT)
        policy_id = mapping[agent]
        prefix = f"{AGENT_INFO}{agent}/"
        segments.setdefault(policy_id, []).append(
            (
                agent,
                Segment(
                    key=(row, i),
                    infos=(
                        (stream << 32) | episode if fragments else episode,
                        fragment,
                        stream,
                        *row_labels,
                    ),
                    observations=np.stack(
                        [layout.agent_observation(o, i) for o in observations[steps]]
                    ),
                    last_observation=layout.agent_observation(following[last], i),
                    actions=np.stack([layout.agent_action(a, i) for a in joint.actions[rows]]),
                    rewards=np.asarray(env_infos[REWARDS][rows, i], dtype=np.float64),
                    agent_infos={
                        key[len(agent) + 1 :]: value[rows]
                        for key, value in joint.agent_infos.items()
                        if key.startswith(agent + "/")
                    },
                    env_infos={
                        key[len(prefix) :]: value[rows]
                        for key, value in env_infos.items()
                        if key.startswith(prefix)
                    },
                    first=int(env_infos[AGENT_STEPS][rows[0], i]) == 1,
                    last=kind,
                    env_spec=env_specs[policy_id],
                ),
            )
        )
