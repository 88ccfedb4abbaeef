"""tianshou's own Collector over rlfleet's vector envs.

tianshou drives a vector env through its API (``reset(env_id=...)``,
``step(action, id)``, ``is_async``, ``waiting_id``, ``info["env_id"]``); these
tests run the real tianshou on Dummy and Subproc vector envs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from tianshou.algorithm.algorithm_base import Policy
from tianshou.data import Batch, Collector, VectorReplayBuffer

from rlfleet.envs import BaseVectorEnv, DummyVectorEnv, EnvConfig, SubprocVectorEnv

CARTPOLE = EnvConfig("CartPole-v1")


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
