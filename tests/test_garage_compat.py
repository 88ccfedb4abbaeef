"""Code written against garage's documented behaviour works on rlfleet's types.

Each test is something a garage user does (construct positionally, compare,
match on error texts, roll out, collect, push flat parameters), checked
against garage's documentation (../shared/seeds/garage_*.txt).
"""

from __future__ import annotations

import logging
import math
import warnings

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs)
from rlfleet import (
    EnvSpec,
    EnvStep,
    EpisodeBatch,
    InOutSpec,
    StepType,
    TimeStep,
    TimeStepBatch,
    log_multitask_performance,
    rollout,
)
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies import MLPCategoricalPolicy, RandomPolicy
from rlfleet.worker import DefaultWorker

SPEC = EnvSpec(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2), 10)
F, M, TE = StepType.FIRST, StepType.MID, StepType.TERMINAL


def _episode_batch(**overrides: object) -> EpisodeBatch:
    fields: dict[str, object] = {
        "env_spec": SPEC,
        "episode_infos": {"goal": np.arange(2)},
        "observations": np.arange(10, dtype=np.float32).reshape(5, 2),
        "last_observations": np.zeros((2, 2), np.float32),
        "actions": np.array([0, 1, 0, 1, 1]),
        "rewards": np.ones(5),
        "env_infos": {"x": np.arange(5)},
        "agent_infos": {},
        "step_types": np.array([F, M, TE, F, TE], dtype=StepType),
        "lengths": np.array([3, 2]),
    }
    fields.update(overrides)
    # garage's positional order.
    return EpisodeBatch(*fields.values())  # type: ignore[arg-type]


def test_types_take_garages_positional_order_and_compare_by_value() -> None:
    obs, next_obs = np.zeros(2, np.float32), np.ones(2, np.float32)
    step = TimeStep(SPEC, {}, obs, 1, 1.0, next_obs, {}, {"p": 0.5}, StepType.MID)
    again = TimeStep(SPEC, {}, obs.copy(), 1, 1.0, next_obs.copy(), {}, {"p": 0.5}, StepType.MID)
    assert step == again and step is not again
    assert step != TimeStep(SPEC, {}, obs, 0, 1.0, next_obs, {}, {"p": 0.5}, StepType.MID)
    env_step = EnvStep(SPEC, 1, 1.0, next_obs, {}, StepType.MID)
    assert env_step == EnvStep(SPEC, 1, 1.0, next_obs.copy(), {}, StepType.MID)
    assert TimeStep.from_env_step(env_step, obs, {"p": 0.5}, {}) == step
    batch = _episode_batch()
    assert batch == _episode_batch() and batch != _episode_batch(rewards=np.zeros(5))
    assert EpisodeBatch.concatenate(*batch.split()) == batch
    transitions = TimeStepBatch.from_episode_batch(batch)
    positional = TimeStepBatch(
        SPEC,
        transitions.episode_infos,
        transitions.observations,
        transitions.actions,
        transitions.rewards,
        transitions.next_observations,
        transitions.env_infos,
        transitions.agent_infos,
        transitions.step_types,
    )
    assert positional == transitions
    with pytest.raises(TypeError):
        hash(step)


def test_in_out_spec() -> None:
    box, discrete = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4)
    spec = InOutSpec(box, discrete)
    assert (spec.input_space, spec.output_space) == (box, discrete)
    assert spec == InOutSpec(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(4))
    assert spec != InOutSpec(discrete, box)
    # garage's EnvSpec is an InOutSpec: observations in, actions out.
    assert isinstance(SPEC, InOutSpec)
    assert (SPEC.input_space, SPEC.output_space) == (SPEC.observation_space, SPEC.action_space)


def test_step_types_of_step_type_members_stay_members() -> None:
    batch = _episode_batch()
    assert batch.step_types.dtype == object
    assert all(isinstance(step_type, StepType) for step_type in batch.step_types)
    assert [s.name for s in batch.split()[1].step_types] == ["FIRST", "TERMINAL"]


