"""EnvStep and TimeStep: fields, step-type flags, validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core import EnvSpec, EnvStep, StepType, TimeStep, step_type_from_gym
from rlfleet.errors import InvalidBatchError

SPEC = EnvSpec(gym.spaces.Box(-10.0, 10.0, (2,), dtype=np.float64), gym.spaces.Discrete(3), 4)
DICT_SPEC = EnvSpec(
    gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,)), "mode": gym.spaces.Discrete(3)}),
    gym.spaces.Box(-1.0, 1.0, (2, 3)),
)


def env_step(**overrides: Any) -> EnvStep:
    fields = {
        "env_spec": SPEC,
        "action": 2,
        "reward": 1.5,
        "observation": np.array([3.0, 4.0]),
        "env_info": {"x": 1},
        "step_type": StepType.MID,
    }
    return EnvStep(**{**fields, **overrides})


def time_step(**overrides: Any) -> TimeStep:
    fields = {
        "env_spec": SPEC,
        "episode_info": {"seed": 7},
        "observation": np.array([1.0, 2.0]),
        "action": np.array([0.0, 1.0, 0.0]),  # one-hot Discrete(3)
        "reward": np.float32(-1.0),
        "next_observation": np.array([3.0, 4.0]),
        "env_info": {},
        "agent_info": {"logp": -0.5},
        "step_type": StepType.FIRST,
    }
    return TimeStep(**{**fields, **overrides})


MakeStep = Callable[..., EnvStep | TimeStep]

FLAGS = {
    StepType.FIRST: (True, False, False, False, False),
    StepType.MID: (False, True, False, False, False),
    StepType.TERMINAL: (False, False, True, False, True),
    StepType.TIMEOUT: (False, False, False, True, True),
}


@pytest.mark.parametrize("make", [env_step, time_step])
@pytest.mark.parametrize("step_type", list(StepType))
def test_flags(make: MakeStep, step_type: StepType) -> None:
    step = make(step_type=step_type)
    assert (step.first, step.mid, step.terminal, step.timeout, step.last) == FLAGS[step_type]


@pytest.mark.parametrize("make", [env_step, time_step])
def test_integer_step_type_becomes_the_enum(make: MakeStep) -> None:
    step = make(step_type=np.int8(2))
    assert step.step_type is StepType.TERMINAL
    assert step.terminal


@pytest.mark.parametrize("make", [env_step, time_step])
@pytest.mark.parametrize("bad", [4, -1, "MID", None])
def test_bad_step_type(make: MakeStep, bad: object) -> None:
    with pytest.raises(InvalidBatchError, match=r"\.step_type: expected a StepType \(0\.\.3\)"):
        make(step_type=bad)


def test_is_frozen_and_takes_garages_positional_order() -> None:
    step = env_step()
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.reward = 2.0  # type: ignore[misc]
    # garage's order: env_spec, action, reward, observation, env_info, step_type.
    positional = EnvStep(SPEC, 1, 1.0, np.zeros(2), {}, StepType.MID)
    assert positional.observation.shape == (2,) and positional.reward == 1.0


def test_from_env_step_maps_every_field() -> None:
    step = env_step(step_type=StepType.TIMEOUT)
    last_obs = np.array([-1.0, -2.0])
    agent_info = {"logp": np.float64(-0.1)}
    episode_info = {"seed": np.uint32(9)}

    ts = TimeStep.from_env_step(step, last_obs, agent_info, episode_info)

    assert ts.env_spec is SPEC
    assert ts.observation is last_obs
    assert ts.next_observation is step.observation
    assert ts.action == 2
    assert ts.reward == 1.5
    assert ts.env_info is step.env_info
    assert ts.agent_info is agent_info
    assert ts.episode_info is episode_info
    assert ts.step_type is StepType.TIMEOUT
    assert ts.timeout and ts.last


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "observation",
            np.zeros(3),
            r"TimeStep\.observation: expected an element of observation_space "
            r"Box\(-10\.0, 10\.0, \(2,\), float64\) \(shape \(2,\)\), "
            r"got ndarray with shape \(3,\)",
        ),
        ("next_observation", np.zeros((1, 2)), r"TimeStep\.next_observation: .*shape \(1, 2\)"),
        (
            "action",
            np.zeros(2),
            r"TimeStep\.action: expected an element of action_space Discrete\(3\) "
            r"\(shape \(\) or \(3,\)\)",
        ),
        ("reward", "1.0", r"TimeStep\.reward: expected a real scalar, got '1\.0'"),
        ("reward", np.zeros(1), r"TimeStep\.reward: expected a real scalar"),
        ("reward", True, r"TimeStep\.reward: expected a real scalar, got True"),
        ("env_info", [], r"TimeStep\.env_info: expected a dict, got list"),
        ("agent_info", None, r"TimeStep\.agent_info: expected a dict, got NoneType"),
        ("episode_info", 3, r"TimeStep\.episode_info: expected a dict, got int"),
        ("env_spec", "CartPole-v1", r"TimeStep\.env_spec: expected an rlfleet EnvSpec, got str"),
    ],
)
def test_time_step_validation_names_field_and_shapes(field: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidBatchError, match=message):
        time_step(**{field: value})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("action", np.array([1, 2]), r"EnvStep\.action: .*Discrete\(3\).*shape \(2,\)"),
        ("observation", 5.0, r"EnvStep\.observation: .*got float with shape \(\)"),
        ("reward", None, r"EnvStep\.reward: expected a real scalar, got None"),
        ("env_info", (), r"EnvStep\.env_info: expected a dict, got tuple"),
    ],
)
def test_env_step_validation(field: str, value: Any, message: str) -> None:
    with pytest.raises(InvalidBatchError, match=message):
        env_step(**{field: value})


def test_invalid_step_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"EnvStep\.reward"):
        env_step(reward="x")


def test_integer_and_numpy_rewards_are_accepted() -> None:
    assert env_step(reward=3).reward == 3
    assert env_step(reward=np.float32(0.25)).reward == np.float32(0.25)
    assert env_step(reward=np.array(2.0)).reward == 2.0


def test_dict_space_accepts_flattened_or_unflattened_elements() -> None:
    space = DICT_SPEC.observation_space
    obs = {"mode": 1, "pos": np.array([0.5, -0.5], dtype=np.float32)}
    flat: np.ndarray = gym.spaces.flatten(space, obs)  # type: ignore[assignment]
    assert flat.shape == (5,)
    action = np.zeros((2, 3), dtype=np.float32)
    observation: Any
    for observation in (obs, flat):
        step = EnvStep(
            env_spec=DICT_SPEC,
            action=action,
            reward=0.0,
            observation=observation,
            env_info={},
            step_type=StepType.FIRST,
        )
        assert step.observation is observation
    with pytest.raises(InvalidBatchError, match=r"EnvStep\.observation: .*shape \(5,\)"):
        EnvStep(
            env_spec=DICT_SPEC,
            action=action,
            reward=0.0,
            observation=np.zeros(4),
            env_info={},
            step_type=StepType.FIRST,
        )


def test_box_action_may_be_flattened() -> None:
    step = EnvStep(
        env_spec=DICT_SPEC,
        action=np.zeros(6),
        reward=0.0,
        observation=np.zeros(5),
        env_info={},
        step_type=StepType.MID,
    )
    assert step.action.shape == (6,)
    with pytest.raises(InvalidBatchError, match=r"shape \(2, 3\) or \(6,\)"):
        EnvStep(
            env_spec=DICT_SPEC,
            action=np.zeros((3, 2)),
            reward=0.0,
            observation=np.zeros(5),
            env_info={},
            step_type=StepType.MID,
        )


def test_steps_from_a_real_env() -> None:
    env = gym.make("CartPole-v1")
    spec = EnvSpec.from_env(env)
    obs, _ = env.reset(seed=0)
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, info = env.step(action)
    step = EnvStep(
        env_spec=spec,
        action=action,
        reward=reward,
        observation=next_obs,
        env_info=info,
        step_type=step_type_from_gym(1, spec.max_episode_length, terminated, truncated),
    )
    ts = TimeStep.from_env_step(step, obs, {}, {"seed": 0})
    np.testing.assert_array_equal(ts.next_observation, next_obs)
    np.testing.assert_array_equal(ts.observation, obs)
    assert ts.first and not ts.last
