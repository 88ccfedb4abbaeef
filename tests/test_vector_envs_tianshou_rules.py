"""tianshou's vector-env rules on DummyVectorEnv and SubprocVectorEnv.

What tianshou's own tests (test/base/test_env.py at v2.0.1) and code written
for its vector envs rely on: seed() reseeds at once, duck-typed envs,
stepping right after seed(), a BaseVectorEnv subclassed the tianshou way,
attributes set where tianshou sets them, Dict observations batched as
tianshou batches them. The subprocess cases start real ``spawn`` children.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.envs import BaseVectorEnv, DummyVectorEnv, EnvConfig, SubprocVectorEnv
from rlfleet.envs.testing import CounterEnv
from rlfleet.errors import UsageError, VectorEnvError

MakeVenv = Callable[..., BaseVectorEnv]


@pytest.fixture(params=[DummyVectorEnv, SubprocVectorEnv])
def make_venv(request: pytest.FixtureRequest) -> Iterator[MakeVenv]:
    made: list[BaseVectorEnv] = []

    def make(env_fns: Sequence[Callable[[], Any]], **kwargs: object) -> BaseVectorEnv:
        venv = request.param(env_fns, **kwargs)
        made.append(venv)
        return venv

    yield make
    for venv in made:
        venv.close()


class DuckEnv:
    """No gymnasium base class, no spaces, no close: tianshou accepts it."""

    def __init__(self, start: float = 0.0) -> None:
        self.start = start
        self.position = start

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.position = self.start
        return np.array([self.position]), {"seed": seed}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.position += 1.0
        return np.array([self.position]), 1.0, False, False, {}


class OldApiEnv(CounterEnv):
    """A gym-0.21-style env with a seed() of its own (no reset needed to seed it)."""

    def seed(self, seed: int | None = None) -> list[int | None]:
        self.seeded_with = seed
        return [seed, 99]


class DictEnv(CounterEnv):
    """A Counter whose observation is a dict."""

    def __init__(self) -> None:
        super().__init__(length=5)
        self.observation_space = gym.spaces.Dict(  # type: ignore[assignment]
            {"count": gym.spaces.Box(0.0, 5.0, (1,), np.float32), "flag": gym.spaces.Discrete(2)}
        )

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        observation, info = super().reset(seed=seed, options=options)
        return {"count": observation, "flag": 0}, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        observation, reward, terminated, truncated, info = super().step(action)
        return {"count": observation, "flag": 1}, reward, terminated, truncated, info


def test_duck_typed_envs_without_spaces_work(make_venv: MakeVenv) -> None:
    venv = make_venv([DuckEnv, lambda: DuckEnv(10.0)])
    obs, infos = venv.reset(seed=[1, 2])
    assert obs.tolist() == [[0.0], [10.0]] and [i["seed"] for i in infos] == [1, 2]
    assert venv.step([0, 0])[0].tolist() == [[1.0], [11.0]]
    assert venv.get_env_attr("start") == [0.0, 10.0]
    venv.set_env_attr("start", 5.0, id=0)
    assert venv.reset(id=0)[0].tolist() == [[5.0]]


def test_an_env_is_steppable_right_after_seed_but_not_before(make_venv: MakeVenv) -> None:
    """CounterEnv has no order-enforcing wrapper: stepping after seed() is the
    env's to allow (tianshou steps it). Never reset nor seeded, or ended, it
    is still refused: the env would step from no state, or past its end."""
    venv = make_venv([lambda: CounterEnv(length=2), lambda: CounterEnv(length=2)])
    with pytest.raises(VectorEnvError, match="must be reset first"):
        venv.step([0, 0])
    assert venv.seed(3) == [[3], [4]]
    assert venv.step([0, 0])[0].tolist() == [[1.0], [1.0]]
    _, _, terminated, _, _ = venv.step([0, 0])
    assert terminated.tolist() == [True, True]
    with pytest.raises(VectorEnvError, match="episode ended"):
        venv.step([0, 0])
    venv.seed(None)
    assert venv.step([0, 0])[0].tolist() == [[1.0], [1.0]]


def test_seed_calls_an_envs_own_seed_method(make_venv: MakeVenv) -> None:
    venv = make_venv([OldApiEnv, OldApiEnv])
    assert venv.seed(7) == [[7, 99], [8, 99]]  # what each env's seed() returned
    assert venv.get_env_attr("seeded_with") == [7, 8]


def test_set_env_attr_puts_a_new_attribute_on_the_unwrapped_env() -> None:
    """tianshou's test_attr_unwrapped: the value is found on env.unwrapped."""
    venv = DummyVectorEnv([lambda: gym.make("CartPole-v1")])
    venv.set_env_attr("test_attribute", 1337)
    assert venv.get_env_attr("test_attribute") == [1337]
    assert venv.workers[0].env.unwrapped.test_attribute == 1337
    # An attribute a wrapper has stays on that wrapper (gymnasium's rule).
    venv.set_env_attr("_max_episode_steps", 7)
    assert venv.envs[0].get_wrapper_attr("_max_episode_steps") == 7
    venv.close()


def test_dict_observations_are_batched_as_tianshou_batches_them(make_venv: MakeVenv) -> None:
    venv = make_venv([DictEnv, DictEnv])
    obs, _ = venv.reset()
    assert obs.dtype == object and obs.shape == (2,)
    assert obs[1]["flag"] == 0 and obs[1]["count"].tolist() == [0.0]
    obs = venv.step([0, 0])[0]
    assert [o["flag"] for o in obs] == [1, 1]


class ThreeMethodVectorEnv(BaseVectorEnv):
    """A vector env written for tianshou's BaseVectorEnv: its own step/reset/seed/close."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]]) -> None:
        super().__init__(env_fns)
        self.envs = [fn() for fn in env_fns]

    def reset(self, id: Any = None, **kwargs: Any) -> tuple[Any, np.ndarray]:
        results = [env.reset() for env in self.envs]
        return np.stack([r[0] for r in results]), np.array([r[1] for r in results])

    def step(self, action: Any, id: Any = None) -> Any:
        results = [env.step(a) for env, a in zip(self.envs, action, strict=True)]
        return tuple(np.array(column) for column in zip(*results, strict=True))

    def seed(self, seed: Any = None) -> list[Any]:
        return [[seed] for _ in self.envs]

    def close(self) -> None:
        for env in self.envs:
            env.close()


def test_a_tianshou_style_subclass_can_be_created_and_used() -> None:
    venv = ThreeMethodVectorEnv([EnvConfig("CartPole-v1")] * 2)
    assert len(venv) == 2 and venv.env_num == 2 and len(venv._env_fns) == 2
    assert venv.reset()[0].shape == (2, 4)
    assert venv.step([0, 1])[0].shape == (2, 4)
    assert venv.seed(1) == [[1], [1]]
    # What it did not implement says so, instead of failing obscurely.
    with pytest.raises(UsageError, match="implements neither render"):
        venv.render()
    venv.close()
