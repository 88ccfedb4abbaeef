"""rollout, truncate_paths, evaluation episodes and performance logging."""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing
from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, RandomPolicy
from rlfleet.sampling import (
    discount_cumsum,
    discounted_returns,
    log_performance,
    obtain_evaluation_episodes,
    performance_stats,
    rollout,
    truncate_paths,
)
from rlfleet.worker import DefaultWorker

F, M, TE, TO = StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT


def path(length: int, start: float = 0.0, *, extra_obs: bool = False) -> dict:
    steps = np.arange(length, dtype=np.float64) + start
    observations = np.arange(length + (1 if extra_obs else 0), dtype=np.float64)[:, None] + start
    return {
        "observations": observations,
        "actions": steps.astype(np.int64),
        "rewards": steps,
        "env_infos": {"x": steps * 2, "nested": {"y": steps * 3}},
        "agent_infos": {"p": steps / 10},
    }


# ---------------------------------------------------------------- truncate


def test_truncate_paths_keeps_whole_paths_then_cuts_one():
    paths = [path(3), path(4, 10), path(2, 20)]
    out = truncate_paths(paths, 5)
    assert [len(p["rewards"]) for p in out] == [3, 2]
    assert out[0]["rewards"] is paths[0]["rewards"]
    np.testing.assert_array_equal(out[1]["rewards"], [10, 11])
    np.testing.assert_array_equal(out[1]["actions"], [10, 11])
    np.testing.assert_array_equal(out[1]["observations"][:, 0], [10, 11])
    np.testing.assert_array_equal(out[1]["env_infos"]["x"], [20, 22])
    np.testing.assert_array_equal(out[1]["env_infos"]["nested"]["y"], [30, 33])
    np.testing.assert_array_equal(out[1]["agent_infos"]["p"], [1.0, 1.1])
    assert len(paths[1]["rewards"]) == 4  # the input is not modified


def test_truncate_paths_edge_counts():
    paths = [path(3), path(4)]
    assert [len(p["rewards"]) for p in truncate_paths(paths, 7)] == [3, 4]
    assert [len(p["rewards"]) for p in truncate_paths(paths, 100)] == [3, 4]
    assert [len(p["rewards"]) for p in truncate_paths(paths, 3)] == [3]
    assert truncate_paths(paths, 0) == []
    with pytest.raises(ValueError, match="max_samples"):
        truncate_paths(paths, -1)


def test_truncate_paths_keeps_the_extra_observation_of_t_plus_one_paths():
    out = truncate_paths([path(5, extra_obs=True)], 2)
    np.testing.assert_array_equal(out[0]["observations"][:, 0], [0, 1, 2])


def test_truncate_paths_rejects_unknown_keys_of_the_cut_path():
    bad = {**path(4), "frames": np.zeros(4)}
    assert len(truncate_paths([bad], 4)) == 1  # kept whole: not inspected, as in garage
    with pytest.raises(ValueError, match="'frames'"):
        truncate_paths([bad], 2)


def test_truncate_paths_accepts_rollout_output():
    env = gym.make("rlfleet/Counter-v0", length=6)
    episode = rollout(env, RandomPolicy(EnvSpec.from_env(env), seed=0))
    out = truncate_paths([episode], 4)
    np.testing.assert_array_equal(out[0]["dones"], [False] * 4)
    assert out[0]["episode_infos"] is episode["episode_infos"]
    # The cut path ends before observation 4, which becomes its last one.
    np.testing.assert_array_equal(out[0]["last_observation"], episode["observations"][4])


# ---------------------------------------------------------------- rollout


def test_rollout_of_a_counter_by_hand():
    env = gym.make("rlfleet/Counter-v0", length=3)
    episode = rollout(env, RandomPolicy(EnvSpec.from_env(env), seed=0))
    assert set(episode) == {
        "episode_infos",
        "observations",
        "actions",
        "rewards",
        "agent_infos",
        "env_infos",
        "dones",
        "last_observation",
    }
    np.testing.assert_array_equal(episode["observations"][:, 0], [0, 1, 2])
    assert episode["last_observation"][0] == 3  # the state after the last step
    np.testing.assert_array_equal(episode["rewards"], [1, 1, 1])
    np.testing.assert_array_equal(episode["dones"], [False, False, True])
    assert episode["episode_infos"] == {"seed": None}
    assert episode["actions"].shape == (3,)


