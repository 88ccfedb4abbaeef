"""The native backend is a BaseVectorEnv: tianshou's API over one native vector env.

Both backends (gymnasium's CartPole ``vector_entry_point`` and envpool's
CartPole) are compared with the raw native env they wrap: the same seeds
and actions give the same bits, next-step autoreset included. What a
native env cannot do (a subset of envs, per-env seeds, attributes and
methods of one env) is refused with an error naming what to use instead.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet import BaseVectorEnv, NativeVectorEnv
from rlfleet.errors import UsageError, VectorEnvError
from tests.test_native_backends import BACKENDS

N = 4
LIMIT = 30
PER_ENV = "DummyVectorEnv or SubprocVectorEnv"


def make(backend: str) -> NativeVectorEnv:
    return NativeVectorEnv("CartPole-v1", {}, backend, N, LIMIT)


def raw(backend: str, seed: int) -> Any:
    """The native env as gymnasium or envpool makes it, seeded as NativeVectorEnv seeds it."""
    if backend == "envpool":
        import envpool

        return envpool.make_gymnasium("CartPole-v1", num_envs=N, seed=seed, max_episode_steps=LIMIT)
    return gym.make_vec(
        "CartPole-v1", num_envs=N, vectorization_mode="vector_entry_point", max_episode_steps=LIMIT
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_native_backend_steps_the_same_bits_as_its_raw_env(backend: str) -> None:
    seed, steps = 7, 3 * LIMIT
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, N))
    reference = raw(backend, seed)
    want_obs, _ = reference.reset() if backend == "envpool" else reference.reset(seed=seed)
    with make(backend) as venv:
        assert isinstance(venv, BaseVectorEnv) and len(venv) == N
        obs, infos = venv.reset(seed=seed)
        np.testing.assert_array_equal(obs, want_obs)
        assert [info["env_id"] for info in infos] == list(range(N))
        ended = np.zeros(N, dtype=bool)
        restarts = 0
        for t in range(steps):
            want = reference.step(actions[t])
            obs, rewards, terminated, truncated, infos = venv.step(actions[t])
            for got, expected in zip((obs, rewards, terminated, truncated), want, strict=False):
                np.testing.assert_array_equal(got, expected)
            autoreset = np.array([info.get("autoreset", False) for info in infos])
            np.testing.assert_array_equal(autoreset, ended)  # the step after an end
            assert np.all(rewards[autoreset] == 0) and not (terminated | truncated)[autoreset].any()
            restarts += int(autoreset.sum())
            ended = terminated | truncated
        assert restarts > 0  # episodes ended and went on without reset(id=...)
    reference.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeds_reset_the_whole_env_and_repeat(backend: str) -> None:
    with make(backend) as one, make(backend) as two:
        assert one.seed(11) == [[11 + i] for i in range(N)]  # a reset with seed 11, now
        two.reset(seed=[11, 12, 13, 14])  # the same as seed=11
        actions = np.zeros(N, np.int64)
        np.testing.assert_array_equal(one.step(actions)[0], two.step(actions)[0])
        assert one.get_env_attr("action_space") == [gym.spaces.Discrete(2)] * N
        assert one.observation_space[0] == gym.make("CartPole-v1").observation_space
        assert one.get_env_attr("max_episode_length", id=[1]) == [LIMIT]


def test_what_a_native_env_cannot_do_is_refused_with_what_to_use_instead() -> None:
    venv = make("vector_entry_point")
    refused = {
        "step some envs": lambda: venv.step(np.zeros(2, np.int64), id=[0, 1]),
        "reset some envs": lambda: venv.reset(id=[1]),
        "seeds of your choice": lambda: venv.reset(seed=[1, 5, 6, 7]),
        "reset options": lambda: venv.reset(options={"x": 1}),
        "any attribute of an env": lambda: venv.get_env_attr("state"),
        "set_env_attr": lambda: venv.set_env_attr("gravity", 1.0),
        "render": venv.render,
        "call_env_method": lambda: venv.call_env_method("close"),
        "class_names": venv.class_names,
        "step_and_reset": lambda: venv.step_and_reset(np.zeros(N, np.int64), None, []),
        # A worker's engine drives it whole (reset_all, step_all), never through these.
        "reset_env": lambda: venv.reset_env(0, 5),
        "step_envs": lambda: venv.step_envs([0, 1], [0, 0]),
    }
    for call in refused.values():
        with pytest.raises(UsageError, match=PER_ENV):
            call()
    with pytest.raises(UsageError, match="cannot rebuild one env"):
        venv.rebuild_env(0)
    with pytest.raises(VectorEnvError, match="must be reset first"):
        venv.step(np.zeros(N, np.int64))
    venv.reset(seed=0)
    venv.step(np.zeros(N, np.int64))
    # An env that raises leaves every env's state unknown: a reset comes first.
    with pytest.raises(VectorEnvError, match="call reset\\(\\) before stepping again"):
        venv.step(np.full(N, 7, np.int64))  # not in Discrete(2): CartPole raises
    with pytest.raises(VectorEnvError, match="must be reset first"):
        venv.step(np.zeros(N, np.int64))
    venv.reset()
    venv.step(np.zeros(N, np.int64))
    venv.close()
    venv.close()
    with pytest.raises(UsageError, match="closed"):
        venv.reset()


def test_a_native_worker_checks_its_env_actions_without_gymnasiums_contains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CartPole's vector step asserts its actions are in its MultiDiscrete space: the
    whole-batch check answers for the batches a worker hands it, every vector step."""
    from rlfleet.worker import VecWorker
    from tests.test_native_backends import mlp, native, units

    calls = []
    contains = gym.spaces.MultiDiscrete.contains

    def counted(space: gym.spaces.MultiDiscrete, x: Any) -> bool:
        calls.append(1)
        return contains(space, x)

    monkeypatch.setattr(gym.spaces.MultiDiscrete, "contains", counted)
    worker = VecWorker(n_envs=8, env=native("vector_entry_point"), policy=mlp())
    try:
        worker.submit(units(3))  # idle slots too: their placeholder actions are checked
        for _ in range(5):
            worker.step()
        worker.submit(units(20, start=3))
        while not worker.idle:
            worker.step()
        batch = worker.take_finished()
    finally:
        worker.shutdown()
    assert batch is not None and len(batch.lengths) == 23
    assert calls == []


