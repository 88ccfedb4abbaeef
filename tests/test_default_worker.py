"""DefaultWorker: garage's worker contract, on real gymnasium envs."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs)
from rlfleet.core import EpisodeBatch, StepType
from rlfleet.core.seeding import episode_seeds
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, UsageError
from rlfleet.policies import MLPCategoricalPolicy, RandomPolicy
from rlfleet.worker import DefaultWorker

F, M, TE, TO = StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT


def make_worker(env: gym.Env | EnvConfig, *, seed: int = 1, number: int = 0, max_len=None):
    worker = DefaultWorker(seed=seed, max_episode_length=max_len, worker_number=number)
    worker.update_env(env)
    return worker


def test_rollout_of_a_counter_by_hand():
    worker = make_worker(EnvConfig("rlfleet/Counter-v0", {"length": 4}))
    batch = worker.rollout()
    assert isinstance(batch, EpisodeBatch) and batch.n_episodes == 1
    np.testing.assert_array_equal(batch.observations[:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(batch.last_observations[:, 0], [4])
    np.testing.assert_array_equal(batch.step_types, [F, M, M, TE])
    np.testing.assert_array_equal(batch.rewards, [1, 1, 1, 1])


def test_max_episode_length_gives_timeout():
    worker = make_worker(EnvConfig("rlfleet/Counter-v0", {"length": 9}), max_len=3)
    batch = worker.rollout()
    np.testing.assert_array_equal(batch.step_types, [F, M, TO])
    np.testing.assert_array_equal(batch.last_observations[:, 0], [3])


def test_infinite_max_episode_length_means_the_env_limit():
    worker = make_worker(EnvConfig("CartPole-v1"), max_len=math.inf)
    assert worker.rollout().env_spec.max_episode_length == 500
    with pytest.raises(ConfigError):
        DefaultWorker(seed=0, max_episode_length=-2.5, worker_number=0)


def test_start_step_collect_contract():
    worker = make_worker(EnvConfig("rlfleet/Counter-v0", {"length": 3}))
    with pytest.raises(UsageError, match="start_episode"):
        worker.step_episode()
    worker.start_episode()
    with pytest.raises(UsageError, match="step_episode"):
        worker.collect_episode()
    assert [worker.step_episode() for _ in range(3)] == [False, False, True]
    batch = worker.collect_episode()
    assert batch.lengths.tolist() == [3]
    with pytest.raises(UsageError):
        worker.collect_episode()


def test_episode_k_uses_the_seeds_of_worker_number_and_k():
    worker = make_worker(EnvConfig("CartPole-v1"), seed=7, number=2)
    batches = [worker.rollout() for _ in range(3)]
    for k, batch in enumerate(batches):
        env_seed, policy_seed = episode_seeds(7, 2, k)
        assert batch.episode_infos["env_seed"].tolist() == [env_seed]
        assert batch.episode_infos["policy_seed"].tolist() == [policy_seed]
        assert batch.episode_infos["episode_index"].tolist() == [k]
        assert batch.episode_infos["worker"].tolist() == [2]
        # The first observation is the env's reset under that seed.
        expected, _ = gym.make("CartPole-v1").reset(seed=env_seed)
        np.testing.assert_array_equal(batch.observations[0], expected)


def test_worker_init_restarts_the_episode_count():
    worker = make_worker(EnvConfig("CartPole-v1"))
    first = worker.rollout()
    worker.rollout()
    worker.worker_init()
    again = worker.rollout()
    np.testing.assert_array_equal(first.observations, again.observations)
    np.testing.assert_array_equal(first.actions, again.actions)


def test_garage_style_env_instance_and_agent_attributes():
    env = gym.make("CartPole-v1")
    worker = make_worker(env)
    assert worker.env is env
    assert isinstance(worker.agent, RandomPolicy)
    policy = MLPCategoricalPolicy(worker.rollout().env_spec, seed=0)
    assert worker.update_agent(policy) == 1
    updated: object = worker.agent
    assert updated is policy and worker.agent_version == 1


def test_agent_update_mid_episode_reruns_it_with_the_new_agent():
    spec = EnvConfig("CartPole-v1").env_spec()
    policy = MLPCategoricalPolicy(spec, seed=0)
    worker = make_worker(EnvConfig("CartPole-v1"))
    worker.update_agent(policy)
    worker.start_episode()
    worker.step_episode()
    worker.step_episode()
    params = {k: -v for k, v in policy.get_param_values().items()}
    worker.update_agent(params)
    while not worker.step_episode():
        pass
    batch = worker.collect_episode()

    other = MLPCategoricalPolicy(spec, seed=0)
    other.set_param_values(params)
    reference = make_worker(EnvConfig("CartPole-v1"))
    reference.update_agent(other)
    expected = reference.rollout()
    np.testing.assert_array_equal(batch.observations, expected.observations)
    np.testing.assert_array_equal(batch.actions, expected.actions)
    assert batch.episode_infos["agent_version"].tolist() == [2]


def test_shutdown_closes_the_env():
    closed = []
    env = gym.make("CartPole-v1")
    env.close = lambda: closed.append(True)  # type: ignore[method-assign]
    worker = make_worker(env)
    worker.rollout()
    worker.shutdown()
    assert closed == [True]


def test_seed_none_still_samples():
    worker = DefaultWorker(seed=None, max_episode_length=None, worker_number=0)
    worker.update_env(EnvConfig("CartPole-v1"))
    assert worker.rollout().n_episodes == 1
