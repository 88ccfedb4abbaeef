"""FleetVectorEnv: rlfleet vector envs as a real gymnasium VectorEnv.

The oracle is gymnasium's own SyncVectorEnv over the same envs: same
observations, rewards, flags and info dicts, step for step, in every
autoreset mode. A CleanRL-style PPO loop, written here with only the
gymnasium and torch APIs, learns CartPole through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers.vector import NormalizeObservation, RecordEpisodeStatistics
from torch import nn

from rlfleet.envs import DummyVectorEnv, EnvConfig, SubprocVectorEnv
from rlfleet.errors import ConfigError, InvalidArgumentError
from rlfleet.integrations.gymnasium import FleetVectorEnv

TESTING = ("rlfleet.envs.testing",)


def counter(length: int = 3, limit: int | None = None) -> EnvConfig:
    return EnvConfig(
        "rlfleet/Counter-v0", {"length": length}, max_episode_length=limit, imports=TESTING
    )


# Env 1 is truncated by a time limit, the others terminate: both kinds of ends.
ENV_FNS: list[Callable[[], gym.Env]] = [counter(), counter(limit=2), counter(length=3)]


def assert_same(actual: Any, desired: Any) -> None:
    """np.testing.assert_equal that also descends into object arrays of dicts."""
    if isinstance(desired, dict):
        assert isinstance(actual, dict) and actual.keys() == desired.keys()
        for key in desired:
            assert_same(actual[key], desired[key])
    elif isinstance(desired, tuple | list):
        assert len(actual) == len(desired)
        for a, d in zip(actual, desired, strict=True):
            assert_same(a, d)
    elif isinstance(desired, np.ndarray) and desired.dtype == object:
        assert isinstance(actual, np.ndarray) and actual.shape == desired.shape
        for a, d in zip(actual.ravel(), desired.ravel(), strict=True):
            assert_same(a, d)
    else:
        np.testing.assert_equal(actual, desired)
        assert np.asarray(actual).dtype == np.asarray(desired).dtype


@pytest.fixture(params=[DummyVectorEnv, SubprocVectorEnv])
def venv_class(request: pytest.FixtureRequest) -> Any:
    return request.param


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_steps_exactly_like_sync_vector_env(venv_class: Any, mode: AutoresetMode) -> None:
    ours = FleetVectorEnv(venv_class(ENV_FNS), autoreset_mode=mode)
    reference = SyncVectorEnv(ENV_FNS, autoreset_mode=mode)
    try:
        assert isinstance(ours, gym.vector.VectorEnv)
        assert ours.metadata["autoreset_mode"] == mode
        assert ours.single_observation_space == reference.single_observation_space
        assert ours.observation_space == reference.observation_space
        assert ours.action_space == reference.action_space
        assert_same(ours.reset(seed=[5, 11, 7]), reference.reset(seed=[5, 11, 7]))
        actions = np.array([0, 1, 0])
        for _ in range(7):
            assert_same(ours.step(actions), reference.step(actions))
    finally:
        ours.close()
        reference.close()


def test_disabled_autoreset_with_reset_mask(venv_class: Any) -> None:
    mode = AutoresetMode.DISABLED
    ours = FleetVectorEnv(venv_class(ENV_FNS), autoreset_mode=mode)
    reference = SyncVectorEnv(ENV_FNS, autoreset_mode=mode)
    try:
        assert_same(ours.reset(seed=3), reference.reset(seed=3))
        actions = np.array([1, 1, 1])
        for _ in range(2):
            assert_same(ours.step(actions), reference.step(actions))
        mask = np.array([False, True, False])
        assert_same(
            ours.reset(seed=[0, 9, 0], options={"reset_mask": mask}),
            reference.reset(seed=[0, 9, 0], options={"reset_mask": mask.copy()}),
        )
        assert_same(ours.step(actions), reference.step(actions))
        with pytest.raises(InvalidArgumentError, match="bool numpy array of shape"):
            ours.reset(options={"reset_mask": [True, False, True]})
        with pytest.raises(InvalidArgumentError, match="no env is selected"):
            ours.reset(options={"reset_mask": np.zeros(3, dtype=bool)})
        with pytest.raises(InvalidArgumentError, match="2 seeds for 3 envs"):
            ours.reset(seed=[1, 2])
    finally:
        ours.close()
        reference.close()


def test_vector_wrappers_work_on_top() -> None:
    envs = NormalizeObservation(
        RecordEpisodeStatistics(FleetVectorEnv(DummyVectorEnv([counter()] * 2)))
    )
    try:
        obs, _ = envs.reset(seed=0)
        episodes = []
        for _ in range(8):
            obs, _, _, _, infos = envs.step(np.array([0, 0]))
            if "episode" in infos:
                episodes += list(infos["episode"]["r"][infos["_episode"]])
        assert episodes == [3.0, 3.0, 3.0, 3.0]  # NEXT_STEP: 3 steps + 1 reset step each
        assert obs.shape == (2, 1) and obs.dtype == np.float32
        assert envs.obs_rms.count > 8  # every observation went through the running stats
    finally:
        envs.close()


def test_attributes_render_and_refusals() -> None:
    envs = FleetVectorEnv.from_env_fns(
        [EnvConfig("CartPole-v1", {"render_mode": "rgb_array"})] * 2, subprocess=False
    )
    try:
        assert envs.render_mode == "rgb_array"
        assert envs.get_attr("gravity") == (9.8, 9.8)
        envs.set_attr("gravity", [1.0, 2.0])
        assert envs.get_attr("gravity") == (1.0, 2.0)
        envs.reset(seed=0)
        frames = envs.render()
        assert frames is not None and len(frames) == 2 and frames[0].ndim == 3
        np.testing.assert_equal(envs.call("render"), frames)
    finally:
        envs.close()
    assert envs.venv.closed
    with pytest.raises(ConfigError, match="autoreset_mode='Sometimes'"):
        FleetVectorEnv(DummyVectorEnv([counter()]), autoreset_mode="Sometimes")
    with pytest.raises(ConfigError, match="wait_num"):
        FleetVectorEnv(DummyVectorEnv([counter()] * 2, wait_num=1))


# --- a CleanRL-style PPO loop (cleanrl/ppo.py, shortened) ---------------------


class Agent(nn.Module):
    def __init__(self, envs: gym.vector.VectorEnv) -> None:
        super().__init__()
        obs_size = int(np.prod(envs.single_observation_space.shape))  # type: ignore[arg-type]
        actions = int(envs.single_action_space.n)  # type: ignore[attr-defined]
        self.critic = nn.Sequential(nn.Linear(obs_size, 64), nn.Tanh(), nn.Linear(64, 1))
        self.actor = nn.Sequential(nn.Linear(obs_size, 64), nn.Tanh(), nn.Linear(64, actions))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = torch.distributions.Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def train_ppo(envs: gym.vector.VectorEnv, iterations: int) -> list[float]:
    """CleanRL's PPO update; returns the episodic returns in the order they ended."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    # Tiny networks: extra threads only contend with the env processes.
    torch.set_num_threads(1)
    try:
        return _ppo_iterations(envs, iterations)
    finally:
        torch.set_num_threads(threads)


