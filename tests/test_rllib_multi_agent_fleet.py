"""Multi-agent sampling on a real local fleet (coordinator + worker processes on loopback).

Real PettingZoo envs (mpe2's cooperative ``simple_spread``, the classic
rock-paper-scissors through ``aec_to_parallel``), real worker processes,
real SIGKILL.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test

from rlfleet.core import EnvSpec, MultiAgentEpisodeBatch
from rlfleet.core.seeding import stream_seeds
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, InvalidBatchError, PolicyError
from rlfleet.learners import VPG
from rlfleet.policies import PolicySpec
from rlfleet.rllib import RolloutWorker
from rlfleet.rllib.joint_batches import split_joint_batch
from rlfleet.rllib.joint_policy import MultiAgentJointPolicy, joint_policy_spec
from rlfleet.rllib.multi_agent import (
    JointLayout,
    MultiAgentJointEnv,
    make_agent_env,
    register_multi_agent_env,
)
from rlfleet.rllib.pettingzoo_envs import RPS, SIMPLE_SPREAD
from rlfleet.rllib.worker_group import RolloutWorkerGroup
from rlfleet.sampling.local import LocalSampler
from tests.fleet_processes import run_in_thread
from tests.waiting import wait_until

MODULE = "rlfleet.rllib.pettingzoo_envs"
SPREAD_KWARGS = {"max_cycles": 25}
SPREAD = EnvConfig(SIMPLE_SPREAD, SPREAD_KWARGS, imports=(MODULE,))
ROCK_PAPER_SCISSORS = EnvConfig(RPS, {"num_actions": 3, "max_cycles": 6}, imports=(MODULE,))
#: episode_infos a fleet batch has beyond a local one: who and what produced each row.
FLEET_LABELS = {"worker", "agent_version", "env_seed", "policy_seed", "policy_version"}


def spread_policy(agent_id: str, episode: Any, **kwargs: Any) -> str:
    return "leader" if agent_id == "agent_0" else "followers"


def spread_policies() -> dict[str, Any]:
    """A learner for agent_0, an acting-only MLP for the others."""
    env = MultiAgentJointEnv(make_agent_env(SIMPLE_SPREAD, SPREAD_KWARGS))
    layout: JointLayout = env.layout
    env.close()
    agent_spec = EnvSpec(layout.observation_spaces[0], layout.action_spaces[0])
    return {"leader": VPG(agent_spec, hidden_sizes=(16,), seed=0), "followers": None}


def local_twin(group: RolloutWorkerGroup, seed: int, num_envs: int, **args: Any) -> RolloutWorker:
    """A local RolloutWorker with the group's policies and weights."""
    worker = RolloutWorker(
        env_creator=lambda ctx: make_agent_env(SIMPLE_SPREAD, SPREAD_KWARGS),
        policy_spec=spread_policies(),
        policy_mapping_fn=spread_policy,
        num_envs=num_envs,
        seed=seed,
        **args,
    )
    worker.set_weights(group.local_worker().get_weights())
    return worker


def assert_same_multi_agent(fleet: Any, local: Any) -> None:
    """Bit-identical, every field, except the fleet's labels of who produced each row."""
    assert isinstance(fleet, MultiAgentEpisodeBatch) and isinstance(local, MultiAgentEpisodeBatch)
    assert fleet.env_steps == local.env_steps
    assert set(fleet.policy_batches) == set(local.policy_batches)
    for pid, mine in fleet.policy_batches.items():
        theirs = local.policy_batches[pid]
        for name in ("observations", "last_observations", "actions", "rewards", "step_types"):
            a, b = getattr(mine, name), getattr(theirs, name)
            assert a.dtype == b.dtype and a.shape == b.shape, (pid, name)
            np.testing.assert_array_equal(a, b, err_msg=f"{pid}.{name}")
        np.testing.assert_array_equal(mine.lengths, theirs.lengths)
        assert set(mine.episode_infos) == set(theirs.episode_infos) | FLEET_LABELS
        for key, value in theirs.episode_infos.items():
            if key != "worker":  # who ran each episode is the one thing allowed to differ
                np.testing.assert_array_equal(mine.episode_infos[key], value, err_msg=key)
        assert set(mine.agent_infos) == set(theirs.agent_infos)
        for key, value in theirs.agent_infos.items():
            np.testing.assert_array_equal(mine.agent_infos[key], value, err_msg=key)
        assert set(mine.env_infos) == set(theirs.env_infos)