class ComingAndGoingInfos(rlfleet.envs.testing.CounterEnv):
    """A Counter whose step infos hold keys that come and go (seen in gymnasium envs)."""

    def __init__(self, tag: str) -> None:
        super().__init__(length=4)
        self.tag = tag

    def step(self, action: np.int64) -> tuple:
        observation, reward, terminated, truncated, _ = super().step(action)
        info: dict[str, float] = {"always": self.episode_step}
        if self.episode_step == 1:
            info[f"first-only-{self.tag}"] = 1.0  # present at the first step, then gone
        if self.episode_step >= 3:
            info[f"late-{self.tag}"] = 2.0  # appears later
        return observation, reward, terminated, truncated, info


@pytest.mark.parametrize("sampler", ["rollout", "DefaultWorker"])
def test_env_info_keys_that_come_and_go_are_dropped_with_a_warning_naming_them(
    caplog: pytest.LogCaptureFixture, sampler: str
) -> None:
    tag = sampler  # warnings come once per key and process: keys of this test only
    env = ComingAndGoingInfos(tag)
    policy = RandomPolicy(EnvSpec.from_env(env), seed=0)
    with caplog.at_level(logging.WARNING):
        if sampler == "rollout":
            env_infos = rollout(env, policy)["env_infos"]
        else:
            worker = DefaultWorker(seed=1, max_episode_length=None, worker_number=0)
            worker.update_env(env)
            worker.update_agent(policy)
            env_infos = worker.rollout().env_infos
    assert set(env_infos) == {"always"}
    np.testing.assert_array_equal(env_infos["always"], [1, 2, 3, 4])
    for key in (f"first-only-{tag}", f"late-{tag}"):
        assert any(key in r.getMessage() for r in caplog.records), caplog.text


class SpecWithoutId(rlfleet.envs.testing.CounterEnv):
    """garage's environments carry a ``spec`` of spaces with no ``id``."""

    def __init__(self) -> None:
        super().__init__(length=2)
        self.spec: EnvSpec = EnvSpec.from_env(gym.make("rlfleet/Counter-v0", length=2))  # type: ignore[assignment]


def test_rollout_of_an_env_whose_spec_has_no_id() -> None:
    env = SpecWithoutId()
    episode = rollout(env, RandomPolicy(env.spec, seed=0))
    np.testing.assert_array_equal(episode["dones"], [False, True])


def test_rollout_stops_at_max_episode_length_without_done():
    env = gym.make("rlfleet/Counter-v0", length=10)
    episode = rollout(env, RandomPolicy(EnvSpec.from_env(env)), max_episode_length=4)
    np.testing.assert_array_equal(episode["dones"], [False] * 4)


def test_rollout_deterministic_acts_with_the_mean():
    env = gym.make("Pendulum-v1", max_episode_steps=5)
    policy = MLPGaussianPolicy(EnvSpec.from_env(env), seed=0)
    episode = rollout(env, policy, deterministic=True)
    np.testing.assert_array_equal(episode["actions"], episode["agent_infos"]["mean"])
    assert policy.deterministic is False  # restored


def test_rollout_from_list_round_trip():
    env = gym.make("rlfleet/Counter-v0", length=3)
    spec = EnvSpec.from_env(env)
    batch = EpisodeBatch.from_list(spec, [rollout(env, RandomPolicy(spec))])
    np.testing.assert_array_equal(batch.step_types, [M, M, TE])  # garage's dones fallback


# ---------------------------------------------------------------- evaluation


def test_obtain_evaluation_episodes_is_deterministic_and_leaves_env_open():
    env = gym.make("CartPole-v1")
    policy = MLPCategoricalPolicy(EnvSpec.from_env(env), seed=0)
    batch = obtain_evaluation_episodes(policy, env, max_episode_length=50, num_eps=3, seed=5)
    assert batch.n_episodes == 3
    assert batch.lengths.max() <= 50
    np.testing.assert_array_equal(batch.actions, np.argmax(batch.agent_infos["logits"], axis=1))
    assert policy.deterministic is False
    again = obtain_evaluation_episodes(policy, env, max_episode_length=50, num_eps=3, seed=5)
    np.testing.assert_array_equal(batch.observations, again.observations)
    with pytest.raises(ConfigError):
        obtain_evaluation_episodes(policy, env, num_eps=0)


