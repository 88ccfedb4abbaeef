"""RolloutWorkerGroup: RLlib's ``WorkerSet`` idea on the fleet (single- and multi-agent).

A group is a local :class:`~rlfleet.rllib.RolloutWorker` (the learner's
copy of the policy and the observation filter, RLlib's ``local_worker()``)
plus the fleet's workers, which sample::

    with RolloutWorkerGroup.local(num_workers=2, env="CartPole-v1",
                                  policy_spec=VPG(spec)) as group:
        batch = group.sample()
        group.local_worker().learn_on_batch(batch)
        group.sync_weights()

What reaches the workers is data, never code: the policy spec (built-in or
an import path installed on the workers), parameters, and the filter state
as parameters of :class:`~rlfleet.rllib.filtered_policy.FilteredPolicy`.

With a dict ``policy_spec`` the group is multi-agent: the env is a
``multi-agent/<name>`` id registered by a module the workers import
(:func:`~rlfleet.rllib.register_multi_agent_env`), workers run it as one
joint env with a :class:`~rlfleet.rllib.joint_policy.MultiAgentJointPolicy`,
and :meth:`RolloutWorkerGroup.sample` returns a ``MultiAgentEpisodeBatch``
(rlfleet/rllib/multi_agent.py says how).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable, Mapping
from types import TracebackType
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.multi_agent_batch import MultiAgentEpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.envs import EnvConfig, make_env
from rlfleet.errors import ConfigError
from rlfleet.protocol.multi_agent import is_multi_agent_env
from rlfleet.rllib._collector import clipped_rewards
from rlfleet.rllib._envs import SINGLE_AGENT_ID
from rlfleet.rllib._policies import DEFAULT_POLICY_ID
from rlfleet.rllib.callbacks import RolloutMetrics
from rlfleet.rllib.filtered_policy import FilteredPolicy
from rlfleet.rllib.filters import MeanStdFilter, NoFilter, RunningStat
from rlfleet.rllib.joint_batches import split_joint_batch
from rlfleet.rllib.joint_policy import SEPARATOR, joint_policy_spec
from rlfleet.rllib.multi_agent import REWARDS, JointLayout, make_agent_env
from rlfleet.rllib.rollout_worker import RolloutWorker
from rlfleet.rllib.sample_batch import RolloutEpisodeBatch


class UnboundEpisode:
    """The ``episode`` argument of ``policy_mapping_fn`` on the fleet: reading it is an error.

    Fleet workers map agents by a mapping fixed when the group is built, so a
    mapping that depends on the episode cannot be honoured there; this makes
    it fail loudly instead of being silently asked once.
    """

    def __getattr__(self, name: str) -> Any:
        raise ConfigError(
            f"policy_mapping_fn read episode.{name}: on the fleet an agent's policy is fixed "
            "when the RolloutWorkerGroup is built (the workers' joint policy maps by agent id "
            "only), so a mapping may not depend on the episode. Map by agent id, or sample "
            "with a local RolloutWorker, which asks the mapping per episode"
        )


def fixed_mapping(worker: RolloutWorker, agents: Iterable[str]) -> dict[str, str]:
    """Agent id -> policy id from ``worker``'s ``policy_mapping_fn``, for every episode.

    The mapping is asked twice per agent, each time with a fresh
    :class:`UnboundEpisode`: reading the episode, or two different answers
    (e.g. a random choice), is a ConfigError.

    Raises:
        ConfigError: If the mapping depends on the episode.
    """
    mapping = {}
    for agent in agents:
        first, second = (worker._map_agent(agent, UnboundEpisode()) for _ in range(2))
        if first != second:
            raise ConfigError(
                f"policy_mapping_fn mapped agent {agent!r} to {first!r}, then to {second!r}: on "
                "the fleet an agent's policy is fixed when the RolloutWorkerGroup is built, so "
                "the mapping must give one policy per agent id. Map by agent id, or sample "
                "with a local RolloutWorker, which asks the mapping per episode"
            )
        mapping[agent] = first
    return mapping


#: The operations :meth:`RolloutWorkerGroup.foreach_worker` knows.
WORKER_OPERATIONS = ("weights", "filters", "metrics")
#: The module fleet workers must be allowed to import for filtered policies.
FLEET_IMPORT = "rlfleet.rllib"


class RolloutWorkerGroup:
    """Samples on the fleet with RolloutWorker settings; keeps the learner's copy locally.

    Args:
        sampler: The fleet's sampler. With ``observation_filter="MeanStdFilter"``
            its workers must be allowed to import ``rlfleet.rllib``
            (``--import rlfleet.rllib``; :meth:`local` does this).
        env: The fleet's env (for the local worker's copy).
        policy_spec: A PolicySpec, name or import path (acting only), a
            learner such as :class:`rlfleet.learners.VPG`, or None; or a
            dict policy id -> one of those (multi-agent: built-in policies
            only, as the workers build them).
        policy_mapping_fn: Multi-agent: ``"shared"``, ``"per-agent"``, an
            import path or a callable, as RolloutWorker's. On the fleet it is
            asked per agent id when the group is built, and the mapping it
            gives holds for every episode; a mapping that reads its
            ``episode`` argument or answers differently for the same agent
            is a ConfigError (:func:`fixed_mapping`).
        policies_to_train: Multi-agent: as RolloutWorker's (the local
            worker's ``learn_on_batch`` trains only these).
        observation_filter: ``"NoFilter"`` or ``"MeanStdFilter"``.
        rollout_fragment_length: Steps per env slot per :meth:`sample`.
        batch_mode: ``"truncate_episodes"`` (fragments; episodes go on
            across samples) or ``"complete_episodes"``.
        clip_rewards: As RolloutWorker's: True clips to [-1, 1], a float c to
            [-c, c]; metrics keep the raw rewards.
        seed: The local worker's seed (the fleet's seeds are the sampler's).

    A multi-agent env must start every agent (``possible_agents``) with the
    same kind of spaces for a policy, and its actions reach the env as the
    policies chose them: float Box actions are refused (no
    ``normalize_actions``/``clip_actions`` on the fleet yet).

    Raises:
        ConfigError: If an argument is invalid.
    """

    def __init__(
        self,
        sampler: RemoteSampler,
        *,
        env: EnvConfig | str,
        policy_spec: Any = None,
        policy_mapping_fn: Any = None,
        policies_to_train: Any = None,
        observation_filter: str = "NoFilter",
        rollout_fragment_length: int = 100,
        batch_mode: str = "truncate_episodes",
        clip_rewards: bool | float | None = None,
        seed: int | None = None,
    ) -> None:
        config = EnvConfig(env) if isinstance(env, str) else env
        self._multi_agent = isinstance(policy_spec, dict)
        if self._multi_agent != is_multi_agent_env(config.id):
            raise ConfigError(
                f"RolloutWorkerGroup: env {config.id!r} with a "
                f"{'dict' if self._multi_agent else 'single'} policy_spec; multi-agent groups "
                "take a dict of policies and a 'multi-agent/<name>' env registered with "
                "rlfleet.rllib.register_multi_agent_env, single-agent groups neither"
            )
        if self._multi_agent and observation_filter != "NoFilter":
            raise ConfigError(
                f"RolloutWorkerGroup: observation_filter {observation_filter!r} is single-agent "
                "on the fleet; multi-agent groups take 'NoFilter'"
            )
        self._sampler = sampler
        if self._multi_agent:
            config.env_spec()  # imports the module that registers the env, and builds it once
        self._local = RolloutWorker(
            env_creator=lambda ctx: (
                make_agent_env(config.id, config.kwargs) if self._multi_agent else make_env(config)
            ),
            policy_spec=policy_spec,
            policy_mapping_fn=policy_mapping_fn,
            policies_to_train=policies_to_train,
            observation_filter=observation_filter,
            rollout_fragment_length=rollout_fragment_length,
            batch_mode=batch_mode,
            clip_rewards=clip_rewards,
            seed=seed,
        )
        self._config = config
        self._layout: JointLayout | None = None
        self._mapping: dict[str, str] = {}
        self._policy_versions: dict[str, int] = {}
        self._versions_at: dict[int, dict[str, int]] = {}
        if self._multi_agent:
            self._layout = JointLayout.of(self._local._envs[0].env)
            self._mapping = fixed_mapping(self._local, self._layout.agents)
            boxes = [
                a
                for a, space in zip(self._layout.agents, self._layout.action_spaces, strict=True)
                if isinstance(space, gym.spaces.Box) and space.dtype.kind == "f"
            ]
            if boxes:
                raise ConfigError(
                    f"RolloutWorkerGroup: agents {boxes} of {config.id!r} have float Box actions, "
                    "which the fleet's multi-agent envs do not normalise or clip yet; use "
                    "discrete actions or a local RolloutWorker"
                )
        self._settings = self._local._settings
        self._filtered = self._settings.observation_filter == "MeanStdFilter"
        self._iteration = 0
        self._deltas: dict[int, RunningStat] = {}
        self._metrics: dict[int, list[RolloutMetrics]] = {}
        self._partial: dict[tuple[int, int], tuple[int, float, np.ndarray | None]] = {}
        self._fleet_filter: MeanStdFilter | NoFilter = self._local_filter().copy()
        self._fleet: Fleet | None = None
        self._push_policy()

    @classmethod
    def local(
        cls,
        num_workers: int = 2,
        *,
        env: EnvConfig | str = "CartPole-v1",
        envs_per_worker: int = 1,
        fleet_seed: int | None = None,
        **group_args: Any,
    ) -> RolloutWorkerGroup:
        """A group on a fresh ``Fleet.local`` (closed with the group).

        Args:
            num_workers: Worker processes.
            env: The env.
            envs_per_worker: Env slots per worker.
            fleet_seed: The fleet's seed (see ``Fleet.local``).
            **group_args: The other arguments of the constructor.
        """
        fleet = Fleet.local(
            workers=num_workers,
            envs_per_worker=envs_per_worker,
            env=env,
            seed=fleet_seed,
            imports=(FLEET_IMPORT,),
        )
        try:
            group = cls(fleet.sampler, env=env, **group_args)
        except BaseException:
            fleet.close()
            raise
        group._fleet = fleet
        return group

    # ------------------------------------------------------------- sampling

    def local_worker(self) -> RolloutWorker:
        """The learner's RolloutWorker: its weights and filter are the group's."""
        return self._local

    @property
    def fleet(self) -> Fleet | None:
        """The fleet :meth:`local` started, else None."""
        return self._fleet

    def sample(self) -> EpisodeBatch | MultiAgentEpisodeBatch:
        """One batch from the whole fleet: ``rollout_fragment_length`` steps per env slot.

        Observations are filtered with the state the workers' policies used
        (what they saw); each worker's filter delta and finished episodes are
        recorded for :meth:`sync_filters` and :meth:`get_metrics`. A
        multi-agent group returns a ``MultiAgentEpisodeBatch``, the one a
        local RolloutWorker with the same seed and ``num_envs`` = the
        fleet's env slots returns (tests/test_rllib_multi_agent_fleet.py).
        """
        slots = sum(w.envs for w in self._sampler.status().workers) or 1
        length = self._settings.rollout_fragment_length
        steps = length * slots
        if self._settings.batch_mode == "truncate_episodes":
            batch = self._sampler.obtain_fragments(steps, length)
        else:
            batch = self._sampler.obtain_samples(self._iteration, steps)
        self._iteration += 1
        self._record(batch)
        if self._layout is None:
            return self._processed(batch)
        entries = {pid: self._local._entry(pid) for pid in set(self._mapping.values())}
        joint = split_joint_batch(
            batch, self._layout, self._mapping, {pid: e.env_spec for pid, e in entries.items()}
        )
        return MultiAgentEpisodeBatch(
            {
                pid: self._processed(self._with_policy_version(pid, b))
                for pid, b in joint.policy_batches.items()
            },
            joint.env_steps,
        )

    # ----------------------------------------------------- weights and vars

    def sync_weights(
        self, policies: Container[str] | None = None, global_vars: Mapping[str, Any] | None = None
    ) -> None:
        """Pushes the local worker's weights to every fleet worker (one agent update).

        Args:
            policies: Policy ids to push (None: all); a single-agent group
                has one, ``default_policy``.
            global_vars: Set on the local worker (fleet workers' policies
                take no global vars).
        """
        if global_vars is not None:
            self._local.set_global_vars(global_vars)
        if self._multi_agent:
            pushed = {
                pid: values
                for pid, values in self._local.get_weights(policies).items()
                if pid in self._mapping.values()
            }
            if pushed:
                self._push_multi_agent(
                    {
                        f"{pid}{SEPARATOR}{name}": value
                        for pid, values in pushed.items()
                        for name, value in values.items()
                    },
                    pushed,
                )
            return
        weights = self._local.get_weights(policies).get(DEFAULT_POLICY_ID)
        if weights is not None:
            prefix = "policy." if self._filtered else ""
            self._sampler.update_agent({prefix + k: v for k, v in weights.items()})

    def sync_filters(self) -> None:
        """Merges every worker's filter delta into the local filter and broadcasts it.

        RLlib's ``FilterManager.synchronize``: the deltas are the observations
        each worker returned since the last sync.
        """
        local = self._local_filter()
        for delta in self._deltas.values():
            if isinstance(local, MeanStdFilter):
                carrier = MeanStdFilter(local.shape)
                carrier.buffer = delta
                local.apply_changes(carrier)
        self._deltas = {}
        if isinstance(local, MeanStdFilter):
            running = local.running
            self._sampler.update_agent(
                {
                    "filter.n": np.array(running.n, dtype=np.int64),
                    "filter.mean": running.mean,
                    "filter.m2": running.m2,
                }
            )
            self._fleet_filter = local.copy()

    def foreach_worker(self, operation: str) -> dict[int, Any]:
        """A declarative operation on each fleet worker, keyed by worker id.

        Args:
            operation: ``"weights"``: the agent version each worker runs (its
                weights are those pushed as that version); ``"filters"``: the
                filter delta (RunningStat) each returned since the last
                :meth:`sync_filters`; ``"metrics"``: the episodes each
                finished since the last call.

        Raises:
            ConfigError: For another operation: code never travels.
        """
        if operation == "weights":
            return {w.worker_id: w.agent_version for w in self._sampler.status().workers}
        if operation == "filters":
            return dict(self._deltas)
        if operation == "metrics":
            metrics, self._metrics = self._metrics, {}
            return metrics
        raise ConfigError(
            f"RolloutWorkerGroup.foreach_worker takes one of {WORKER_OPERATIONS}, got "
            f"{operation!r}; fleet workers run no code sent to them"
        )

    def get_metrics(self) -> list[RolloutMetrics]:
        """Episodes the fleet finished since the last call (all workers)."""
        return [m for ms in self.foreach_worker("metrics").values() for m in ms]

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Stops the local worker and the fleet :meth:`local` started."""
        self._local.stop()
        if self._fleet is not None:
            self._fleet.close()

    def __enter__(self) -> RolloutWorkerGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --------------------------------------------------------------- helpers

    def _local_filter(self) -> MeanStdFilter | NoFilter:
        # get_filters() returns copies; merging needs the local worker's own filter.
        if self._multi_agent:
            return NoFilter()  # multi-agent groups take NoFilter only
        return self._local._entry(DEFAULT_POLICY_ID).obs_filter

    def _push_policy(self) -> None:
        if self._multi_agent:
            pids = sorted(set(self._mapping.values()))
            entries = {pid: self._local._entry(pid) for pid in pids}
            spec = joint_policy_spec(
                self._config.id,
                self._config.kwargs,
                self._mapping,
                {pid: e.spec for pid, e in entries.items()},
            )
            params = {
                f"{pid}{SEPARATOR}{name}": value
                for pid, e in entries.items()
                for name, value in e.policy.get_param_values().items()
            }
            self._push_multi_agent((spec, params), pids)
            return
        entry = self._local._entry(DEFAULT_POLICY_ID)
        weights = entry.policy.get_param_values()
        if self._filtered:
            spec = FilteredPolicy.spec(entry.spec)
            params = {"policy." + k: v for k, v in weights.items()}
            running = (
                self._fleet_filter.running
                if isinstance(self._fleet_filter, MeanStdFilter)
                else None
            )
            if running is not None:
                params.update(
                    {
                        "filter.n": np.array(running.n),
                        "filter.mean": running.mean,
                        "filter.m2": running.m2,
                    }
                )
            self._sampler.update_agent((spec, params))
        else:
            self._sampler.update_agent((entry.spec, weights))

    def _record(self, batch: EpisodeBatch) -> None:
        workers = batch.episode_infos["worker"]
        step_workers = np.repeat(workers, batch.lengths)
        ends = np.cumsum(batch.lengths) - 1
        if self._filtered:
            for worker in np.unique(workers).tolist():
                delta = RunningStat.of(batch.observations[step_workers == worker])
                self._deltas[worker] = self._deltas.get(
                    worker, RunningStat.empty(delta.mean.shape)
                ).merged(delta)
        starts = ends - batch.lengths + 1
        returns = np.add.reduceat(batch.rewards, starts) if len(starts) else np.zeros(0)
        agent_returns = (
            np.add.reduceat(batch.env_infos[REWARDS], starts)
            if self._layout is not None and len(starts)
            else None
        )
        fragments = "stream" in batch.episode_infos
        for row in range(batch.n_episodes):
            key = (
                (
                    int(batch.episode_infos["stream"][row]),
                    int(batch.episode_infos["episode_index"][row]),
                )
                if fragments
                else (-1, row)
            )
            length, total, per_agent = self._partial.pop(key, (0, 0.0, None))
            length += int(batch.lengths[row])
            total += float(returns[row])
            if agent_returns is not None:
                per_agent = agent_returns[row] + (0.0 if per_agent is None else per_agent)
            if batch.step_types[ends[row]] in (StepType.TERMINAL, StepType.TIMEOUT):
                worker = int(workers[row])
                self._metrics.setdefault(worker, []).append(
                    RolloutMetrics(
                        episode_length=length,
                        episode_reward=total,
                        agent_rewards=self._agent_rewards(total, per_agent),
                        custom_metrics={},
                        hist_data={},
                        episode_id=int(batch.episode_infos["episode_index"][row]),
                        worker_index=worker,
                    )
                )
            else:
                self._partial[key] = (length, total, per_agent)

    def _push_multi_agent(self, update: Any, policy_ids: Iterable[str]) -> None:
        # One agent version carries every policy; each policy's own version
        # counts the pushes that changed it (RLlib's per-policy weights seq no).
        version = self._sampler.update_agent(update)
        for pid in policy_ids:
            self._policy_versions[pid] = self._policy_versions.get(pid, 0) + 1
        self._versions_at[version] = dict(self._policy_versions)

    def _with_policy_version(self, policy_id: str, batch: EpisodeBatch) -> EpisodeBatch:
        versions = [
            self._versions_at.get(int(v), {}).get(policy_id, -1)
            for v in batch.episode_infos["agent_version"]
        ]
        return batch.with_episode_infos(policy_version=np.array(versions, dtype=np.int64))

    def _agent_rewards(
        self, total: float, per_agent: np.ndarray | None
    ) -> dict[tuple[str, str], float]:
        if self._layout is None or per_agent is None:
            return {(SINGLE_AGENT_ID, DEFAULT_POLICY_ID): total}
        return {
            (agent, self._mapping[agent]): float(value)
            for agent, value in zip(self._layout.agents, per_agent, strict=True)
        }

    def _processed(self, batch: EpisodeBatch) -> RolloutEpisodeBatch:
        """The batch with the filter and clip_rewards applied, readable by RLlib's keys."""
        changes: dict[str, Any] = {}
        if isinstance(self._fleet_filter, MeanStdFilter):
            changes["observations"] = self._fleet_filter(batch.observations, update=False)
            changes["last_observations"] = self._fleet_filter(batch.last_observations, update=False)
        if self._settings.clip_rewards not in (None, False):
            changes["rewards"] = clipped_rewards(batch.rewards, self._settings.clip_rewards)
        processed = dataclasses.replace(batch, **changes) if changes else batch
        return RolloutEpisodeBatch.view_of(processed, self._layout.agents if self._layout else ())