@pytest.mark.parametrize("workers", [1, 2])
def test_local_and_fleet_multi_agent_batches_are_bit_identical(workers: int) -> None:
    """Fragments across episode ends, learning, a weight push: the fleet gives the local batches."""
    with RolloutWorkerGroup.local(
        workers,
        env=SPREAD,
        envs_per_worker=4 // workers,
        fleet_seed=11,
        policy_spec=spread_policies(),
        policy_mapping_fn=spread_policy,
        policies_to_train=["leader"],
        rollout_fragment_length=10,
    ) as group:
        local = local_twin(group, seed=11, num_envs=4, rollout_fragment_length=10)
        for round_ in range(4):  # 40 steps per stream: every stream ends an episode (25 steps)
            batch = group.sample()
            assert_same_multi_agent(batch, local.sample())
            assert isinstance(batch, MultiAgentEpisodeBatch)
            leader = batch.policy_batches["leader"]
            assert set(leader.episode_infos["agent_id"].tolist()) == {"agent_0"}
            followers = batch.policy_batches["followers"]
            assert set(followers.episode_infos["agent_id"].tolist()) == {"agent_1", "agent_2"}
            # Each policy has its own version: only the leader's moves with its pushes.
            pushed = 2 if round_ >= 2 else 1
            assert set(leader.episode_infos["policy_version"].tolist()) == {pushed}
            assert set(followers.episode_infos["policy_version"].tolist()) == {1}
            assert len(set(batch.policy_batches["leader"].episode_infos["worker"])) == workers
            if round_ == 1:
                # Only the trained policy moves, and the fleet acts with what was pushed.
                before = group.local_worker().get_weights()
                group.local_worker().learn_on_batch(batch)
                after = group.local_worker().get_weights()
                assert all(
                    np.array_equal(before["followers"][k], v) for k, v in after["followers"].items()
                )
                assert any(
                    not np.array_equal(before["leader"][k], v) for k, v in after["leader"].items()
                )
                group.sync_weights(policies=["leader"])
                local.set_weights(after)
        # Episode 1 of stream 3 reset with the fleet's stream seed.
        assert isinstance(batch, MultiAgentEpisodeBatch)
        infos = batch.policy_batches["leader"].episode_infos
        row = int(
            np.flatnonzero((infos["env_index"] == 3) & (infos["env_episode"] == (3 << 32) | 1))[0]
        )
        assert int(infos["env_seed"][row]) == stream_seeds(11, 3, 1)[0]
        metrics = group.get_metrics()
        assert len(metrics) == 4  # one finished episode per stream
        for m in metrics:
            assert m.episode_length == 25
            assert set(m.agent_rewards) == {
                ("agent_0", "leader"),
                ("agent_1", "followers"),
                ("agent_2", "followers"),
            }
            # simple_spread's reward is shared: the team return is the sum over agents.
            assert np.isclose(m.episode_reward, sum(m.agent_rewards.values()))


