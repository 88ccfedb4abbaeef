"""The batch RolloutWorker.sample() returns reads like RLlib's SampleBatch, as a view."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from mpe2 import simple_spread_v3

from rlfleet import StepType
from rlfleet.core import EpisodeBatch, MultiAgentEpisodeBatch
from rlfleet.errors import BatchKeyError
from rlfleet.rllib import EnvContext, RolloutWorker
from rlfleet.rllib.sample_batch import RolloutEpisodeBatch


def cartpole(ctx: EnvContext) -> gym.Env:
    return gym.make("CartPole-v1")


def pendulum(ctx: EnvContext) -> gym.Env:
    return gym.make("Pendulum-v1", max_episode_steps=7)


def _sample(**kwargs: object) -> RolloutEpisodeBatch:
    worker = RolloutWorker(seed=2, **kwargs)  # type: ignore[arg-type]
    batch = worker.sample()
    assert isinstance(batch, RolloutEpisodeBatch) and isinstance(batch, EpisodeBatch)
    return batch


def test_stored_columns_are_the_batchs_own_arrays() -> None:
    batch = _sample(env_creator=cartpole, rollout_fragment_length=60, num_envs=2)
    for key, stored in (
        ("obs", batch.observations),
        ("actions", batch.actions),
        ("rewards", batch.rewards),
        ("action_logp", batch.agent_infos["log_prob"]),
        ("action_dist_inputs", batch.agent_infos["logits"]),
        ("logits", batch.agent_infos["logits"]),  # a policy's extra outputs are columns
        ("seq_lens", batch.lengths),
    ):
        assert batch[key] is stored and np.shares_memory(batch[key], stored), key
    assert batch.count == batch.env_steps() == batch.agent_steps() == 120


def test_derived_columns_follow_the_episodes() -> None:
    batch = _sample(env_creator=cartpole, rollout_fragment_length=60, num_envs=2)
    steps = batch.step_types
    np.testing.assert_array_equal(batch["new_obs"], batch.next_observations)
    np.testing.assert_array_equal(batch["terminateds"], steps == StepType.TERMINAL)
    np.testing.assert_array_equal(batch["truncateds"], steps == StepType.TIMEOUT)
    np.testing.assert_array_equal(batch["dones"], batch["terminateds"] | batch["truncateds"])
    np.testing.assert_array_equal(
        batch["eps_id"], np.repeat(batch.episode_infos["env_episode"], batch.lengths)
    )
    np.testing.assert_array_equal(
        batch["env_id"], np.repeat(batch.episode_infos["env_index"], batch.lengths)
    )
    assert not batch["agent_index"].any()  # one agent
    starts = np.cumsum(batch.lengths) - batch.lengths
    assert (batch["t"][starts] == 0).all() and batch["t"][-1] == batch.lengths[-1] - 1
    np.testing.assert_allclose(batch["action_prob"], np.exp(batch["action_logp"]))
    assert batch["infos"].shape == (120,) and batch["infos"][0] == {}


def test_a_gaussian_policys_distribution_inputs_are_mean_and_log_std() -> None:
    batch = _sample(env_creator=pendulum, rollout_fragment_length=7)
    inputs = batch["action_dist_inputs"]
    np.testing.assert_array_equal(inputs[:, :1], batch.agent_infos["mean"])
    np.testing.assert_array_equal(inputs[:, 1:], batch.agent_infos["log_std"])
    assert batch["truncateds"][-1] and not batch["terminateds"].any()  # the time limit


def test_it_reads_like_a_dict_and_a_missing_key_is_a_key_error() -> None:
    batch = _sample(env_creator=cartpole, rollout_fragment_length=10)
    assert "obs" in batch and "vf_preds" not in batch and "action_logp" in list(batch)
    assert batch.get("vf_preds") is None and batch.get("obs") is batch.observations
    with pytest.raises(KeyError, match="'vf_preds' is not a column of this batch") as missing:
        batch["vf_preds"]
    assert isinstance(missing.value, BatchKeyError)
    with pytest.raises(TypeError):  # not a dict: columns are not written in place
        batch["advantages"] = np.zeros(10)  # type: ignore[index]


def test_it_is_still_the_episode_batch() -> None:
    batch = _sample(env_creator=cartpole, rollout_fragment_length=10)
    plain = EpisodeBatch(
        *(getattr(batch, name) for name in EpisodeBatch.__dataclass_fields__)  # garage's order
    )
    assert batch == plain and plain == batch
    assert EpisodeBatch.concatenate(batch, plain).total_steps == 20


def test_multi_agent_policy_batches_read_by_key_with_agent_index() -> None:
    worker = RolloutWorker(
        env_creator=lambda ctx: simple_spread_v3.parallel_env(N=3, max_cycles=5),
        policy_spec={"solo": "random", "team": "random"},
        policy_mapping_fn="tests.fixtures.rllib_plugins:first_agent_alone",
        rollout_fragment_length=5,
        seed=0,
    )
    batch = worker.sample()
    assert isinstance(batch, MultiAgentEpisodeBatch)
    solo, team = batch.policy_batches["solo"], batch.policy_batches["team"]
    assert isinstance(solo, RolloutEpisodeBatch) and isinstance(team, RolloutEpisodeBatch)
    assert np.shares_memory(team["obs"], team.observations)
    assert set(solo["agent_index"].tolist()) == {0}
    assert set(team["agent_index"].tolist()) == {1, 2}  # positions among the env's agents
