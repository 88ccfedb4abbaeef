"""FleetVecEnv: rlfleet vector envs as a real Stable-Baselines3 VecEnv.

Runs against the real SB3 (PPO, VecNormalize, VecMonitor, Monitor) over
real Dummy and Subproc vector envs. The fleet variant (RemoteVectorEnv)
plugs into the same adapter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv, VecMonitor, VecNormalize

import rlfleet
from rlfleet.envs import BaseVectorEnv, DummyVectorEnv, EnvConfig, SubprocVectorEnv
from rlfleet.errors import ConfigError, UsageError
from rlfleet.integrations.sb3 import FleetVecEnv
from tests.test_integration_gymnasium import DICT_FNS, assert_same

TESTING = ("rlfleet.envs.testing",)


def counter(length: int = 3, limit: int | None = None) -> EnvConfig:
    return EnvConfig(
        "rlfleet/Counter-v0", {"length": length}, max_episode_length=limit, imports=TESTING
    )


def monitored_counter() -> gym.Env:
    return Monitor(counter()())


@pytest.fixture(params=[DummyVectorEnv, SubprocVectorEnv])
def make_vec(request: pytest.FixtureRequest) -> Iterator[Callable[..., FleetVecEnv]]:
    made: list[FleetVecEnv] = []

    def make(env_fns: list[Callable[[], gym.Env]]) -> FleetVecEnv:
        vec = FleetVecEnv(request.param(env_fns))
        made.append(vec)
        return vec

    yield make
    for vec in made:
        vec.close()


def test_is_a_vec_env_with_sb3_autoreset(make_vec: Callable[..., FleetVecEnv]) -> None:
    # Env 0 terminates after 3 steps; env 1 is truncated by its time limit after 2.
    vec = make_vec([counter(), counter(limit=2)])
    assert isinstance(vec, VecEnv) and vec.num_envs == 2
    assert vec.observation_space == gym.spaces.Box(0.0, 3.0, (1,), np.float32)
    assert vec.action_space == gym.spaces.Discrete(2)
    vec.seed(10)
    obs = vec.reset()
    assert np.asarray(obs).tolist() == [[0.0], [0.0]]
    assert [info["seed"] for info in vec.reset_infos] == [10, 11]
    vec.step_async(np.array([0, 0]))
    obs, rewards, dones, infos = vec.step_wait()
    assert np.asarray(obs).tolist() == [[1.0], [1.0]] and dones.tolist() == [False, False]
    assert rewards.dtype == np.float32
    obs, _, dones, infos = vec.step(np.array([0, 0]))
    assert dones.tolist() == [False, True]
    # The episode's last observation is in the info; obs is the new episode's first.
    assert infos[1]["terminal_observation"].tolist() == [2.0]
    assert "terminal_observation" not in infos[0]
    assert np.asarray(obs).tolist() == [[2.0], [0.0]]
    assert [info["TimeLimit.truncated"] for info in infos] == [False, True]
    obs, _, dones, infos = vec.step(np.array([0, 0]))
    assert dones.tolist() == [True, False] and np.asarray(obs).tolist() == [[0.0], [1.0]]
    assert infos[0]["terminal_observation"].tolist() == [3.0]
    assert [info["TimeLimit.truncated"] for info in infos] == [False, False]
    assert all("env_id" not in info for info in infos)
    # Autoreset does not reseed; seeds were used once.
    assert [info["seed"] for info in vec.reset_infos] == [None, None]
    with pytest.raises(UsageError, match="step_async"):
        vec.step_wait()


def test_options_seeds_and_attributes(make_vec: Callable[..., FleetVecEnv]) -> None:
    vec = make_vec([counter(), monitored_counter])
    vec.set_options([{"a": 1}, {}])
    vec.seed(3)
    vec.reset()
    assert [info["seed"] for info in vec.reset_infos] == [3, 4]
    assert vec.get_attr("length") == [3, 3]
    vec.set_attr("length", 7, indices=1)
    assert vec.get_attr("length", indices=[1]) == [7]
    assert vec.env_method("reset", seed=5, indices=0)[0][1] == {"seed": 5}
    assert vec.env_is_wrapped(Monitor) == [False, True]
    assert vec.env_is_wrapped(gym.Wrapper) == [True, True]  # EnvConfig adds gymnasium's
    assert vec.has_attr("length")


def test_vec_normalize_and_vec_monitor_wrap_it() -> None:
    vec = VecNormalize(VecMonitor(FleetVecEnv(DummyVectorEnv([counter(length=2)] * 2))))
    try:
        vec.reset()
        infos: list[dict[str, object]] = []
        for _ in range(2):
            _, rewards, _, infos = vec.step(np.array([0, 0]))
            assert rewards.dtype == np.float32
        assert [info["episode"]["r"] for info in infos] == [2.0, 2.0]  # type: ignore[index]
        assert vec.obs_rms.count > 1  # type: ignore[attr-defined]
    finally:
        vec.close()


def test_refuses_what_it_cannot_serve() -> None:
    async_venv = DummyVectorEnv([counter()] * 2, wait_num=1)
    with pytest.raises(ConfigError, match="wait_num=1"):
        FleetVecEnv(async_venv)
    async_venv.close()
    mixed = DummyVectorEnv([counter(length=2), counter(length=3)])
    with pytest.raises(ConfigError, match="one observation_space"):
        FleetVecEnv(mixed)
    mixed.close()
    with pytest.raises(ConfigError, match="BaseVectorEnv"):
        FleetVecEnv(object())  # type: ignore[arg-type]


def mean_return(model: PPO, vec: VecEnv) -> float:
    # Stochastic actions: a deterministic untrained MLP is a linear
    # controller, which often balances CartPole by luck.
    mean, _ = evaluate_policy(model, vec, n_eval_episodes=10, deterministic=False, warn=False)
    return float(np.mean(mean))


def test_ppo_learns_cartpole_through_subprocess_envs() -> None:
    venv: BaseVectorEnv = SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 4)
    vec = VecMonitor(FleetVecEnv(venv))
    threads = torch.get_num_threads()
    # torch's spinning threads starve the env processes on 2 cores (measured:
    # this test took 95 s with torch's default threads, 8 s with one).
    torch.set_num_threads(1)
    try:
        model = PPO("MlpPolicy", vec, n_steps=256, batch_size=64, n_epochs=4, seed=0)
        before = mean_return(model, vec)
        model.learn(total_timesteps=10_240)
        after = mean_return(model, vec)
        # Measured: about 20 before, 130-160 after.
        assert before < 40 and after >= max(3.0 * before, 75.0), (before, after)
    finally:
        torch.set_num_threads(threads)
        vec.close()


@pytest.mark.parametrize("env_fns", [[counter(), counter(limit=2)], DICT_FNS], ids=["box", "dict"])
def test_steps_exactly_like_sb3_dummy_vec_env(env_fns: list[Callable[[], gym.Env]]) -> None:
    ours = FleetVecEnv(DummyVectorEnv(env_fns))
    reference = DummyVecEnv(env_fns)
    try:
        assert ours.observation_space == reference.observation_space
        for vec in (ours, reference):
            vec.seed(4)
        assert_same(ours.reset(), reference.reset())
        assert_same(ours.reset_infos, reference.reset_infos)
        for step in range(7):
            actions = np.array([step % 2, 1])
            assert_same(ours.step(actions), reference.step(actions))
            assert_same(ours.reset_infos, reference.reset_infos)
    finally:
        ours.close()
        reference.close()


def test_the_docs_snippet_runs_as_a_script(tmp_path: Path) -> None:
    """docs/vector_env.md's SB3 snippet, pasted into a script (fewer steps, 2 envs).

    Each env's process re-imports the script (spawn), torch and SB3 with it:
    2 envs prove the snippet's guard as 8 would, at a quarter of the imports.
    """
    text = (Path(__file__).parent.parent / "docs" / "vector_env.md").read_text()
    section = text[text.index("## Stable-Baselines3: `FleetVecEnv`") :]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'if __name__ == "__main__":' in snippet and "torch.set_num_threads(1)" in snippet
    short = snippet.replace('PPO("MlpPolicy", venv)', 'PPO("MlpPolicy", venv, n_steps=32)')
    short = short.replace("] * 8", "] * 2").replace(
        ".learn(100_000)", ".learn(64)\n    print('LEARNED', model.num_timesteps)"
    )
    assert short != snippet
    script = tmp_path / "train.py"
    script.write_text(short)
    root = str(Path(rlfleet.__file__).resolve().parent.parent)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": root},
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "LEARNED 64" in result.stdout  # one rollout: 32 steps x 2 envs