def _ppo_iterations(envs: gym.vector.VectorEnv, iterations: int) -> list[float]:
    num_envs, num_steps, gamma, lam, clip = envs.num_envs, 128, 0.99, 0.95, 0.2
    agent = Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-3, eps=1e-5)
    obs_shape = envs.single_observation_space.shape
    obs = torch.zeros((num_steps, num_envs, *obs_shape))  # type: ignore[misc]
    actions = torch.zeros((num_steps, num_envs))
    logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs)) for _ in range(4))
    returns_seen: list[float] = []
    next_obs_np, _ = envs.reset(seed=1)
    next_obs = torch.Tensor(next_obs_np)
    next_done = torch.zeros(num_envs)
    for _ in range(iterations):
        for step in range(num_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            next_obs_np, reward, terminated, truncated, infos = envs.step(action.numpy())
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs = torch.Tensor(next_obs_np)
            next_done = torch.Tensor(np.logical_or(terminated, truncated))
            if "episode" in infos:
                returns_seen += [float(r) for r in infos["episode"]["r"][infos["_episode"]]]
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            last = torch.zeros(num_envs)
            for t in reversed(range(num_steps)):
                not_done = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
                following = next_value if t == num_steps - 1 else values[t + 1]
                delta = rewards[t] + gamma * following * not_done - values[t]
                last = delta + gamma * lam * not_done * last
                advantages[t] = last
            returns = advantages + values
        b_obs = obs.reshape((-1, *obs_shape))  # type: ignore[misc]
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1)
        b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
        batch = num_steps * num_envs
        for _ in range(4):
            order = torch.randperm(batch)
            for start in range(0, batch, batch // 4):
                mb = order[start : start + batch // 4]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb], b_actions.long()[mb]
                )
                ratio = (newlogprob - b_logprobs[mb]).exp()
                adv = b_advantages[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                loss = pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()
    return returns_seen


def test_cleanrl_style_ppo_learns_cartpole_through_subprocess_envs() -> None:
    envs = RecordEpisodeStatistics(
        FleetVectorEnv(SubprocVectorEnv([lambda: gym.make("CartPole-v1")] * 4))
    )
    try:
        returns = train_ppo(envs, iterations=20)
    finally:
        envs.close()
    first, last = float(np.mean(returns[:20])), float(np.mean(returns[-10:]))
    # Random play lasts about 20 steps.
    assert first < 40 and last >= max(3.0 * first, 75.0), (first, last)


class DictCounter(gym.Env[dict[str, Any], np.int64]):
    """Dict observations (a count and a seeded random position), ends after 3 steps."""

    observation_space = gym.spaces.Dict(
        {"count": gym.spaces.Discrete(4), "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)}
    )
    action_space = gym.spaces.Discrete(2)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.count = 0
        return self._obs(), {"phase": "reset"}

    def step(self, action: np.int64) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self.count += 1
        return self._obs(), float(action), self.count >= 3, False, {"phase": "step"}

    def _obs(self) -> dict[str, Any]:
        pos = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        return {"count": np.int64(self.count), "pos": pos}


DICT_FNS: list[Callable[[], gym.Env]] = [
    DictCounter,
    lambda: gym.wrappers.TimeLimit(DictCounter(), max_episode_steps=2),
]


@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_dict_observations_step_like_sync_vector_env(mode: AutoresetMode) -> None:
    ours = FleetVectorEnv(DummyVectorEnv(DICT_FNS), autoreset_mode=mode)
    reference = SyncVectorEnv(DICT_FNS, autoreset_mode=mode)
    try:
        assert ours.observation_space == reference.observation_space
        assert_same(ours.reset(seed=4), reference.reset(seed=4))
        for step in range(6):
            actions = np.array([step % 2, 1])
            if mode == AutoresetMode.DISABLED and step == 2:
                mask = np.array([False, True])
                assert_same(
                    ours.reset(options={"reset_mask": mask}),
                    reference.reset(options={"reset_mask": mask.copy()}),
                )
            if mode == AutoresetMode.DISABLED and step == 3:
                break
            assert_same(ours.step(actions), reference.step(actions))
    finally:
        ours.close()
        reference.close()
