"""tianshou's own Collector and AsyncCollector over rlfleet's vector envs.

tianshou drives a vector env through its API (``reset(env_id=...)``,
``step(action, id)``, ``is_async``, ``waiting_id``, ``info["env_id"]``); these
tests run the real tianshou on Dummy, Subproc and Remote vector envs, and
compare rlfleet's seeding with tianshou's own vector envs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import tianshou.env
from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import AsyncCollector, Batch, Collector, VectorReplayBuffer

from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.envs import BaseVectorEnv, DummyVectorEnv, EnvConfig, SubprocVectorEnv

CARTPOLE = EnvConfig("CartPole-v1")
TESTING = ("rlfleet.envs.testing",)


class AlternatingPolicy(Policy):
    """Deterministic: row k of a batch gets action k % 2."""

    def forward(self, batch: Any, state: Any = None, **kwargs: Any) -> Any:
        return Batch(act=np.arange(len(batch.obs)) % 2, state=state)


def consistent_transitions(buffer: VectorReplayBuffer) -> int:
    """Checks that each env's stored steps chain (obs of t+1 == obs_next of t).

    Returns:
        The number of stored steps.
    """
    steps = 0
    for sub in buffer.buffers:
        n = len(sub)
        steps += n
        for t in range(n - 1):
            if not (sub.terminated[t] or sub.truncated[t]):
                np.testing.assert_array_equal(sub.obs[t + 1], sub.obs_next[t])
    return steps


def collect(venv: BaseVectorEnv) -> VectorReplayBuffer:
    buffer = VectorReplayBuffer(4000, len(venv))
    policy = AlternatingPolicy(action_space=gym.spaces.Discrete(2))
    # tianshou duck-types its vector envs; its annotation names its own class.
    collector: Collector = Collector(policy, venv, buffer)  # type: ignore[arg-type]
    collector.reset()
    stats = collector.collect(n_step=300)
    assert stats.n_collected_steps >= 300
    stats = collector.collect(n_episode=6)
    assert stats.n_collected_episodes >= 6
    assert stats.returns_stat is not None and stats.lens_stat is not None
    assert stats.returns_stat.mean == stats.lens_stat.mean  # CartPole pays 1 per step
    collector.close()
    return buffer


def test_collector_gets_the_same_data_from_dummy_and_subprocess_envs() -> None:
    buffers = []
    for venv in (DummyVectorEnv([CARTPOLE] * 3), SubprocVectorEnv([CARTPOLE] * 3)):
        venv.seed(11)  # applied by the collector's reset
        buffers.append(collect(venv))
        assert venv.closed
    dummy, subproc = buffers
    assert consistent_transitions(dummy) == consistent_transitions(subproc) > 300
    np.testing.assert_array_equal(dummy.obs, subproc.obs)
    np.testing.assert_array_equal(dummy.act, subproc.act)


def test_waiting_id_and_step_none_collect_what_is_in_flight() -> None:
    """tianshou's async calls: ``waiting_id`` and ``step(None, id=waiting_id)``.

    (tianshou 2.0.1's own AsyncCollector fails on its own SubprocVectorEnv,
    in its policy-output bookkeeping, so it is not used here.)
    """
    slow = EnvConfig(
        "rlfleet/Hanging-v0", {"hang_seconds": 1.0, "length": 5}, imports=("rlfleet.envs.testing",)
    )
    counter = EnvConfig("rlfleet/Counter-v0", {"length": 5}, imports=("rlfleet.envs.testing",))
    venv = SubprocVectorEnv([counter, slow], wait_num=1)
    try:
        venv.reset()
        _, _, _, _, infos = venv.step([0, 0])
        assert [info["env_id"] for info in infos] == [0]
        assert venv.waiting_id == [1]
        _, _, _, _, infos = venv.step(None, id=venv.waiting_id)
        assert [info["env_id"] for info in infos] == [1] and venv.waiting_id == []
    finally:
        venv.close()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(workers=2, envs_per_worker=4, imports=TESTING)
    try:
        yield fleet
    finally:
        fleet.close()


def test_seed_gives_what_tianshous_own_vector_envs_give() -> None:
    """seed() reseeds at once: steps right after it, and the seedless reset
    after them, match tianshou's DummyVectorEnv step for step."""
    fns = [lambda: gym.make("CartPole-v1")] * 3
    theirs = tianshou.env.DummyVectorEnv(fns)
    for ours in (DummyVectorEnv(fns), SubprocVectorEnv(fns)):
        assert ours.seed(5) == theirs.seed(5)
        actions = np.array([1, 0, 1])
        for _ in range(3):
            np.testing.assert_array_equal(ours.step(actions)[0], theirs.step(actions)[0])
        np.testing.assert_array_equal(ours.reset()[0], theirs.reset()[0])
        theirs.seed(5)  # the same start for the next class
        ours.close()
    theirs.close()


class RecurrentLookingPolicy(AlternatingPolicy):
    """AlternatingPolicy plus a hidden state and a policy entry: tianshou
    2.0.1's AsyncCollector indexes both, and fails without them, on its own
    vector envs too (docs/vector_env.md)."""

    def forward(self, batch: Any, state: Any = None, **kwargs: Any) -> Any:
        rows = len(batch.obs)
        return Batch(
            act=np.arange(rows) % 2, state=np.zeros((rows, 1)), policy=Batch(row=np.arange(rows))
        )


def collect_async(venv: BaseVectorEnv) -> VectorReplayBuffer:
    buffer = VectorReplayBuffer(4000, len(venv))
    policy = RecurrentLookingPolicy(action_space=gym.spaces.Discrete(2))
    collector: AsyncCollector = AsyncCollector(policy, venv, buffer)  # type: ignore[arg-type]
    collector.reset()
    assert collector.collect(n_step=200).n_collected_steps >= 200
    assert collector.collect(n_episode=4).n_collected_episodes >= 4
    collector.close()
    return buffer


@pytest.mark.filterwarnings("ignore:Using async setting")
def test_async_collector_with_wait_num_on_subproc_and_remote_envs(fleet: Fleet) -> None:
    slow = EnvConfig("rlfleet/Slow-v0", {"length": 20, "max_seconds": 0.01}, imports=TESTING)
    for venv in (
        SubprocVectorEnv([slow] * 4, wait_num=2),
        RemoteVectorEnv(fleet, slow, 4, wait_num=2),
    ):
        assert venv.is_async
        buffer = collect_async(venv)
        assert consistent_transitions(buffer) >= 200


def test_remote_vector_env_takes_tianshous_env_fns(fleet: Fleet) -> None:
    """RayVectorEnv(env_fns)'s counterpart: each env from its own factory (a
    lambda: code, which an embedded fleet's own workers take), and the
    Collector fills the same buffer as over DummyVectorEnv."""
    env_fns = [lambda n=n: gym.make("CartPole-v1", max_episode_steps=n) for n in (30, 40, 50)]
    remote = RemoteVectorEnv(env_fns, on=fleet)
    assert remote.get_env_attr("_max_episode_steps") == [30, 40, 50]
    buffers = []
    for venv in (DummyVectorEnv(env_fns), remote):
        venv.seed(11)
        buffers.append(collect(venv))
    local, leased = buffers
    assert consistent_transitions(local) == consistent_transitions(leased) > 300
    np.testing.assert_array_equal(local.obs, leased.obs)
    np.testing.assert_array_equal(local.truncated, leased.truncated)
