"""RolloutWorkerGroup: RLlib's ``WorkerSet`` idea on the fleet (single agent).

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Mapping
from types import TracebackType
from typing import Any

import numpy as np

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.envs import EnvConfig, make_env
from rlfleet.errors import ConfigError
from rlfleet.rllib._collector import clipped_rewards
from rlfleet.rllib._envs import SINGLE_AGENT_ID
from rlfleet.rllib._policies import DEFAULT_POLICY_ID
from rlfleet.rllib.callbacks import RolloutMetrics
from rlfleet.rllib.filtered_policy import FilteredPolicy
from rlfleet.rllib.filters import MeanStdFilter, NoFilter, RunningStat
from rlfleet.rllib.rollout_worker import RolloutWorker

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
            learner such as :class:`rlfleet.learners.VPG`, or None.
        observation_filter: ``"NoFilter"`` or ``"MeanStdFilter"``.
        rollout_fragment_length: Steps per env slot per :meth:`sample`.
        batch_mode: ``"truncate_episodes"`` (fragments; episodes go on
            across samples) or ``"complete_episodes"``.
        clip_rewards: As RolloutWorker's: True clips to [-1, 1], a float c to
            [-c, c]; metrics keep the raw rewards.
        seed: The local worker's seed (the fleet's seeds are the sampler's).

    Raises:
        ConfigError: If an argument is invalid.
    """

    def __init__(
        self,
        sampler: RemoteSampler,
        *,
        env: EnvConfig | str,
        policy_spec: Any = None,
        observation_filter: str = "NoFilter",
        rollout_fragment_length: int = 100,
        batch_mode: str = "truncate_episodes",
        clip_rewards: bool | float | None = None,
        seed: int | None = None,
    ) -> None:
        if isinstance(policy_spec, dict):
            raise ConfigError(
                "RolloutWorkerGroup samples single-agent envs; multi-agent sampling runs on "
                "a local RolloutWorker (the fleet protocol has no multi-agent batches yet)"
            )
        config = EnvConfig(env) if isinstance(env, str) else env
        self._sampler = sampler
        self._local = RolloutWorker(
            env_creator=lambda ctx: make_env(config),
            policy_spec=policy_spec,
            observation_filter=observation_filter,
            rollout_fragment_length=rollout_fragment_length,
            batch_mode=batch_mode,
            clip_rewards=clip_rewards,
            seed=seed,
        )
        self._fragment_length = rollout_fragment_length
        self._batch_mode = batch_mode
        self._clip_rewards = clip_rewards
        self._filtered = observation_filter == "MeanStdFilter"
        self._iteration = 0
        self._deltas: dict[int, RunningStat] = {}
        self._metrics: dict[int, list[RolloutMetrics]] = {}
        self._partial: dict[tuple[int, int], tuple[int, float]] = {}
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

    def sample(self) -> EpisodeBatch:
        """One batch from the whole fleet: ``rollout_fragment_length`` steps per env slot.

        Observations are filtered with the state the workers' policies used
        (what they saw); each worker's filter delta and finished episodes are
        recorded for :meth:`sync_filters` and :meth:`get_metrics`.
        """
        slots = sum(w.envs for w in self._sampler.status().workers) or 1
        steps = self._fragment_length * slots
        if self._batch_mode == "truncate_episodes":
            batch = self._sampler.obtain_fragments(steps, self._fragment_length)
        else:
            batch = self._sampler.obtain_samples(self._iteration, steps)
        self._iteration += 1
        self._record(batch)
        return self._processed(batch)

    # ----------------------------------------------------- weights and vars

    def sync_weights(
        self, policies: Container[str] | None = None, global_vars: Mapping[str, Any] | None = None
    ) -> None:
        """Pushes the local worker's weights to every fleet worker (one agent update).

        Args:
            policies: Policy ids to push; the group has one, ``default_policy``.
            global_vars: Set on the local worker (fleet workers' policies
                take no global vars).
        """
        if global_vars is not None:
            self._local.set_global_vars(global_vars)
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
        return self._local._entry(DEFAULT_POLICY_ID).obs_filter

    def _push_policy(self) -> None:
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
            length, total = self._partial.pop(key, (0, 0.0))
            length += int(batch.lengths[row])
            total += float(returns[row])
            if batch.step_types[ends[row]] in (StepType.TERMINAL, StepType.TIMEOUT):
                worker = int(workers[row])
                self._metrics.setdefault(worker, []).append(
                    RolloutMetrics(
                        episode_length=length,
                        episode_reward=total,
                        agent_rewards={(SINGLE_AGENT_ID, DEFAULT_POLICY_ID): total},
                        custom_metrics={},
                        hist_data={},
                        episode_id=int(batch.episode_infos["episode_index"][row]),
                        worker_index=worker,
                    )
                )
            else:
                self._partial[key] = (length, total)

    def _processed(self, batch: EpisodeBatch) -> EpisodeBatch:
        changes: dict[str, Any] = {}
        if isinstance(self._fleet_filter, MeanStdFilter):
            changes["observations"] = self._fleet_filter(batch.observations, update=False)
            changes["last_observations"] = self._fleet_filter(batch.last_observations, update=False)
        if self._clip_rewards not in (None, False):
            changes["rewards"] = clipped_rewards(batch.rewards, self._clip_rewards)
        return dataclasses.replace(batch, **changes) if changes else batch