def test_rock_paper_scissors_through_aec_conversion_on_the_fleet() -> None:
    """A classic AEC game, two policies, whole episodes; zero-sum rewards per step.

    PettingZoo's parallel_api_test passes on both test envs as a worker builds them,
    and gymnasium's check_env on the joint env the worker runs.
    """
    for config in (ROCK_PAPER_SCISSORS, SPREAD):  # each as a worker builds it
        joint = config.make()
        agent_env = joint.unwrapped
        assert isinstance(agent_env, MultiAgentJointEnv)
        parallel_api_test(agent_env.agent_env.env, num_cycles=20)
        check_env(agent_env, skip_render_check=True)  # and the joint env is a gymnasium env
        joint.close()

    def players(agent_id: str, episode: Any, **kwargs: Any) -> str:
        return {"player_0": "first", "player_1": "second"}[agent_id]

    with RolloutWorkerGroup.local(
        2,
        env=ROCK_PAPER_SCISSORS,
        fleet_seed=3,
        policy_spec={"first": "mlp-categorical", "second": "random"},
        policy_mapping_fn=players,
        batch_mode="complete_episodes",
        rollout_fragment_length=30,
    ) as group:
        batch = group.sample()
        assert group.fleet is not None
        sampler = group.fleet.sampler
        with pytest.raises(ConfigError, match="multi-agent groups take 'NoFilter'"):
            RolloutWorkerGroup(
                sampler,
                env=ROCK_PAPER_SCISSORS,
                policy_spec={"all": "random"},
                observation_filter="MeanStdFilter",
            )
        continuous = EnvConfig(SIMPLE_SPREAD, {"continuous_actions": True}, imports=(MODULE,))
        with pytest.raises(ConfigError, match="float Box actions"):
            RolloutWorkerGroup(sampler, env=continuous, policy_spec={"all": "random"})
        with pytest.raises(ConfigError, match="multi-agent groups take a dict"):
            RolloutWorkerGroup(sampler, env=ROCK_PAPER_SCISSORS, policy_spec="random")
        # A mapping that depends on the episode is refused, never silently asked once.
        policies = {"even": "random", "odd": "random"}

        def by_episode(agent_id: str, episode: Any, **kwargs: Any) -> str:
            return "even" if episode.episode_id % 2 == 0 else "odd"

        with pytest.raises(ConfigError, match=r"read episode\.episode_id: on the fleet"):
            RolloutWorkerGroup(
                sampler,
                env=ROCK_PAPER_SCISSORS,
                policy_spec=policies,
                policy_mapping_fn=by_episode,
            )
        turns = itertools.cycle(["even", "odd"])
        with pytest.raises(ConfigError, match="mapped agent 'player_0' to 'even', then to 'odd'"):
            RolloutWorkerGroup(
                sampler,
                env=ROCK_PAPER_SCISSORS,
                policy_spec=policies,
                policy_mapping_fn=lambda agent_id, episode, **kwargs: next(turns),
            )
    assert isinstance(batch, MultiAgentEpisodeBatch)
    first, second = batch.policy_batches["first"], batch.policy_batches["second"]
    assert set(first.episode_infos["agent_id"].tolist()) == {"player_0"}
    assert set(second.episode_infos["agent_id"].tolist()) == {"player_1"}
    # One row per player per env episode, in the same order, each 6 steps.
    np.testing.assert_array_equal(
        first.episode_infos["env_episode"], second.episode_infos["env_episode"]
    )
    assert (first.lengths == 6).all() and (second.lengths == 6).all()
    assert batch.env_steps == first.total_steps >= 30
    np.testing.assert_array_equal(first.rewards, -second.rewards)
    assert set(np.unique(first.actions).tolist()) <= {0, 1, 2}
    ends = first.step_types[np.cumsum(first.lengths) - 1]
    assert set(ends.tolist()) <= {2, 3}


def test_a_killed_worker_loses_and_duplicates_nothing() -> None:
    """SIGKILL mid-request: the batch equals an undisturbed fleet's with the same seed."""
    args: dict[str, Any] = {
        "env": SPREAD,
        "fleet_seed": 21,
        "policy_spec": {"all": "mlp-categorical"},
        "batch_mode": "complete_episodes",
        "rollout_fragment_length": 400,
        "seed": 0,
    }
    with RolloutWorkerGroup.local(1, envs_per_worker=4, **args) as calm:
        expected = calm.sample()
    with RolloutWorkerGroup.local(2, envs_per_worker=2, **args) as group:
        assert group.fleet is not None
        victim = group.fleet.workers[0]
        sampler = group.fleet.sampler
        answer = run_in_thread(group.sample)
        wait_until(
            lambda: any(
                w.units_in_flight > 0 and w.name == victim.name for w in sampler.status().workers
            ),
            "units on the victim",
            interval=0.01,
        )
        victim.process.kill()
        batch = answer(120)
    assert_same_multi_agent(batch, expected)
    assert isinstance(batch, MultiAgentEpisodeBatch)
    rows = batch.policy_batches["all"].episode_infos
    # 1600 env steps of 25-step episodes: 64 episodes x 3 agents, each once.
    assert sorted(set(rows["env_episode"].tolist())) == list(range(64))
    assert len(rows["env_episode"]) == 64 * 3


def test_joint_policy_and_group_refuse_what_they_cannot_do() -> None:
    env = MultiAgentJointEnv(make_agent_env(SIMPLE_SPREAD, SPREAD_KWARGS))
    spec = EnvSpec(env.observation_space, env.action_space)
    policies = {"p": {"name": "mlp-categorical", "kwargs": {}}}
    mapping = {a: "p" for a in env.layout.agents}
    policy = MultiAgentJointPolicy(
        spec, env=SIMPLE_SPREAD, env_kwargs=SPREAD_KWARGS, mapping=mapping, policies=policies
    )
    with pytest.raises(PolicyError, match="names no policy"):
        policy.set_param_values({"q/layers.0.weight": np.zeros(3)})
    with pytest.raises(ConfigError, match="not allowed"):
        MultiAgentJointPolicy(
            spec,
            env=SIMPLE_SPREAD,
            env_kwargs=SPREAD_KWARGS,
            mapping=mapping,
            policies={"p": {"name": "os:system", "kwargs": {}}},
        )
    with pytest.raises(ConfigError, match="map to no policy"):
        MultiAgentJointPolicy(
            spec, env=SIMPLE_SPREAD, env_kwargs=SPREAD_KWARGS, mapping={}, policies=policies
        )
    with pytest.raises(ConfigError, match="no multi-agent env is registered"):
        make_agent_env("multi-agent/nothing-v0")
    env.close()

    def adversary(**kwargs: Any) -> Any:
        from mpe2 import simple_adversary_v3

        return simple_adversary_v3.parallel_env(**kwargs)

    mixed_id = register_multi_agent_env("simple_adversary-test", adversary)
    mixed = MultiAgentJointEnv(make_agent_env(mixed_id))
    with pytest.raises(ConfigError, match="have different spaces"):
        MultiAgentJointPolicy(
            EnvSpec(mixed.observation_space, mixed.action_space),
            env=mixed_id,
            mapping={a: "p" for a in mixed.layout.agents},
            policies=policies,
        )
    mixed.close()


