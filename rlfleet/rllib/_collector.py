"""The sampling loop of a RolloutWorker: envs stepped together, one policy call per policy.

Each tick steps every env once. The live agents of all envs are grouped by
the policy they are bound to, and each policy computes their actions in one
batched call. Agent trajectories are cut into :class:`Segment` records and
turned into EpisodeBatches by the worker engine's own ``build_batch``.

Seeding follows the fleet's fragment streams (docs/architecture.md, Determinism): env
slot ``i`` is stream ``i``, and its k-th episode resets the env with the
seeds :func:`rlfleet.core.seeding.stream_seeds` derives from ``(seed, i, k)`` and
draws its actions from its own generator. So an episode's data depends on
its seeds only, never on which slots run beside it: the same worker
settings give the batches a fleet gives (tests/test_rllib_multi_agent_fleet.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.seeding import stream_seeds
from rlfleet.core.step_type import StepType, step_type_from_gym
from rlfleet.errors import ConfigError, EnvError
from rlfleet.rllib._envs import AgentEnv
from rlfleet.rllib._policies import PolicyEntry
from rlfleet.rllib.callbacks import DefaultCallbacks, Episode, RolloutMetrics
from rlfleet.worker._episode_buffer import Segment, build_batch, stack_step_infos

if TYPE_CHECKING:
    from rlfleet.rllib.rollout_worker import EnvContext

#: episode_infos of every batch a RolloutWorker returns, in this order.
ROLLOUT_INFO_KEYS = ("env_episode", "fragment", "env_index")


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling and processing arguments of a RolloutWorker: the one object
    its collector and a RolloutWorkerGroup read them from."""

    rollout_fragment_length: int
    batch_mode: str
    count_steps_by: str
    episode_horizon: int | None
    soft_horizon: bool
    no_done_at_end: bool
    clip_rewards: bool | float | None
    normalize_actions: bool
    clip_actions: bool
    observation_filter: str
    worker_index: int

    @classmethod
    def of(cls, worker_args: Mapping[str, Any]) -> SamplingSettings:
        """The settings among a RolloutWorker's keyword arguments (by name)."""
        return cls(**{f.name: worker_args[f.name] for f in fields(cls)})


@dataclass
class _Trajectory:
    agent_id: str
    policy_id: str
    episode_id: int
    env_index: int
    fragment: int
    first: bool
    #: Sort key: (stream, episode in stream, fragment, agent position).
    order: tuple[int, int, int, int]
    observations: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    agent_infos: list[dict[str, np.ndarray]] = field(default_factory=list)
    env_infos: list[Mapping[str, Any]] = field(default_factory=list)
    last: int | None = None
    last_observation: np.ndarray | None = None


@dataclass
class EnvSlot:
    """One env of the worker and the episode running in it.

    Attributes:
        stream: The slot's fragment stream (its episodes' seeds).
        base_seed: The worker's base seed.
        episodes: Episodes begun in the slot.
        rng: The running episode's action generator.
    """

    index: int
    env: AgentEnv
    context: EnvContext
    stream: int
    base_seed: int
    episodes: int = 0
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    episode: Episode | None = None
    observations: dict[str, np.ndarray] = field(default_factory=dict)
    live: dict[str, _Trajectory] = field(default_factory=dict)
    agent_steps: dict[str, int] = field(default_factory=dict)
    held: list[_Trajectory] = field(default_factory=list)


