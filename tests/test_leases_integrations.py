"""The learners people use, with their envs leased on a real local fleet of 2 workers.

Stable-Baselines3 (PPO, VecNormalize, VecMonitor) over
``FleetVecEnv(RemoteVectorEnv(...))``, a CleanRL-style PPO loop (gymnasium
API only) over ``FleetVectorEnv(RemoteVectorEnv(...))``, and tianshou's own
Collector over ``RemoteVectorEnv`` (the RayVectorEnv use). The adapters
themselves are tested in process in tests/test_integration_sb3.py and
tests/test_integration_gymnasium.py (whose PPO loop is reused); here the
envs run on worker processes and every step crosses the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize

from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.envs import DummyVectorEnv
from rlfleet.integrations.gymnasium import FleetVectorEnv
from rlfleet.integrations.sb3 import FleetVecEnv
from tests.test_integration_gymnasium import train_ppo
from tests.test_integration_tianshou import CARTPOLE, collect, consistent_transitions

LOST = "rlfleet_env_lost"


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch's spinning intra-op threads starve the workers and the relay on
    the same cores: measured on 2 cores, PPO's first 2048 steps took 16.7 s
    with 2 threads and 2.0 s with 1 (docs/vector_env.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(workers=2, envs_per_worker=4)
    try:
        yield fleet
    finally:
        fleet.close()


def mean_return(model: PPO, vec: VecEnv) -> float:
    # Stochastic actions: a deterministic untrained MLP often balances by luck.
    mean, _ = evaluate_policy(model, vec, n_eval_episodes=10, deterministic=False, warn=False)
    return float(np.mean(mean))


def test_sb3_ppo_learns_cartpole_through_the_fleet(fleet: Fleet) -> None:
    vec = VecMonitor(FleetVecEnv(RemoteVectorEnv(fleet, "CartPole-v1", 4)))
    try:
        assert sorted(set(vec.venv.venv.env_workers)) == ["local-0", "local-1"]  # type: ignore[attr-defined]
        model = PPO("MlpPolicy", vec, n_steps=256, batch_size=64, n_epochs=4, seed=0)
        before = mean_return(model, vec)
        model.learn(total_timesteps=10_240)
        after = mean_return(model, vec)
        # The same budget and bar as the in-process test (about 20 before, 130-160 after).
        assert before < 40 and after >= max(3.0 * before, 75.0), (before, after)
    finally:
        vec.close()


def test_sb3_wrappers_see_terminal_observations_and_reset_infos(fleet: Fleet) -> None:
    vec = VecNormalize(VecMonitor(FleetVecEnv(RemoteVectorEnv(fleet, "CartPole-v1", 2))))
    try:
        vec.seed(3)
        assert np.asarray(vec.reset()).shape == (2, 4)
        episodes = 0
        for _ in range(200):
            _, _, dones, infos = vec.step(np.array([1, 1]))
            for i in np.flatnonzero(dones):
                episodes += 1
                assert infos[i]["terminal_observation"].shape == (4,)
                assert "episode" in infos[i]  # VecMonitor's episode statistics
                assert LOST not in infos[i]
        assert episodes >= 2
        assert vec.obs_rms.count > 200  # type: ignore[attr-defined]  # VecNormalize saw every step
    finally:
        vec.close()


def test_cleanrl_style_ppo_learns_cartpole_through_the_fleet(fleet: Fleet) -> None:
    envs = RecordEpisodeStatistics(FleetVectorEnv(RemoteVectorEnv(fleet, "CartPole-v1", 4)))
    try:
        returns = train_ppo(envs, iterations=20)
    finally:
        envs.close()
    first, last = float(np.mean(returns[:20])), float(np.mean(returns[-10:]))
    # The in-process test's bar: random play lasts about 20 steps.
    assert first < 40 and last >= max(3.0 * first, 75.0), (first, last)


def test_gymnasium_vector_wrappers_work_over_the_fleet(fleet: Fleet) -> None:
    envs = NormalizeObservation(
        RecordEpisodeStatistics(FleetVectorEnv(RemoteVectorEnv(fleet, "CartPole-v1", 2)))
    )
    try:
        envs.reset(seed=[4, 5])  # type: ignore[arg-type]  # per-env seeds, as gymnasium allows
        episodes = 0
        for _ in range(150):
            _, _, terminated, truncated, infos = envs.step(np.array([0, 0]))
            episodes += int(np.sum(terminated | truncated))
            if "episode" in infos:
                assert np.all(infos["episode"]["l"][infos["_episode"]] > 0)
        assert episodes >= 2
    finally:
        envs.close()


def test_tianshou_collector_gets_the_same_data_from_the_fleet_as_in_process(fleet: Fleet) -> None:
    """tianshou's Collector on RemoteVectorEnv, as on RayVectorEnv: the same
    buffer as over DummyVectorEnv, step for step (seeded, then seedless resets)."""
    buffers = []
    for venv in (DummyVectorEnv([CARTPOLE] * 3), RemoteVectorEnv(fleet, CARTPOLE, 3)):
        venv.seed(11)  # applied by the collector's reset
        buffers.append(collect(venv))
        assert venv.closed
    local, remote = buffers
    assert consistent_transitions(local) == consistent_transitions(remote) > 300
    np.testing.assert_array_equal(local.obs, remote.obs)
    np.testing.assert_array_equal(local.act, remote.act)
    np.testing.assert_array_equal(local.rew, remote.rew)