# ------------------------------------------------------------ statistics


def batch_of(rewards: list[list[float]], step_types: list[list[int]], **env_infos) -> EpisodeBatch:
    spec = EnvConfig("rlfleet/Counter-v0").env_spec()
    lengths = np.array([len(r) for r in rewards])
    total = int(lengths.sum())
    return EpisodeBatch(
        env_spec=spec,
        episode_infos={},
        observations=np.zeros((total, 1), np.float32),
        last_observations=np.zeros((len(lengths), 1), np.float32),
        actions=np.zeros(total, np.int64),
        rewards=np.concatenate([np.asarray(r, dtype=np.float64) for r in rewards]),
        env_infos={k: np.concatenate(v) for k, v in env_infos.items()},
        agent_infos={},
        step_types=np.concatenate([np.asarray(t) for t in step_types]),
        lengths=lengths,
    )


def test_discount_cumsum_matches_the_definition():
    rng = np.random.default_rng(0)
    for discount in (0.0, 0.5, 0.9, 0.99, 1.0):
        for length in (1, 7, 1500):
            x = rng.normal(size=length)
            expected = np.empty(length)
            running = 0.0
            for t in range(length - 1, -1, -1):
                running = x[t] + discount * running
                expected[t] = running
            np.testing.assert_allclose(discount_cumsum(x, discount), expected, rtol=1e-10)
    np.testing.assert_allclose(discount_cumsum([1.0, 1.0, 1.0], 0.5), [1.75, 1.5, 1.0])


def test_performance_stats_by_hand():
    batch = batch_of(
        [[1, 1, 1], [2, 0]],
        [[F, M, TE], [F, TO]],
        success=[np.array([0, 1, 0]), np.array([0, 0])],
    )
    stats = performance_stats(batch, 0.5, itr=3)
    assert stats == {
        "Iteration": 3,
        "NumEpisodes": 2,
        "AverageDiscountedReturn": (1.75 + 2.0) / 2,
        "AverageReturn": 2.5,
        "StdReturn": 0.5,
        "MaxReturn": 3.0,
        "MinReturn": 2.0,
        "TerminationRate": 0.5,
        "SuccessRate": 0.5,
    }
    np.testing.assert_allclose(discounted_returns(batch, 0.5), [1.75, 2.0])


def test_performance_stats_without_success_has_no_success_rate():
    stats = performance_stats(batch_of([[1.0]], [[TE]]), 0.9)
    assert "SuccessRate" not in stats and "Iteration" not in stats
    assert stats["TerminationRate"] == 1.0


def test_log_performance_logs_and_returns_undiscounted_returns(caplog):
    batch = batch_of([[1, 2], [3]], [[F, TE], [TO]])
    with caplog.at_level(logging.INFO, logger="rlfleet"):
        returns = log_performance(4, batch, discount=0.9, prefix="Eval")
    np.testing.assert_array_equal(returns, [3.0, 3.0])
    logged = {record.getMessage() for record in caplog.records}
    assert "Eval/Iteration 4" in logged
    assert "Eval/NumEpisodes 2" in logged
    assert "Eval/AverageDiscountedReturn 2.9" in logged  # ((1 + 0.9 * 2) + 3) / 2
    assert "Eval/TerminationRate 0.5" in logged


def test_performance_stats_of_an_empty_batch_are_nan():
    spec = EnvConfig("rlfleet/Counter-v0").env_spec()
    empty = EpisodeBatch(
        env_spec=spec,
        episode_infos={},
        observations=np.zeros((0, 1), np.float32),
        last_observations=np.zeros((0, 1), np.float32),
        actions=np.zeros(0, np.int64),
        rewards=np.zeros(0),
        env_infos={},
        agent_infos={},
        step_types=np.zeros(0, np.int64),
        lengths=np.zeros(0, np.int64),
    )
    stats = performance_stats(empty, 0.9)
    assert stats["NumEpisodes"] == 0
    assert np.isnan(stats["AverageReturn"]) and np.isnan(stats["TerminationRate"])
