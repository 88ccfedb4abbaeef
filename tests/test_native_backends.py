"""Native vector-env backends (class B, docs/reliability.md): CartPole's
gymnasium vector entry point and envpool's CartPole, in a VecWorker and
through real worker processes of ``Fleet.local``.

Well-formedness is checked against CartPole's physics, not against the
backend's own flags: every episode must start at a reset (all four state
values within gymnasium's reset bounds), a TERMINAL episode must end past a
threshold, a TIMEOUT one exactly at the limit and inside the thresholds.
An episode that began mid-way in its env (the bug a native backend invites)
fails the first check.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

from rlfleet import LocalSampler
from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.core import EpisodeBatch, StepType
from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, EnvError, EnvNotFoundError, PolicyError, RlfleetError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy
from rlfleet.v1 import leases_pb2
from rlfleet.wire.leases import LeaseCreateOrder, decode_lease_command
from rlfleet.worker import EpisodeUnit, VecWorker
from rlfleet.worker.leases.leased_env import lease_config
from tests.fleet_processes import ProcessFleet

BACKENDS = ["vector_entry_point", "envpool"]
RESET_BOUND = 0.05  # gymnasium's and envpool's CartPole reset draw U(-0.05, 0.05)
X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * math.pi / 360
LIMIT = 30


def native(backend: str, limit: int = LIMIT) -> EnvConfig:
    return EnvConfig("CartPole-v1", max_episode_length=limit, vectorization=backend)


def units(count: int, start: int = 0, request: int = 0) -> list[EpisodeUnit]:
    return [EpisodeUnit(i, 1000 + i, 2000 + i, request) for i in range(start, start + count)]


def mlp(seed: int = 0) -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(
        EnvConfig("CartPole-v1").env_spec(), hidden_sizes=(16, 16), seed=seed
    )


def check_cartpole_episodes(batch: EpisodeBatch, limit: int) -> None:
    """Every episode is a whole CartPole episode from reset to its end."""
    lengths = batch.lengths
    assert lengths.min() >= 1 and lengths.max() <= limit
    ends = np.cumsum(lengths)
    starts = ends - lengths
    assert len(batch.observations) == ends[-1] == len(batch.step_types)
    for start, end, last_obs in zip(starts, ends, batch.last_observations, strict=True):
        types = batch.step_types[start:end]
        first_obs = batch.observations[start]
        assert np.all(np.abs(first_obs) <= RESET_BOUND), f"episode starts mid-way: {first_obs}"
        assert types[-1] in (StepType.TERMINAL, StepType.TIMEOUT)
        if end - start > 1:
            assert types[0] == StepType.FIRST
            assert np.all(types[1:-1] == StepType.MID)
        # One continuous trajectory (no reset inside): Euler's x' = x + tau * x_dot.
        path = np.vstack([batch.observations[start:end], last_obs[None]]).astype(np.float64)
        np.testing.assert_allclose(path[1:, 0], path[:-1, 0] + 0.02 * path[:-1, 1], atol=1e-5)
        out = abs(last_obs[0]) > X_LIMIT or abs(last_obs[2]) > THETA_LIMIT
        if types[-1] == StepType.TERMINAL:
            assert out, f"TERMINAL inside the thresholds: {last_obs}"
        else:
            # At the limit a fall may come as TIMEOUT: envpool reports it as
            # truncated, not terminated (docs/reliability.md).
            assert end - start == limit
        assert np.all(batch.rewards[start:end] == 1.0)  # never the autoreset step's 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_vec_worker_runs_whole_episodes_labelled_without_env_seed(backend: str) -> None:
    worker = VecWorker(n_envs=8, env=native(backend), policy=mlp())
    try:
        batch = worker.run(units(40))
    finally:
        worker.shutdown()
    check_cartpole_episodes(batch, LIMIT)
    assert batch.episode_infos["episode_index"].tolist() == list(range(40))
    assert np.all(batch.episode_infos["env_seed"] == NO_ENV_SEED)
    # The actions come from the worker's one batch generator, not from these seeds.
    assert np.all(batch.episode_infos["policy_seed"] == NO_POLICY_SEED)
    assert (batch.step_types[np.cumsum(batch.lengths) - 1] == StepType.TIMEOUT).any()
    assert batch.env_spec.max_episode_length == LIMIT


@pytest.mark.parametrize("backend", BACKENDS)
def test_idle_slots_and_updates_never_start_an_episode_mid_way(backend: str) -> None:
    """Slots idle while others run, and an agent update aborts every episode:
    the envs went on unseen, yet every recorded episode starts at a reset."""
    worker = VecWorker(n_envs=8, env=native(backend), policy=mlp())
    try:
        worker.submit(units(3))
        for _ in range(12):
            worker.step()
        worker.submit(units(9, start=3))
        for _ in range(7):
            worker.step()
        worker.update_agent(mlp(seed=1))  # aborts and re-queues what runs
        worker.submit(units(6, start=12))
        while not worker.idle:
            worker.step()
        batch = worker.take_finished()
    finally:
        worker.shutdown()
    assert batch is not None
    check_cartpole_episodes(batch, LIMIT)
    assert batch.episode_infos["episode_index"].tolist() == list(range(18))


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_layout_and_units_give_the_same_batch(backend: str) -> None:
    """Class B's promise: same n_envs, same policy, same units => same batch."""

    def sample() -> EpisodeBatch:
        worker = VecWorker(n_envs=8, env=native(backend), policy=mlp())
        try:
            return worker.run(units(30))
        finally:
            worker.shutdown()

    first, second = sample(), sample()
    assert np.array_equal(first.lengths, second.lengths)
    assert np.array_equal(first.observations, second.observations)
    assert np.array_equal(first.actions, second.actions)
    assert np.array_equal(first.step_types, second.step_types)
    assert np.array_equal(first.agent_infos["log_prob"], second.agent_infos["log_prob"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_native_workers_sample_the_batch_from_the_first_units_policy_seed(backend: str) -> None:
    """The first vector step is one ``get_actions_batched`` call on
    ``default_rng(policy_seed)`` of the unit that reset the whole env, so
    that seed (and only the batch's draws) decides the actions."""

    def sample(policy_seed: int) -> EpisodeBatch:
        worker = VecWorker(n_envs=8, env=native(backend), policy=mlp())
        first = [EpisodeUnit(i, 1000 + i, policy_seed + i, 0) for i in range(8)]
        try:
            return worker.run(first)
        finally:
            worker.shutdown()

    batch = sample(2000)
    starts = np.cumsum(batch.lengths) - batch.lengths
    # Units 0-7 begin on slots 0-7 at the whole env's reset: the batch's rows in order.
    want, infos = mlp().get_actions_batched(batch.observations[starts], np.random.default_rng(2000))
    assert np.array_equal(batch.actions[starts], want)
    np.testing.assert_allclose(batch.agent_infos["log_prob"][starts], infos["log_prob"])
    other = sample(5000)
    other_starts = np.cumsum(other.lengths) - other.lengths
    # The same env reset (same env seed), other draws: other actions.
    assert np.array_equal(other.observations[other_starts], batch.observations[starts])
    assert not np.array_equal(other.actions[other_starts], batch.actions[starts])


def test_a_worker_switching_to_gym_envs_and_back_keeps_each_class() -> None:
    """The native path keeps no slot cache of the gym path's: after a native
    env, a gym env's batch is class A again (the same as a fresh worker's)."""
    gym_env = EnvConfig("CartPole-v1", max_episode_length=LIMIT)
    worker = VecWorker(n_envs=8, env=native("vector_entry_point"), policy=mlp())
    fresh = VecWorker(n_envs=8, env=gym_env, policy=mlp())
    try:
        first = worker.run(units(20))
        worker.update_env(gym_env)
        middle = worker.run(units(20, start=20))
        worker.update_env(native("vector_entry_point"))
        last = worker.run(units(20, start=40))
        reference = fresh.run(units(20, start=20))
    finally:
        worker.shutdown()
        fresh.shutdown()
    for batch in (first, last):
        check_cartpole_episodes(batch, LIMIT)
        assert np.all(batch.episode_infos["policy_seed"] == NO_POLICY_SEED)
    assert middle.episode_infos["policy_seed"].tolist() == [2020 + i for i in range(20)]
    assert np.array_equal(middle.observations, reference.observations)
    assert np.array_equal(middle.actions, reference.actions)


def test_box_actions_with_idle_slots_repeat_themselves_on_envpool() -> None:
    """Gaussian batches (Box actions) with slots idling while others run: idle
    rows get the placeholder action, and the batch repeats for the same calls."""
    config = EnvConfig("Pendulum-v1", max_episode_length=20, vectorization="envpool")
    policy = MLPGaussianPolicy(EnvConfig("Pendulum-v1").env_spec(), seed=0)

    def sample() -> EpisodeBatch:
        worker = VecWorker(n_envs=8, env=config, policy=policy)
        try:
            worker.submit(units(3))
            for _ in range(5):
                worker.step()
            worker.submit(units(13, start=3))
            while not worker.idle:
                worker.step()
            batch = worker.take_finished()
            assert batch is not None
            return batch
        finally:
            worker.shutdown()

    first, second = sample(), sample()
    assert first.lengths.tolist() == [20] * 16 and first.actions.shape == (320, 1)
    assert np.all(first.step_types[19::20] == StepType.TIMEOUT)
    assert np.array_equal(first.observations, second.observations)
    assert np.array_equal(first.actions, second.actions)


class _OneActionShort(MLPCategoricalPolicy):
    def get_actions_batched(self, observations: Any, generator: Any) -> Any:
        actions, infos = super().get_actions_batched(observations, generator)
        return actions[1:], infos


def test_bad_batched_actions_are_a_policy_error_naming_the_batched_call() -> None:
    worker = VecWorker(
        n_envs=4,
        env=native("vector_entry_point"),
        policy=_OneActionShort(EnvConfig("CartPole-v1").env_spec(), seed=0),
    )
    try:
        worker.submit(units(4))
        with pytest.raises(
            PolicyError, match=r"_OneActionShort\.get_actions_batched returned actions of shape"
        ):
            worker.step()
        assert worker.queued_count == 4  # aborted and re-queued, nothing recorded
    finally:
        worker.shutdown()


def test_local_sampler_runs_native_workers_and_repeats_itself() -> None:
    """LocalSampler steps its workers one after the other: the same call sequence."""

    def sample() -> EpisodeBatch:
        sampler = LocalSampler(native("vector_entry_point"), n_workers=2, envs_per_worker=8)
        try:
            return sampler.obtain_samples(0, 1000, "mlp-categorical")
        finally:
            sampler.close()

    first, second = sample(), sample()
    check_cartpole_episodes(first, LIMIT)
    assert np.all(first.episode_infos["env_seed"] == NO_ENV_SEED)
    assert np.all(first.episode_infos["policy_seed"] == NO_POLICY_SEED)
    assert np.array_equal(first.observations, second.observations)
    assert np.array_equal(first.actions, second.actions)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fleet_of_native_workers_delivers_checked_episodes(backend: str) -> None:
    """Two worker processes of 64 native envs each; the coordinator's result
    checks (rlfleet.wire.result_checks) accept env_seed and policy_seed -1 only
    because the fleet's env is native."""
    with Fleet.local(workers=2, envs_per_worker=64, env=native(backend)) as sampler:
        batch = sampler.obtain_samples(0, 4000, "mlp-categorical")
        check_cartpole_episodes(batch, LIMIT)
        assert batch.lengths.sum() >= 4000
        assert np.all(batch.episode_infos["env_seed"] == NO_ENV_SEED)
        assert np.all(batch.episode_infos["policy_seed"] == NO_POLICY_SEED)
        indices = batch.episode_infos["episode_index"]
        assert indices.tolist() == list(range(len(indices)))
        exact = sampler.obtain_episodes(50)
        check_cartpole_episodes(exact, LIMIT)
        assert len(exact.lengths) == 50
        with pytest.raises(RlfleetError, match="cannot keep fragment streams"):
            sampler.obtain_fragments(200, 10)
        with pytest.raises(RlfleetError, match="lease it without vectorization"):
            RemoteVectorEnv(sampler, native(backend), 2, open_timeout=30)
        pendulum = EnvConfig("Pendulum-v1", vectorization="vector_entry_point")
        with pytest.raises(RlfleetError, match="no native vector entry point"):
            sampler.obtain_samples(1, 100, env_update=pendulum)


def test_coordinator_flag_makes_its_workers_native(tmp_path: Path) -> None:
    """``rlfleet coordinator --env-vectorization envpool``: real coordinator and worker
    processes; a bad value stops the coordinator with the ConfigError's message."""
    with ProcessFleet(tmp_path) as fleet:
        fleet.start_coordinator(
            "--env-vectorization", "envpool", "--max-episode-length", str(LIMIT)
        )
        fleet.start_worker(envs=16)
        fleet.wait_for_workers(1)
        batch = fleet.sampler().obtain_samples(0, 500)
    check_cartpole_episodes(batch, LIMIT)
    assert np.all(batch.episode_infos["env_seed"] == NO_ENV_SEED)
    bad = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", "--listen", "127.0.0.1:0",
         "--env-vectorization", "sync"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "vectorization of 'CartPole-v1' is 'sync'" in bad.stderr


class _BreakingCartPoles(CartPoleVectorEnv):
    """CartPole's native vector env that raises at its 5th step after each reset."""

    def reset(self, **kwargs: Any) -> Any:
        self.calls = 0
        return super().reset(**kwargs)

    def step(self, action: Any) -> Any:
        self.calls += 1
        if self.calls == 5:
            raise RuntimeError("the native env broke")
        return super().step(action)


gym.register(
    "rlfleet-test/BreakingCartPoles-v0",
    entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
    vector_entry_point="tests.test_native_backends:_BreakingCartPoles",
    max_episode_steps=LIMIT,
)


def test_a_native_env_that_raises_fails_its_episodes_and_the_worker_goes_on() -> None:
    config = EnvConfig("rlfleet-test/BreakingCartPoles-v0", vectorization="vector_entry_point")
    worker = VecWorker(n_envs=4, env=config, policy=mlp())
    try:
        worker.submit(units(4))
        with pytest.raises(
            EnvError,
            match=r"native vector env .* raised RuntimeError: the native "
            r"env broke in step; the 4 episodes in flight were dropped",
        ) as info:
            while not worker.idle:
                worker.step()
        assert info.value.step == 5 and info.value.episode_index == 0
        assert worker.idle and worker.take_finished() is None  # nothing partial kept
        # The env is reset as a whole before the next episodes: they are whole.
        worker.submit(units(4, start=4))
        for _ in range(4):
            worker.step()
        assert worker.active_count == 4
    finally:
        worker.shutdown()


class _NanCartPoles(CartPoleVectorEnv):
    """CartPole's native vector env whose env 3 turns to NaN at its 3rd step, once."""

    calls = 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        if self.calls == 3:
            self.state[:, 3] = np.nan  # type: ignore[index]  # NaN (never terminating) until truncated
        return super().step(action)


gym.register(
    "rlfleet-test/NanCartPoles-v0",
    entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
    vector_entry_point="tests.test_native_backends:_NanCartPoles",
    max_episode_steps=LIMIT,
)


def test_a_nan_fails_a_running_episode_but_never_from_an_unrecorded_env() -> None:
    """The policy acts on every slot's row; only a running episode's NaN is an error."""
    config = EnvConfig("rlfleet-test/NanCartPoles-v0", vectorization="vector_entry_point")
    worker = VecWorker(n_envs=4, env=config, policy=mlp())
    try:
        worker.submit(units(4))
        with pytest.raises(EnvError, match=r"non-finite observation .* of episode 3,") as info:
            while not worker.idle:
                worker.step()
        assert info.value.episode_index == 3 and info.value.env_index == 3
    finally:
        worker.shutdown()
    # Slot 3 idles while 3 episodes run: its env turns NaN unrecorded, and
    # drains on NaN (up to 30 steps) while the others finish and start more.
    worker = VecWorker(n_envs=4, env=config, policy=mlp())
    try:
        worker.submit(units(3))
        for _ in range(4):
            worker.step()
        worker.submit(units(9, start=3))
        while not worker.idle:
            worker.step()
        batch = worker.take_finished()
    finally:
        worker.shutdown()
    assert batch is not None
    check_cartpole_episodes(batch, LIMIT)
    assert batch.episode_infos["episode_index"].tolist() == list(range(12))


def test_bad_native_configs_are_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="vectorization of 'CartPole-v1' is 'sync'"):
        EnvConfig("CartPole-v1", vectorization="sync")
    with pytest.raises(ConfigError, match="no native vector entry point"):
        VecWorker(n_envs=2, env=EnvConfig("Pendulum-v1", vectorization="vector_entry_point"))
    with pytest.raises(EnvNotFoundError, match="NoSuchEnv-v0"):
        VecWorker(n_envs=2, env=EnvConfig("NoSuchEnv-v0", vectorization="vector_entry_point"))
    with pytest.raises(ConfigError, match="envpool has no task 'NoSuchEnv-v0'"):
        VecWorker(n_envs=2, env=EnvConfig("NoSuchEnv-v0", vectorization="envpool"))
    with pytest.raises(ConfigError, match="not kwargs\\['max_episode_steps'\\]"):
        EnvConfig("CartPole-v1", {"max_episode_steps": 9}, vectorization="envpool")
    with pytest.raises(ConfigError, match="native vector env, not one env"):
        native("envpool")()
    worker = VecWorker(n_envs=2, env=native("vector_entry_point"))
    try:
        with pytest.raises(ConfigError, match="cannot keep fragment streams"):
            worker.collect_fragments(5, base_seed=0, first_stream=0)
    finally:
        worker.shutdown()
    assert_lease_refused("envpool")


def assert_lease_refused(vectorization: str) -> None:
    """A worker refuses to lease CartPole with this vectorization, saying what to do."""
    command = leases_pb2.LeaseCommand(lease_id=1)
    command.create.env.env_id = "CartPole-v1"
    command.create.env.vectorization = vectorization
    command.create.env_ids.append(0)
    order = decode_lease_command(command)
    assert isinstance(order, LeaseCreateOrder)
    with pytest.raises(ConfigError, match="lease it without vectorization"):
        lease_config(order.env, ())


def test_vectorization_survives_json_and_default_json_is_unchanged() -> None:
    config = native("envpool")
    assert EnvConfig.from_json(config.to_json()) == config
    assert "vectorization" not in json.loads(EnvConfig("CartPole-v1").to_json())