@pytest.mark.parametrize(
    ("overrides", "garage_text"),
    [
        (
            {"observations": np.zeros((4, 2), np.float32)},
            "observations has batch size 4, but must have batch size 5 to match the sum of lengths",
        ),
        (
            {"actions": np.zeros(4, np.int64)},
            "actions has batch size 4, but must have batch size 5 to match the sum of lengths",
        ),
        (
            {"observations": np.zeros((5, 3), np.float32)},
            "Each observation has shape (3,) but must match the observation_space "
            "Box(-1.0, 1.0, (2,), float32)",
        ),
        (
            {"actions": np.zeros((5, 3), np.int64)},
            "Each action has shape (3,) but must match the action_space Discrete(2)",
        ),
        (
            {"last_observations": np.zeros((3, 2), np.float32)},
            "last_observations has batch size 3 but must have batch size 2 to match the "
            "number of episodes",
        ),
        (
            {"last_observations": np.zeros((2, 3), np.float32)},
            "last_observations must have the same number of entries as there are episodes (2)",
        ),
        ({"rewards": np.ones(4)}, "rewards has shape (4,) but must have batch size 5"),
        ({"rewards": [1.0] * 5}, "rewards is not of type <class 'numpy.ndarray'>"),
        (
            {"step_types": np.zeros(4, np.uint8)},
            "step_types has batch size 4, but must have batch size 5",
        ),
        (
            {"step_types": np.zeros(5, np.float32)},
            "step_types has dtype float32 but must have dtype StepType",
        ),
        (
            {"env_infos": {"x": np.arange(4)}},
            "Entry 'x' in env_infos has batch size 4 but must have batch size 5",
        ),
        (
            {"env_infos": {"x": [1, 2, 3, 4, 5]}},
            "Entry 'x' in env_infos is of type <class 'list'> but must be "
            "<class 'numpy.ndarray'> or dict",
        ),
        (
            {"agent_infos": {"h": np.arange(4)}},
            "Entry 'h' in agent_infos has batch size 4 but must have batch size 5",
        ),
        (
            {"episode_infos": {"goal": np.arange(3)}},
            "Entry 'goal' in episode_infos has batch size 3, but must have batch size 2 to "
            "match the number of episodes",
        ),
        (
            {"lengths": np.array([[3, 2]])},
            "lengths has shape (1, 2) but must be a tensor of shape (N,)",
        ),
        (
            {"lengths": np.array([3.0, 2.0])},
            "lengths has dtype float64, but must have an integer dtype",
        ),
    ],
)
def test_validation_messages_start_with_garages(
    overrides: dict[str, object], garage_text: str
) -> None:
    with pytest.raises(ValueError) as info:
        _episode_batch(**overrides)
    message = str(info.value)
    assert message.startswith(garage_text), message
    assert "EpisodeBatch." in message  # rlfleet's detail follows garage's text


def test_shapes_are_checked_not_values_and_integer_step_types_are_accepted() -> None:
    # garage warns about each observation outside the space and wants an
    # object array of StepType; rlfleet checks shapes only (microseconds per
    # batch) and takes integer step types, as the wire carries them.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = _episode_batch(
            observations=np.full((5, 2), 7.0, np.float32),
            step_types=np.array([F, M, TE, F, TE], dtype=np.uint8),
        )
    assert batch.step_types.dtype == np.uint8


def _time_step_batch(**overrides: object) -> TimeStepBatch:
    batch = TimeStepBatch.from_episode_batch(_episode_batch())
    fields = {name: getattr(batch, name) for name in TimeStepBatch.__dataclass_fields__}
    fields.update(overrides)
    return TimeStepBatch(**fields)


