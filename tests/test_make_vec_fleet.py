"""gym.make_vec("rlfleet/Fleet-v0", ...): the fleet for any make_vec user (RLlib's new stack).

RLlib is not installed for the test suite; its SingleAgentEnvRunner builds
its envs with exactly this call (``gym_env_vectorize_mode="vector_entry_point"``,
``env_config`` as keyword arguments), so gymnasium's own make_vec stands for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest

import rlfleet
from rlfleet.client import Fleet
from rlfleet.errors import ConfigError
from rlfleet.integrations.gymnasium import FleetVectorEnv


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(workers=2, envs_per_worker=2)
    try:
        yield fleet
    finally:
        fleet.close()


def assert_steps_like_sync_vector_env(envs: gym.vector.VectorEnv, steps: int = 60) -> None:
    reference = gym.make_vec("CartPole-v1", num_envs=envs.num_envs, vectorization_mode="sync")
    try:
        for got, want in zip(envs.reset(seed=3), reference.reset(seed=3), strict=True):
            if isinstance(got, np.ndarray):
                np.testing.assert_array_equal(got, want)
        actions = np.random.default_rng(0).integers(0, 2, size=(steps, envs.num_envs))
        for row in actions:  # episodes end and autoreset (NEXT_STEP) on the way
            for got, want in zip(envs.step(row)[:4], reference.step(row)[:4], strict=True):
                np.testing.assert_array_equal(got, want)
    finally:
        reference.close()


def test_importing_rlfleet_registers_the_fleet_id() -> None:
    assert rlfleet.envs.FLEET_ENV_ID == "rlfleet/Fleet-v0"
    spec = gym.spec("rlfleet/Fleet-v0")
    assert spec.vector_entry_point == "rlfleet.integrations.gymnasium:make_fleet_vector_env"


@pytest.mark.parametrize("where", ["address", "fleet"])
def test_make_vec_leases_envs_on_a_fleet(fleet: Fleet, where: str) -> None:
    envs = gym.make_vec(
        "rlfleet/Fleet-v0",
        num_envs=3,
        vectorization_mode="vector_entry_point",
        fleet=fleet.address if where == "address" else fleet,
        env="CartPole-v1",
    )
    try:
        assert isinstance(envs, FleetVectorEnv) and envs.num_envs == 3
        assert envs.single_action_space == gym.spaces.Discrete(2)
        assert_steps_like_sync_vector_env(envs)
    finally:
        envs.close()
    assert envs.venv.closed


def test_make_vec_without_a_fleet_starts_one_of_its_own() -> None:
    envs = gym.make_vec(
        "rlfleet/Fleet-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        env="CartPole-v1",
        env_kwargs={"sutton_barto_reward": False},
        max_episode_steps=20,
    )
    try:
        assert envs.venv.env_spec.max_episode_length == 20  # type: ignore[attr-defined]
        workers = list(envs.venv.own_fleet.workers)  # type: ignore[attr-defined]
        assert workers and all(w.process.poll() is None for w in workers)
    finally:
        envs.close()
    for worker in workers:  # closed with the env
        assert worker.process.wait(timeout=60) is not None


def test_make_vec_arguments_are_checked() -> None:
    with pytest.raises(ConfigError, match="needs env= a gymnasium id"):
        gym.make_vec("rlfleet/Fleet-v0", num_envs=2, vectorization_mode="vector_entry_point")
