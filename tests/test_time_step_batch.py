"""TimeStepBatch against hand-computed expectations.

The reference batch holds three transitions in a Box(2,) observation /
Box(1,) action env:

    row  obs     action  reward  next_obs  step_type  episode seed
    0    [0, 1]  [0.5]   1       [2, 3]    FIRST      7
    1    [2, 3]  [-.5]   2       [4, 5]    TERMINAL   7
    2    [6, 7]  [0.0]   3       [8, 9]    TIMEOUT    8
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core import EnvSpec, EpisodeBatch, StepType, TimeStepBatch
from rlfleet.errors import InvalidBatchError

F, M, TERM, TOUT = (int(s) for s in StepType)
OBS_SPACE = gym.spaces.Box(-100.0, 100.0, (2,), dtype=np.float64)
SPEC = EnvSpec(OBS_SPACE, gym.spaces.Box(-1.0, 1.0, (1,)), max_episode_length=5)
FIELDS = (
    "episode_infos",
    "observations",
    "actions",
    "rewards",
    "next_observations",
    "env_infos",
    "agent_infos",
    "step_types",
)


def fields(**overrides: Any) -> dict[str, Any]:
    base = {
        "env_spec": SPEC,
        "episode_infos": {"seed": np.array([7, 7, 8]), "task": {"id": np.array([[1], [1], [2]])}},
        "observations": np.array([[0.0, 1.0], [2.0, 3.0], [6.0, 7.0]]),
        "actions": np.array([[0.5], [-0.5], [0.0]], dtype=np.float32),
        "rewards": np.array([1.0, 2.0, 3.0]),
        "next_observations": np.array([[2.0, 3.0], [4.0, 5.0], [8.0, 9.0]]),
        "env_infos": {"x": np.array([10, 20, 30])},
        "agent_infos": {"mean": np.array([[0.1], [0.2], [0.3]])},
        "step_types": np.array([F, TERM, TOUT]),
    }
    return {**base, **overrides}


def make(**overrides: Any) -> TimeStepBatch:
    return TimeStepBatch(**fields(**overrides))


def assert_batches_equal(a: TimeStepBatch, b: TimeStepBatch) -> None:
    assert a.env_spec == b.env_spec
    np.testing.assert_equal({f: getattr(a, f) for f in FIELDS}, {f: getattr(b, f) for f in FIELDS})


def test_keeps_the_given_arrays() -> None:
    given = fields()
    batch = TimeStepBatch(**given)
    for name in FIELDS:
        assert getattr(batch, name) is given[name]
    assert batch.total_steps == 3


def test_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().rewards = np.zeros(3)  # type: ignore[misc]


def test_terminals() -> None:
    terminals = make().terminals
    assert terminals.dtype == bool
    np.testing.assert_array_equal(terminals, [False, True, False])


def test_repr_shows_shapes() -> None:
    text = repr(make())
    assert text.startswith("TimeStepBatch(total_steps=3, observations=float64(3, 2), ")
    assert "task': {'id': int64(3, 1)}" in text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"rewards": np.zeros((3, 1))},
            r"TimeStepBatch\.rewards: expected shape \(B,\) \(one reward per step\), got \(3, 1\)",
        ),
        ({"rewards": [1.0, 2.0, 3.0]}, r"TimeStepBatch\.rewards: expected a numpy array, got list"),
        (
            {"observations": np.zeros((2, 2))},
            r"TimeStepBatch\.observations: expected leading dimension 3 \(one row per reward\), "
            r"got shape \(2, 2\)",
        ),
        (
            {"observations": np.zeros((3, 4)), "next_observations": np.zeros((3, 4))},
            r"TimeStepBatch\.observations: expected per-step shape \(2,\) for observation_space",
        ),
        (
            {"next_observations": np.zeros((3, 1, 2))},
            r"TimeStepBatch\.next_observations: expected shape \(3, 2\) "
            r"\(shaped like observations\), got \(3, 1, 2\)",
        ),
        (
            {"actions": np.zeros((3, 2))},
            r"TimeStepBatch\.actions: expected per-step shape \(1,\) for action_space Box",
        ),
        (
            {"actions": np.zeros((4, 1))},
            r"TimeStepBatch\.actions: expected leading dimension 3 \(one row per reward\)",
        ),
        (
            {"step_types": np.array([F, TERM])},
            r"TimeStepBatch\.step_types: expected shape \(3,\) \(one row per reward\), got \(2,\)",
        ),
        (
            {"step_types": np.array([F, 9, TOUT])},
            r"TimeStepBatch\.step_types: expected StepType values 0\.\.3, got 9 at index 1",
        ),
        (
            {"episode_infos": {"seed": np.array([7, 8])}},
            r"TimeStepBatch\.episode_infos\['seed'\]: expected leading dimension 3 "
            r"\(one row per reward\), got shape \(2,\)",
        ),
        (
            {"agent_infos": {"mean": {"deep": np.zeros(1)}}},
            r"TimeStepBatch\.agent_infos\['mean'\]\['deep'\]: expected leading dimension 3",
        ),
        ({"env_infos": []}, r"TimeStepBatch\.env_infos: expected a dict, got list"),
        ({"env_spec": object()}, r"TimeStepBatch\.env_spec: expected an rlfleet EnvSpec"),
    ],
)
def test_validation_names_field_and_shapes(override: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBatchError, match=message):
        make(**override)


def test_split_gives_single_step_views() -> None:
    batch = make()
    steps = batch.split()
    assert len(steps) == 3
    last = steps[2]
    np.testing.assert_array_equal(last.observations, [[6.0, 7.0]])
    np.testing.assert_array_equal(last.next_observations, [[8.0, 9.0]])
    np.testing.assert_array_equal(last.rewards, [3.0])
    np.testing.assert_array_equal(last.step_types, [TOUT])
    np.testing.assert_equal(
        last.episode_infos, {"seed": np.array([8]), "task": {"id": np.array([[2]])}}
    )
    assert np.shares_memory(last.actions, batch.actions)


def test_concatenate_inverts_split() -> None:
    batch = make()
    assert_batches_equal(TimeStepBatch.concatenate(*batch.split()), batch)


def test_concatenate_two_batches() -> None:
    batch = make()
    doubled = TimeStepBatch.concatenate(batch, batch)
    np.testing.assert_array_equal(doubled.rewards, [1, 2, 3, 1, 2, 3])
    np.testing.assert_array_equal(doubled.episode_infos["task"]["id"].ravel(), [1, 1, 2, 1, 1, 2])
    np.testing.assert_array_equal(doubled.terminals, [False, True, False] * 2)


def test_concatenate_one_batch_returns_it() -> None:
    batch = make()
    assert TimeStepBatch.concatenate(batch) is batch


def test_concatenate_errors() -> None:
    with pytest.raises(InvalidBatchError, match="expected at least one batch, got none"):
        TimeStepBatch.concatenate()
    other_space = make(
        env_spec=EnvSpec(OBS_SPACE, gym.spaces.Discrete(2)), actions=np.array([0, 1, 0])
    )
    with pytest.raises(InvalidBatchError, match=r"batch 1 has spaces .*Discrete\(2\)"):
        TimeStepBatch.concatenate(make(), other_space)
    with pytest.raises(
        InvalidBatchError,
        match=r"TimeStepBatch\.concatenate env_infos: item 1 has keys \['y'\], "
        r"item 0 has keys \['x'\]",
    ):
        TimeStepBatch.concatenate(make(), make(env_infos={"y": np.zeros(3)}))


def test_to_time_step_list() -> None:
    samples = make().to_time_step_list()
    assert len(samples) == 3
    assert set(samples[1]) == set(FIELDS)
    np.testing.assert_equal(
        samples[1],
        {
            "episode_infos": {"seed": np.array([7]), "task": {"id": np.array([[1]])}},
            "observations": np.array([[2.0, 3.0]]),
            "actions": np.array([[-0.5]], dtype=np.float32),
            "rewards": np.array([2.0]),
            "next_observations": np.array([[4.0, 5.0]]),
            "env_infos": {"x": np.array([20])},
            "agent_infos": {"mean": np.array([[0.2]])},
            "step_types": np.array([TERM]),
        },
    )


def test_from_time_step_list_inverts_to_time_step_list() -> None:
    batch = make()
    assert_batches_equal(TimeStepBatch.from_time_step_list(SPEC, batch.to_time_step_list()), batch)


def test_from_time_step_list_without_infos() -> None:
    samples = [
        {
            "observations": np.array([[0.0, 1.0]]),
            "actions": np.array([[0.5]]),
            "rewards": np.array([1.0]),
            "next_observations": np.array([[2.0, 3.0]]),
            "step_types": np.array([F]),
        }
    ]
    batch = TimeStepBatch.from_time_step_list(SPEC, samples)
    assert batch.episode_infos == batch.env_infos == batch.agent_infos == {}
    assert batch.total_steps == 1


def test_from_time_step_list_errors() -> None:
    with pytest.raises(InvalidBatchError, match="expected at least one dict, got none"):
        TimeStepBatch.from_time_step_list(SPEC, [])
    samples = make().to_time_step_list()
    del samples[2]["rewards"]
    with pytest.raises(
        InvalidBatchError, match=r"TimeStepBatch\.from_time_step_list: item 2 has no 'rewards'"
    ):
        TimeStepBatch.from_time_step_list(SPEC, samples)


def test_from_episode_batch() -> None:
    episodes = EpisodeBatch(
        env_spec=SPEC,
        episode_infos={"seed": np.array([7, 8])},
        observations=np.array([[0.0, 1.0], [2.0, 3.0], [6.0, 7.0]]),
        last_observations=np.array([[4.0, 5.0], [8.0, 9.0]]),
        actions=np.array([[0.5], [-0.5], [0.0]]),
        rewards=np.array([1.0, 2.0, 3.0]),
        env_infos={"x": np.array([10, 20, 30])},
        agent_infos={},
        step_types=np.array([F, TERM, TOUT]),
        lengths=np.array([2, 1]),
    )
    batch = TimeStepBatch.from_episode_batch(episodes)
    np.testing.assert_array_equal(batch.next_observations, [[2, 3], [4, 5], [8, 9]])
    np.testing.assert_array_equal(batch.episode_infos["seed"], [7, 7, 8])
    np.testing.assert_array_equal(batch.terminals, [False, True, False])
    for shared in ("observations", "actions", "rewards", "step_types", "env_infos"):
        assert getattr(batch, shared) is getattr(episodes, shared)
    assert batch.env_spec is SPEC