@pytest.mark.parametrize(
    ("overrides", "garage_text"),
    [
        ({"rewards": [1.0] * 5}, "rewards is not of type <class 'numpy.ndarray'>"),
        ({"rewards": np.ones((5, 1))}, "rewards has shape (5, 1)"),
        (
            {"observations": np.zeros((4, 2), np.float32)},
            "observations has batch size 4, but must have batch size 5 to match rewards",
        ),
        (
            {"next_observations": np.zeros((4, 2), np.float32)},
            "next_observations has batch size 4, but must have batch size 5 to match rewards",
        ),
        (
            {"next_observations": np.zeros((5, 3), np.float32)},
            "Each next_observation has shape (3,) but must match the observation_space",
        ),
        ({"actions": np.zeros(4, np.int64)}, "actions has batch size 4, but must have"),
        ({"actions": np.zeros((5, 3), np.int64)}, "Each action has shape (3,)"),
        ({"step_types": np.array([])}, "step_types has batch size 0"),
        ({"step_types": np.zeros(5, np.float32)}, "step_types has dtype float32"),
        ({"env_infos": {"bar": []}}, "Entry 'bar' in env_infos is of type <class 'list'>"),
        (
            {"agent_infos": {"hidden": np.arange(4)}},
            "Entry 'hidden' in agent_infos has batch size 4 but must have batch size 5 to "
            "match rewards",
        ),
    ],
)
def test_time_step_batch_messages_start_with_garages(
    overrides: dict[str, object], garage_text: str
) -> None:
    with pytest.raises(ValueError) as info:
        _time_step_batch(**overrides)
    message = str(info.value)
    assert message.startswith(garage_text), message
    assert "TimeStepBatch." in message


def test_time_step_messages_start_with_garages() -> None:
    obs = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match=r"^agent_info must be type <class 'dict'>"):
        TimeStep(SPEC, {}, obs, 1, 1.0, obs, {}, [], StepType.MID)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^step_type must be dtype garage.StepType"):
        TimeStep(SPEC, {}, obs, 1, 1.0, obs, {}, {}, 7)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"^observation should have the same dimensionality as the obs"
    ):
        TimeStep(SPEC, {}, np.zeros(3), 1, 1.0, obs, {}, {}, StepType.MID)


def test_pad_to_last_is_a_method() -> None:
    batch = _episode_batch()
    padded = batch.pad_to_last(batch.rewards)
    assert padded.shape == (2, 10)
    np.testing.assert_array_equal(padded[1, :3], [1, 1, 0])
    assert batch.pad_to_last(batch.observations).shape == (2, 10, 2)


def test_rollout_keeps_the_final_observation() -> None:
    env = gym.make("rlfleet/Counter-v0", length=3)
    path = rollout(env, RandomPolicy(EnvSpec.from_env(env), seed=0))
    batch = EpisodeBatch.from_list(EnvSpec.from_env(env), [path])
    np.testing.assert_array_equal(batch.observations[:, 0], [0, 1, 2])
    # garage repeats observation 2 here; the env's true final state is 3.
    np.testing.assert_array_equal(batch.last_observations[:, 0], [3])
    np.testing.assert_array_equal(batch.next_observations[:, 0], [1, 2, 3])


