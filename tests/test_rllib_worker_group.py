"""RolloutWorkerGroup on a real local fleet (coordinator + worker processes on loopback)."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.learners import VPG
from rlfleet.policies import PolicySpec, make_policy
from rlfleet.rllib import DEFAULT_POLICY_ID, FilteredPolicy, MeanStdFilter, RunningStat
from rlfleet.rllib.worker_group import RolloutWorkerGroup

CARTPOLE = EnvConfig("CartPole-v1")


def vpg() -> VPG:
    return VPG(CARTPOLE.env_spec(), hidden_sizes=(8,), seed=0)


def sample(group: RolloutWorkerGroup) -> EpisodeBatch:
    batch = group.sample()
    assert isinstance(batch, EpisodeBatch)  # a single-agent group
    return batch


def local_logits(group: RolloutWorkerGroup, batch: EpisodeBatch) -> np.ndarray:
    policy = group.local_worker().get_policy()
    assert policy is not None
    return policy.get_actions(batch.observations)[1]["logits"]


def test_filters_merge_deltas_and_workers_act_on_the_broadcast_state() -> None:
    with RolloutWorkerGroup.local(
        2,
        env=CARTPOLE,
        policy_spec=vpg(),
        observation_filter="MeanStdFilter",
        rollout_fragment_length=40,
        fleet_seed=0,
    ) as group:
        first = sample(group)
        assert first.total_steps == 80
        deltas = group.foreach_worker("filters")
        assert len(deltas) == 2 and sum(d.n for d in deltas.values()) == 80
        group.sync_filters()
        assert group.foreach_worker("filters") == {}
        merged = group.local_worker().get_filters()[DEFAULT_POLICY_ID]
        assert isinstance(merged, MeanStdFilter) and merged.running.n == 80
        # Before the first sync the workers' filter was the identity (clip 10
        # aside), so the first batch holds the raw observations.
        np.testing.assert_allclose(merged.running.mean, first.observations.mean(axis=0), rtol=1e-5)

        second = sample(group)
        # The workers' policies saw exactly the observations the group returns,
        # filtered with the merged state: their logits are the local policy's.
        np.testing.assert_allclose(
            second.agent_infos["logits"], local_logits(group, second), rtol=1e-5
        )
        assert np.abs(second.observations).max() <= 10.0
        finished = group.get_metrics()
        assert finished and sum(m.episode_length for m in finished) <= 160


def test_sync_weights_reaches_every_worker_and_metrics_add_up() -> None:
    with RolloutWorkerGroup.local(
        2,
        env=CARTPOLE,
        policy_spec=vpg(),
        batch_mode="complete_episodes",
        rollout_fragment_length=100,
        clip_rewards=0.5,
        fleet_seed=1,
    ) as group:
        batch = sample(group)
        # The batch is sized from the slots GetStatus counts at that moment, so
        # the killed worker may or may not be counted yet: at least one worker's.
        assert batch.total_steps >= 100
        assert batch.rewards.max() == 0.5
        metrics = group.get_metrics()
        assert sorted(m.episode_length for m in metrics) == sorted(batch.lengths.tolist())
        assert all(m.episode_reward == m.episode_length for m in metrics)  # raw CartPole rewards

        group.local_worker().learn_on_batch(batch)
        group.sync_weights(global_vars={"timestep": batch.total_steps})
        assert group.local_worker().get_global_vars() == {"timestep": batch.total_steps}
        versions = set(group.foreach_worker("weights").values())
        after = sample(group)
        assert versions == set(after.episode_infos["agent_version"].tolist())
        np.testing.assert_allclose(
            after.agent_infos["logits"], local_logits(group, after), rtol=1e-5
        )

        with pytest.raises(ConfigError, match="run no code"):
            group.foreach_worker("lambda w: w.stop()")


def test_a_killed_worker_loses_no_batch_and_a_dict_policy_needs_a_multi_agent_env() -> None:
    with RolloutWorkerGroup.local(
        2, env=CARTPOLE, policy_spec="random", batch_mode="complete_episodes", fleet_seed=2
    ) as group:
        sample(group)
        assert group.fleet is not None
        group.fleet.workers[0].process.kill()
        batch = sample(group)
        # The batch is sized from the slots GetStatus counts at that moment, so
        # the killed worker may or may not be counted yet: at least one worker's.
        assert batch.total_steps >= 100
        # Every episode is whole: the lost worker's in-flight ones were re-run.
        ends = batch.step_types[np.cumsum(batch.lengths) - 1]
        assert set(ends.tolist()) <= {2, 3}
        with pytest.raises(ConfigError, match="multi-agent groups take a dict"):
            RolloutWorkerGroup(group.fleet.sampler, env=CARTPOLE, policy_spec={"a": "random"})


def test_filtered_policy_is_row_independent_and_checks_its_parameters() -> None:
    spec = CARTPOLE.env_spec()
    policy = make_policy(FilteredPolicy.spec(PolicySpec("mlp-categorical")), spec, seed=0)
    assert isinstance(policy, FilteredPolicy)
    rows = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    stat = RunningStat.of(rows)
    policy.set_param_values(
        {"filter.n": np.array(stat.n), "filter.mean": stat.mean, "filter.m2": stat.m2}
    )
    # Episodes get the same action distribution alone or in any batch
    # (docs/architecture.md, Determinism).
    together = policy.get_actions(rows)[1]["logits"]
    alone = np.concatenate([policy.get_actions(rows[i : i + 1])[1]["logits"] for i in range(64)])
    np.testing.assert_array_equal(together, alone)
    expected = MeanStdFilter((4,))
    expected.running = stat
    inner = policy.inner.get_actions(expected(rows, update=False))[1]["logits"]
    np.testing.assert_array_equal(together, inner)

    with pytest.raises(PolicyError, match="needs all of"):
        policy.set_param_values({"filter.n": np.array(3)})
    with pytest.raises(PolicyError, match="has no parameters"):
        policy.set_param_values({"weights": np.zeros(3)})
    with pytest.raises(PolicyError, match="shape"):
        policy.set_param_values(
            {"filter.n": np.array(1), "filter.mean": np.zeros(3), "filter.m2": np.zeros(4)}
        )