def test_a_joint_batch_that_does_not_fit_the_layout_is_an_error() -> None:
    """The worker engine's own joint batch splits; a broken one-hot action is refused."""
    env = MultiAgentJointEnv(make_agent_env(RPS, ROCK_PAPER_SCISSORS.kwargs))
    layout = env.layout
    mapping = {"player_0": "p", "player_1": "p"}
    spec = joint_policy_spec(
        RPS, ROCK_PAPER_SCISSORS.kwargs, mapping, {"p": PolicySpec("mlp-categorical")}
    )
    with LocalSampler(ROCK_PAPER_SCISSORS, spec, seed=4) as sampler:
        joint = sampler.obtain_exact_episodes(2)
    agent_spec = EnvSpec(layout.observation_spaces[0], layout.action_spaces[0])
    split = split_joint_batch(joint, layout, mapping, {"p": agent_spec})
    assert split.env_steps == joint.total_steps == 12
    assert split.policy_batches["p"].total_steps == 24  # both players at every step
    broken = dataclasses.replace(joint, actions=np.zeros_like(joint.actions))
    with pytest.raises(InvalidBatchError, match="row 0 of a joint multi-agent batch"):
        split_joint_batch(broken, layout, mapping, {"p": agent_spec})
    env.close()


def test_a_worker_killed_mid_fragments_changes_no_multi_agent_answer() -> None:
    """SIGKILL mid truncate_episodes sample: the answers are the undisturbed ones.

    The dead worker's stream is taken over by the survivor, which replays its
    episode in progress (docs/reliability.md, "Fragments under faults"): the
    joint env and the joint policy replay like single-agent ones, so every
    per-policy batch equals a local RolloutWorker's with the fleet's streams,
    during the kill and after it.
    """
    # Episodes of 25 steps straddle the windows (one is in progress at the kill), and
    # a window lasts long enough that the victim dies stepping it.
    length = 490
    args: dict[str, Any] = {
        "env": SPREAD,
        "fleet_seed": 5,
        "policy_spec": {"all": "mlp-categorical"},
        "rollout_fragment_length": length,
        "seed": 0,
    }
    with RolloutWorkerGroup.local(2, envs_per_worker=1, **args) as group:
        assert group.fleet is not None
        reference = RolloutWorker(
            env_creator=lambda ctx: make_agent_env(SIMPLE_SPREAD, SPREAD_KWARGS),
            policy_spec={"all": "mlp-categorical"},
            num_envs=2,
            seed=5,
            rollout_fragment_length=length,
        )
        reference.set_weights(group.local_worker().get_weights())
        assert_same_multi_agent(group.sample(), reference.sample())
        victim = group.fleet.workers[0]
        victim_id = next(
            w.worker_id for w in group.fleet.sampler.status().workers if w.name == victim.name
        )
        sampler = group.fleet.sampler
        answer = run_in_thread(group.sample)
        wait_until(
            lambda: any(
                w.units_in_flight > 0 and w.worker_id == victim_id for w in sampler.status().workers
            ),
            "units on the victim",
            interval=0.01,
        )
        victim.process.kill()
        disturbed = answer(120)
        assert isinstance(disturbed, MultiAgentEpisodeBatch)
        rows = disturbed.policy_batches["all"].episode_infos
        # Both streams are in it, none of it from the victim: the survivor took its stream over.
        assert set((np.asarray(rows["env_episode"]) >> 32).tolist()) == {0, 1}
        assert victim_id not in set(rows["worker"].tolist())
        assert_same_multi_agent(disturbed, reference.sample())
        # The survivor now runs both streams: the next answer is the undisturbed one too.
        batch = group.sample()
        assert_same_multi_agent(batch, reference.sample())
    assert isinstance(batch, MultiAgentEpisodeBatch)
    streams = np.asarray(batch.policy_batches["all"].episode_infos["env_episode"]) >> 32
    assert set(streams.tolist()) == {0, 1}