class _RenderCounter(gym.Wrapper):
    """Counts render() calls (rollout's animated mode)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.renders = 0

    def render(self) -> None:
        self.renders += 1


def _sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []
    monkeypatch.setattr("time.sleep", waits.append)
    return waits


@pytest.mark.parametrize(("speedup", "wait"), [(1, 0.05), (2.5, 0.02)])
def test_rollout_speedup_divides_the_wait_between_rendered_steps(
    monkeypatch: pytest.MonkeyPatch, speedup: float, wait: float
) -> None:
    waits = _sleeps(monkeypatch)
    env = _RenderCounter(gym.make("rlfleet/Counter-v0", length=3))
    path = rollout(env, RandomPolicy(EnvSpec.from_env(env), seed=0), animated=True, speedup=speedup)
    assert len(path["rewards"]) == 3
    assert env.renders == 4  # after the reset and after each step
    assert waits == pytest.approx([wait, wait])  # none after the last step


def test_rollout_speedup_applies_only_when_animated(monkeypatch: pytest.MonkeyPatch) -> None:
    waits = _sleeps(monkeypatch)
    env = gym.make("rlfleet/Counter-v0", length=3)
    policy = RandomPolicy(EnvSpec.from_env(env), seed=0)
    rollout(env, policy, speedup=4)
    rollout(env, policy, animated=True, speedup=math.inf)
    assert waits == []
    rollout(env, policy, animated=True, speedup=3, pause_per_frame=0.5)
    assert waits == [0.5, 0.5, 0.5]  # garage 2021.03's pause replaces speedup's wait
    with pytest.raises(ConfigError, match=r"speedup must be a number > 0"):
        rollout(env, policy, speedup=0)


def test_rollout_without_a_max_episode_length_runs_to_the_envs_end() -> None:
    env = gym.make("rlfleet/Counter-v0", length=4)
    policy = RandomPolicy(EnvSpec.from_env(env), seed=0)
    for limit in (None, 0, math.inf):  # garage: `max_episode_length or inf`
        assert len(rollout(env, policy, max_episode_length=limit)["rewards"]) == 4
    assert len(rollout(env, policy, max_episode_length=2)["rewards"]) == 2


def _counter_worker(**kwargs: object) -> DefaultWorker:
    worker = DefaultWorker(seed=1, worker_number=0, **kwargs)  # type: ignore[arg-type]
    worker.update_env(EnvConfig("rlfleet/Counter-v0", {"length": 3}))
    return worker


def test_collect_episode_returns_every_episode_finished_since_the_last_collect() -> None:
    worker = _counter_worker(max_episode_length=None)
    worker.update_agent(RandomPolicy(_spec()))
    for _ in range(2):
        worker.start_episode()  # the second call must not drop the first episode
        while not worker.step_episode():
            pass
    batch = worker.collect_episode()
    assert batch.n_episodes == 2
    np.testing.assert_array_equal(batch.lengths, [3, 3])
    with pytest.raises(RuntimeError, match="no finished episode"):
        worker.collect_episode()


def _spec() -> EnvSpec:
    return EnvConfig("rlfleet/Counter-v0", {"length": 3}).env_spec()


@pytest.mark.parametrize(("limit", "steps"), [(2.0, 2), (1.5, 2), (0.5, 1), (np.float64(2), 2)])
def test_max_episode_length_may_be_any_positive_float(limit: float, steps: int) -> None:
    # garage steps while the episode is shorter than the limit: a fraction
    # cuts at its ceiling.
    worker = _counter_worker(max_episode_length=limit)
    worker.update_agent(RandomPolicy(_spec()))
    assert worker.rollout().lengths.tolist() == [steps]


@pytest.mark.parametrize("limit", [0.0, -1.5, float("nan"), -math.inf, "5"])
def test_max_episode_length_refuses_what_is_not_a_positive_number(limit: object) -> None:
    with pytest.raises(ConfigError, match="positive number"):
        DefaultWorker(seed=1, max_episode_length=limit, worker_number=0)  # type: ignore[arg-type]


def test_update_agent_takes_garages_flat_parameter_vector() -> None:
    spec = EnvConfig("CartPole-v1").env_spec()
    worker = DefaultWorker(seed=1, max_episode_length=5, worker_number=0)
    worker.update_env(EnvConfig("CartPole-v1"))
    worker.update_agent(MLPCategoricalPolicy(spec, hidden_sizes=(4,), seed=0))
    target = MLPCategoricalPolicy(spec, hidden_sizes=(4,), seed=9).get_param_values()
    flat = np.concatenate([value.ravel() for value in target.values()])
    worker.update_agent(flat)
    assert worker.agent is not None
    for name, value in worker.agent.get_param_values().items():
        np.testing.assert_array_equal(value, target[name])
    worker.update_agent(tuple(value * 0 for value in target.values()))
    assert all(not value.any() for value in worker.agent.get_param_values().values())
    with pytest.raises(PolicyError, match="1-D with 30 values"):
        worker.update_agent(flat[:-1])


def test_log_multitask_performance_groups_episodes_by_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batch = _episode_batch(env_infos={"task_id": np.array([0, 0, 0, 1, 1])})
    with caplog.at_level(logging.INFO, logger="rlfleet"):
        returns = log_multitask_performance(3, batch, 0.99, name_map={0: "reach", 2: "push"})
    np.testing.assert_array_equal(returns, [3.0, 2.0])
    lines = caplog.messages
    assert "reach/AverageReturn 3.0" in lines
    assert "push/NumEpisodes 0" in lines  # listed in the map, no episode: NaN stats
    assert "push/SuccessRate nan" in lines
    assert "Average/AverageReturn 2.5" in lines
    assert not any(line.startswith("Task #1/") for line in lines)  # name_map decides
    with caplog.at_level(logging.INFO, logger="rlfleet"):
        log_multitask_performance(3, batch, 0.99)
    assert "Task #1/NumEpisodes 1" in caplog.messages