class RolloutCollector:
    """Steps a worker's envs and assembles what they produce.

    Args:
        slots: The envs.
        settings: How to sample.
        entries: Returns the worker's current policies by id.
        map_agent: ``(agent_id, episode) -> policy_id``.
        callbacks: The worker's callbacks.
        worker: The worker, handed to callbacks.
    """

    def __init__(
        self,
        slots: list[EnvSlot],
        settings: SamplingSettings,
        *,
        entries: Callable[[], Mapping[str, PolicyEntry]],
        map_agent: Callable[[str, Episode], str],
        callbacks: DefaultCallbacks,
        worker: Any,
    ) -> None:
        self.slots = slots
        self.settings = settings
        self._entries = entries
        self._map_agent = map_agent
        self._callbacks = callbacks
        self._worker = worker
        self._done_metrics: list[RolloutMetrics] = []
        self._ready: list[_Trajectory] = []
        self._ready_env_steps = 0

    def take_metrics(self) -> list[RolloutMetrics]:
        """The metrics of episodes finished since the last call."""
        metrics, self._done_metrics = self._done_metrics, []
        return metrics

    def collect(self) -> tuple[dict[str, EpisodeBatch], int, int]:
        """Samples one batch's worth of trajectories.

        Returns:
            ``(policy_id -> EpisodeBatch, env_steps, agent_steps)``.
        """
        s = self.settings
        target = s.rollout_fragment_length * len(self.slots)
        env_steps = agent_steps = 0
        if s.batch_mode == "truncate_episodes":
            while (env_steps if s.count_steps_by == "env_steps" else agent_steps) < target:
                stepped_envs, stepped_agents = self._tick()
                env_steps += stepped_envs
                agent_steps += stepped_agents
            for slot in self.slots:
                self._cut(slot)
                self._ready.extend(slot.held)
                slot.held = []
            self._ready_env_steps = env_steps
        else:
            while True:
                ready_agent_steps = sum(len(t.rewards) for t in self._ready)
                done = (
                    self._ready_env_steps if s.count_steps_by == "env_steps" else ready_agent_steps
                )
                if done >= target:
                    break
                self._tick()
            env_steps = self._ready_env_steps
        trajectories, self._ready, self._ready_env_steps = self._ready, [], 0
        agent_steps = sum(len(t.rewards) for t in trajectories)
        return self._batches(trajectories), env_steps, agent_steps

    # ---------------------------------------------------------------- ticks

    def _tick(self) -> tuple[int, int]:
        for slot in self.slots:
            if slot.episode is None:
                self._reset(slot)
        entries = self._entries()
        rows: dict[str, list[tuple[EnvSlot, str]]] = {}
        for slot in self.slots:
            for agent in slot.env.ordered(slot.env.live_agents()):
                if agent in slot.observations:
                    rows.setdefault(slot.live[agent].policy_id, []).append((slot, agent))
        chosen: dict[tuple[int, str], tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        # Policies in id order, agents in possible_agents order: each episode's
        # generator is drawn from in an order that depends on the episode alone.
        for policy_id in sorted(rows):
            members = rows[policy_id]
            observations = np.stack([slot.observations[agent] for slot, agent in members])
            actions, infos = entries[policy_id].policy.get_actions(
                observations, [slot.rng for slot, _ in members]
            )
            for i, (slot, agent) in enumerate(members):
                chosen[(slot.index, agent)] = (actions[i], {k: v[i] for k, v in infos.items()})
        agent_steps = 0
        for slot in self.slots:
            mine = {
                agent: chosen[(slot.index, agent)]
                for agent in slot.live
                if (slot.index, agent) in chosen
            }
            if not mine:
                continue
            agent_steps += len(mine)
            self._step(slot, mine, entries)
        return len(self.slots), agent_steps

    def _reset(self, slot: EnvSlot) -> None:
        env_seed, _ = stream_seeds(slot.base_seed, slot.stream, slot.episodes)
        try:
            observations, _ = slot.env.reset(env_seed)
        except Exception as exc:
            raise EnvError(
                f"env {slot.index} of RolloutWorker {self.settings.worker_index} raised in "
                f"reset: {type(exc).__name__}: {exc}",
                env_index=slot.index,
            ) from exc
        self._begin_episode(slot, observations)

    def _begin_episode(
        self, slot: EnvSlot, observations: Mapping[str, np.ndarray], *, filtered: bool = False
    ) -> None:
        # Unique per worker and the fleet's label of the same episode (stream, k).
        episode_id = (slot.stream << 32) | slot.episodes
        _, policy_seed = stream_seeds(slot.base_seed, slot.stream, slot.episodes)
        slot.rng = np.random.default_rng(policy_seed)
        slot.episodes += 1
        slot.episode = Episode(episode_id, slot.index)
        slot.observations, slot.live, slot.agent_steps = {}, {}, {}
        for agent, observation in observations.items():
            self._add_agent(slot, agent, observation, filtered=filtered)
        self._callbacks.on_episode_start(
            worker=self._worker, env=slot.env.env, episode=slot.episode, env_index=slot.index
        )

    def _add_agent(
        self, slot: EnvSlot, agent: str, observation: np.ndarray, *, filtered: bool = False
    ) -> None:
        assert slot.episode is not None  # an episode runs whenever agents are added
        policy_id = slot.episode.policy_for_agent.get(agent)
        if policy_id is None:
            policy_id = self._map_agent(agent, slot.episode)
            if policy_id not in self._entries():
                raise ConfigError(
                    f"policy_mapping_fn mapped agent {agent!r} (env {slot.index}, episode "
                    f"{slot.episode.episode_id}) to {policy_id!r}, which is not one of the "
                    f"worker's policies {sorted(self._entries())}"
                )
            slot.episode.policy_for_agent[agent] = policy_id
        slot.observations[agent] = (
            observation if filtered else self._filtered(policy_id, observation)
        )
        slot.live[agent] = _Trajectory(
            agent,
            policy_id,
            slot.episode.episode_id,
            slot.index,
            0,
            True,
            (slot.stream, slot.episodes - 1, 0, slot.env.position(agent)),
        )
        slot.agent_steps.setdefault(agent, 0)

    def _filtered(self, policy_id: str, raw: np.ndarray) -> np.ndarray:
        filtered: np.ndarray = self._entries()[policy_id].obs_filter(raw[None])[0]
        return filtered

    def _step(
        self,
        slot: EnvSlot,
        chosen: Mapping[str, tuple[np.ndarray, dict[str, np.ndarray]]],
        entries: Mapping[str, PolicyEntry],
    ) -> None:
        env_actions = {
            agent: self._env_action(slot.env.action_space(agent), action)
            for agent, (action, _) in chosen.items()
        }
        try:
            observations, rewards, terms, truncs, infos = slot.env.step(env_actions)
        except Exception as exc:
            episode = slot.episode
            raise EnvError(
                f"env {slot.index} of RolloutWorker {self.settings.worker_index} raised in step "
                f"{episode.length + 1 if episode else 0}: {type(exc).__name__}: {exc}",
                env_index=slot.index,
            ) from exc
        episode = slot.episode
        assert episode is not None  # _tick resets every slot before stepping it
        episode.length += 1
        horizon_hit = (
            self.settings.episode_horizon is not None
            and episode.length >= self.settings.episode_horizon
        )
        for agent, (action, agent_info) in chosen.items():
            trajectory = slot.live[agent]
            raw_reward = float(rewards.get(agent, 0.0))
            episode.total_reward += raw_reward
            key = (agent, trajectory.policy_id)
            episode.agent_rewards[key] = episode.agent_rewards.get(key, 0.0) + raw_reward
            trajectory.observations.append(slot.observations[agent])
            trajectory.actions.append(action)
            trajectory.rewards.append(self._clipped(raw_reward))
            trajectory.agent_infos.append(agent_info)
            trajectory.env_infos.append(infos.get(agent, {}))
            slot.agent_steps[agent] += 1
            if agent in observations:
                slot.observations[agent] = self._filtered(trajectory.policy_id, observations[agent])
            terminated, truncated = bool(terms.get(agent)), bool(truncs.get(agent))
            if self.settings.no_done_at_end and terminated:
                terminated, truncated = False, True
            env_done = terminated or truncated
            if env_done or horizon_hit:
                kind = step_type_from_gym(
                    slot.agent_steps[agent], None, terminated, truncated or horizon_hit
                )
                # Only an agent the env did not end can go on past a soft horizon.
                carry = self.settings.soft_horizon and not env_done
                self._finish(slot, agent, kind, carry=carry)
        for agent, observation in observations.items():
            if agent not in slot.live and agent not in slot.agent_steps:
                self._add_agent(slot, agent, observation)
        self._callbacks.on_episode_step(
            worker=self._worker, env=slot.env.env, episode=episode, env_index=slot.index
        )
        if not slot.live:
            self._end_episode(slot)
            if slot.observations:  # agents carried past a soft horizon
                carried, slot.observations = slot.observations, {}
                self._begin_episode(slot, carried, filtered=True)

    def _finish(self, slot: EnvSlot, agent: str, kind: StepType, *, carry: bool) -> None:
        trajectory = slot.live.pop(agent)
        trajectory.last = int(kind)
        trajectory.last_observation = slot.observations[agent]
        slot.held.append(trajectory)
        if not carry:
            slot.observations.pop(agent, None)
        # else the agent goes on into the next episode from this observation

    def _end_episode(self, slot: EnvSlot) -> None:
        episode = slot.episode
        assert episode is not None
        self._callbacks.on_episode_end(
            worker=self._worker, env=slot.env.env, episode=episode, env_index=slot.index
        )
        self._done_metrics.append(
            RolloutMetrics(
                episode_length=episode.length,
                episode_reward=episode.total_reward,
                agent_rewards=dict(episode.agent_rewards),
                custom_metrics=dict(episode.custom_metrics),
                hist_data={k: list(v) for k, v in episode.hist_data.items()},
                episode_id=episode.episode_id,
                worker_index=self.settings.worker_index,
            )
        )
        if self.settings.batch_mode == "complete_episodes":
            self._ready.extend(slot.held)
            slot.held = []
            self._ready_env_steps += episode.length
        slot.episode = None

    def _cut(self, slot: EnvSlot) -> None:
        """Ends every live trajectory of the slot at a fragment boundary (MID)."""
        for agent, trajectory in list(slot.live.items()):
            if not trajectory.rewards:
                continue
            trajectory.last_observation = slot.observations[agent]
            slot.held.append(trajectory)
            stream, episode, fragment, position = trajectory.order
            slot.live[agent] = _Trajectory(
                agent,
                trajectory.policy_id,
                trajectory.episode_id,
                slot.index,
                trajectory.fragment + 1,
                False,
                (stream, episode, fragment + 1, position),
            )

    # -------------------------------------------------------------- helpers

    def _env_action(self, space: gym.Space, action: np.ndarray) -> Any:
        s = self.settings
        if not (isinstance(space, gym.spaces.Box) and space.dtype.kind == "f"):
            return action
        bounded = bool(np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)))
        if s.normalize_actions and bounded:
            # The policy acts in [-1, 1]; the env gets the same point of its own bounds.
            unit = np.clip(action, -1.0, 1.0)
            return (space.low + (unit + 1.0) * (space.high - space.low) / 2.0).astype(space.dtype)
        if s.clip_actions:
            return np.clip(action, space.low, space.high).astype(space.dtype)
        return action

    def _clipped(self, reward: float) -> float:
        return float(clipped_rewards(np.asarray(reward), self.settings.clip_rewards))

    def _batches(self, trajectories: list[_Trajectory]) -> dict[str, EpisodeBatch]:
        entries = self._entries()
        per_policy: dict[str, list[_Trajectory]] = {}
        # Rows in (stream, episode, fragment, agent) order, as the fleet's batches.
        for trajectory in sorted(trajectories, key=lambda t: t.order):
            per_policy.setdefault(trajectory.policy_id, []).append(trajectory)
        batches = {}
        for policy_id, group in per_policy.items():
            env_spec = entries[policy_id].env_spec
            segments = [
                Segment(
                    key=(t.episode_id, t.fragment),
                    infos=(t.episode_id, t.fragment, t.env_index),
                    observations=np.stack(t.observations),
                    last_observation=np.asarray(t.last_observation),
                    actions=np.stack(t.actions),
                    rewards=np.asarray(t.rewards, dtype=np.float64),
                    agent_infos={
                        k: np.stack([i[k] for i in t.agent_infos]) for k in t.agent_infos[0]
                    },
                    env_infos=stack_step_infos(t.env_infos, f"{t.agent_id}"),
                    first=t.first,
                    last=t.last,
                    env_spec=env_spec,
                )
                for t in group
            ]
            batch = build_batch(env_spec, segments, ROLLOUT_INFO_KEYS)
            agent_ids = np.array([t.agent_id for t in group])
            batches[policy_id] = batch.with_episode_infos(agent_id=agent_ids)
        return batches


def clipped_rewards(rewards: np.ndarray, clip: bool | float | None) -> np.ndarray:
    """Applies ``clip_rewards``: True clips to [-1, 1], a float c to [-c, c], None/False not."""
    if clip is None or clip is False:
        return rewards
    bound = 1.0 if clip is True else float(clip)
    return np.clip(rewards, -bound, bound)