@pytest.mark.parametrize("check_actions", [True, False])
def test_a_native_worker_looks_at_each_batchs_values_once_not_again_in_the_env(
    monkeypatch: pytest.MonkeyPatch, check_actions: bool
) -> None:
    """The worker's range check of a batch is the env's own: once every slot runs, the
    env does not reduce the batch again; with the worker's checks off, it does."""
    import rlfleet.envs.native as native_module
    from rlfleet.worker import VecWorker
    from tests.test_native_backends import mlp, native, units

    env_checks = []
    within = native_module.all_within

    def counted(array: np.ndarray, high: int) -> bool | None:
        env_checks.append(1)
        return within(array, high)

    monkeypatch.setattr(native_module, "all_within", counted)
    worker = VecWorker(
        n_envs=8, env=native("vector_entry_point"), policy=mlp(), check_actions=check_actions
    )
    try:
        worker.submit(units(400))  # more than the slots: every slot runs at every step
        for _ in range(50):
            worker.step()
        batch = worker.take_finished()
    finally:
        worker.shutdown()
    assert batch is not None and len(batch.lengths) > 8
    assert len(env_checks) == (0 if check_actions else 50)


def test_a_vouched_batch_skips_only_the_range_pass_and_only_for_its_step() -> None:
    env = make("vector_entry_point")
    try:
        env.reset_all(0)
        space = env._env.unwrapped.action_space
        assert env.vouches_for(gym.spaces.Discrete(2))
        for other in (
            gym.spaces.Discrete(3),
            gym.spaces.Discrete(2, start=1),
            gym.spaces.MultiDiscrete([2]),
        ):
            assert not env.vouches_for(other)
        outside = np.array([0, 1, 2, 0])
        space.vouched = outside  # what a vouch claims: the caller checked its range
        try:
            assert space.contains(outside)
            assert not space.contains(outside.copy())  # another array is checked
            assert not space.contains(outside.astype(np.uint64))  # shape and dtype still are
            assert not space.contains(outside[:3])
        finally:
            space.vouched = None
        assert not space.contains(outside)
        good = np.array([0, 1, 1, 0])
        env.step_all(good, vouched=True)
        assert space.vouched is None
        with pytest.raises(AssertionError, match="invalid"):  # an unvouched step checks it all
            env.step_all(outside)
        failing = np.array([0, 1, 1, 0], dtype=np.uint64)
        with pytest.raises(AssertionError, match="invalid"):
            env.step_all(failing, vouched=True)
        assert space.vouched is None  # cleared when the env's step raises too
    finally:
        env.close()


@pytest.mark.parametrize(
    "actions",
    [
        np.array([0, 1, 2, 0]),  # past the range
        np.array([0, -1, 1, 0]),  # negative
        np.array([0, 1, 1]),  # one row short
        np.array([0.0, 1.0, 1.0, 0.0]),  # floats
        np.array([0, 1, 1, 0], dtype=np.uint64),  # not castable to int64
        [0, 1, 7, 0],  # a list, past the range
    ],
)
def test_cartpoles_own_action_check_still_refuses_a_bad_batch(actions: Any) -> None:
    env = make("vector_entry_point")
    try:
        env.reset_all(0)
        space = env._env.unwrapped.action_space
        assert not gym.spaces.MultiDiscrete([2] * N).contains(actions)
        assert not space.contains(actions)
        with pytest.raises(AssertionError, match="invalid"):
            env.step_all(actions)
    finally:
        env.close()


def test_the_quick_action_space_is_gymnasiums_for_everything_else() -> None:
    env = make("vector_entry_point")
    try:
        space = env._env.unwrapped.action_space
        plain = gym.spaces.MultiDiscrete([2] * N)
        assert isinstance(space, gym.spaces.MultiDiscrete)
        assert space == plain and repr(space) == repr(plain)
        for good in (np.zeros(N, dtype=np.int64), np.ones(N, dtype=np.int32), [1, 0, 1, 0]):
            assert space.contains(good) and plain.contains(good)
    finally:
        env.close()
