"""The remote vector env over a multi-agent env: leased joint envs on a real fleet.

A RemoteVectorEnv of ``multi-agent/<name>`` envs leased on real worker
processes (``Fleet.local``) steps exactly like the same joint envs built
here; leases of such an env go only to workers with the capability
``rlfleet.multi-agent``, and with none a clear error names it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, NoWorkersError
from rlfleet.rllib.multi_agent import JointLayout, MultiAgentJointEnv
from rlfleet.rllib.pettingzoo_envs import RPS, SIMPLE_SPREAD
from tests._coordinator_fakes import join

MODULE = "rlfleet.rllib.pettingzoo_envs"
SPREAD_KWARGS: dict[str, Any] = {"N": 2, "max_cycles": 12}
SPREAD = EnvConfig(SIMPLE_SPREAD, SPREAD_KWARGS, imports=(MODULE,))
NUM_ENVS = 3


def random_joint_actions(
    layout: JointLayout, observations: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """One joint action per env: a random action for each agent that acts."""
    rows = []
    for joint in observations:
        acting = layout.agent_observations(joint)
        actions: dict[str, Any] = {}
        for agent in acting:
            space = layout.action_spaces[layout.agents.index(agent)]
            assert isinstance(space, gym.spaces.Discrete)
            actions[agent] = int(rng.integers(space.n))
        rows.append(layout.joint_action(actions))
    return np.stack(rows)


def test_remote_vector_env_over_a_joint_env_steps_like_local_joint_envs() -> None:
    """Seeded resets, the same actions: the same trajectories, across episode ends."""
    local = [gym.make(SIMPLE_SPREAD, **SPREAD_KWARGS) for _ in range(NUM_ENVS)]
    joint_env = local[0].unwrapped
    assert isinstance(joint_env, MultiAgentJointEnv)
    layout = joint_env.layout
    rng = np.random.default_rng(7)
    with (
        Fleet.local(2, envs_per_worker=2, env=SPREAD, seed=0) as fleet,
        RemoteVectorEnv(fleet, SPREAD, NUM_ENVS, call_timeout=60) as venv,
    ):
        assert venv.observation_space == [local[0].observation_space] * NUM_ENVS
        assert venv.action_space == [local[0].action_space] * NUM_ENVS
        seeds = [11, 12, 13]
        obs, _ = venv.reset(seed=seeds)
        mine = np.stack([env.reset(seed=s)[0] for env, s in zip(local, seeds, strict=True)])
        np.testing.assert_array_equal(obs, mine)
        ends = 0
        for step in range(30):
            actions = random_joint_actions(layout, obs, rng)
            obs, rewards, terminated, truncated, infos = venv.step(actions)
            for i, env in enumerate(local):
                o, r, term, trunc, info = env.step(actions[i])
                np.testing.assert_array_equal(obs[i], o)
                assert (rewards[i], terminated[i], truncated[i]) == (r, term, trunc)
                # Each agent's own reward travels in the info, as the fleet's batches carry it.
                np.testing.assert_array_equal(infos[i]["ma.rewards"], info["ma.rewards"])
                if term or trunc:
                    ends += 1
                    obs[i] = venv.reset(i)[0][0]
                    np.testing.assert_array_equal(obs[i], env.reset()[0])
            if step == 20:  # a seeded reset mid-episode, as a learner may ask
                obs[0] = venv.reset(0, seed=99)[0][0]
                np.testing.assert_array_equal(obs[0], local[0].reset(seed=99)[0])
        assert ends >= NUM_ENVS  # every env crossed an episode end (12 cycles)
    for env in local:
        env.close()


def test_joint_action_refuses_an_agent_the_env_does_not_have() -> None:
    env = gym.make(RPS, num_actions=3, max_cycles=2)
    joint_env = env.unwrapped
    assert isinstance(joint_env, MultiAgentJointEnv)
    with pytest.raises(ConfigError, match=r"agent 'nobody' is not one of the env's agents"):
        joint_env.layout.joint_action({"nobody": 0})
    env.close()


def test_a_multi_agent_lease_needs_a_worker_with_the_capability() -> None:
    """A worker that hosts leases but lacks "rlfleet.multi-agent" gets none of a joint env."""
    config = CoordinatorConfig(listen="127.0.0.1:0", env=EnvConfig("CartPole-v1"))
    with serve(config) as server:
        worker, _ = join(
            server.address,
            num_envs=2,
            name="single-agent-only",
            capabilities=("rlfleet.episodes", "rlfleet.leases"),
        )
        try:
            with pytest.raises(NoWorkersError) as caught:
                RemoteVectorEnv(server.address, SPREAD, 1, open_timeout=1.0)
            message = str(caught.value)
            assert "declare the capability 'rlfleet.multi-agent'" in message
            assert "1 more host leases but lack the capability" in message
            assert SIMPLE_SPREAD in message
        finally:
            worker.close()
