"""EpisodeBatch against hand-computed expectations, plus the padding helpers.

The reference batch has two episodes of lengths 2 and 3 in a Box(2,)
observation / Discrete(3) action env with max_episode_length 4:

    step  episode  obs       action  reward  step_type
    0     0        [0, 1]    0       1       FIRST
    1     0        [2, 3]    1       2       TERMINAL   last obs [4, 5]
    2     1        [10, 11]  2       3       FIRST
    3     1        [12, 13]  0       4       MID
    4     1        [14, 15]  1       5       TIMEOUT    last obs [16, 17]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import EnvSpec, EpisodeBatch, StepType, pad_batch_array, pad_to_last
from rlfleet.errors import InvalidBatchError

F, M, TERM, TOUT = (int(s) for s in StepType)
OBS_SPACE = gym.spaces.Box(-100.0, 100.0, (2,), dtype=np.float64)
SPEC = EnvSpec(OBS_SPACE, gym.spaces.Discrete(3), max_episode_length=4)
FIELDS = (
    "episode_infos",
    "observations",
    "last_observations",
    "actions",
    "rewards",
    "env_infos",
    "agent_infos",
    "step_types",
    "lengths",
)


def fields(**overrides: Any) -> dict[str, Any]:
    base = {
        "env_spec": SPEC,
        "episode_infos": {
            "seed": np.array([7, 8]),
            "goal": {"xy": np.array([[1.0, 1.0], [2.0, 2.0]])},
        },
        "observations": np.array([[0, 1], [2, 3], [10, 11], [12, 13], [14, 15]], dtype=float),
        "last_observations": np.array([[4, 5], [16, 17]], dtype=float),
        "actions": np.array([0, 1, 2, 0, 1]),
        "rewards": np.array([1.0, 2.0, 3.0, 4.0, 5.0]),
        "env_infos": {
            "x": np.array([0.1, 0.2, 0.3, 0.4, 0.5]),
            "nested": {"y": np.arange(10).reshape(5, 2)},
        },
        "agent_infos": {"logp": np.array([-1.0, -2.0, -3.0, -4.0, -5.0])},
        "step_types": np.array([F, TERM, F, M, TOUT]),
        "lengths": np.array([2, 3]),
    }
    return {**base, **overrides}


def make(**overrides: Any) -> EpisodeBatch:
    return EpisodeBatch(**fields(**overrides))


def assert_batches_equal(a: EpisodeBatch, b: EpisodeBatch) -> None:
    assert a.env_spec == b.env_spec
    np.testing.assert_equal({f: getattr(a, f) for f in FIELDS}, {f: getattr(b, f) for f in FIELDS})


# ------------------------------------------------------------ construction


def test_keeps_the_given_arrays_without_copying() -> None:
    given_fields = fields()
    batch = EpisodeBatch(**given_fields)
    for name in FIELDS:
        assert getattr(batch, name) is given_fields[name]


def test_with_episode_infos_adds_a_column_and_shares_the_rest() -> None:
    batch = make()
    labelled = batch.with_episode_infos(stream=np.array([3, 5]), seed=np.array([1, 2]))
    assert labelled.episode_infos["stream"].tolist() == [3, 5]
    assert labelled.episode_infos["seed"].tolist() == [1, 2]
    assert labelled.episode_infos["goal"] is batch.episode_infos["goal"]
    assert batch.episode_infos["seed"].tolist() == [7, 8]  # the original is unchanged
    for name in FIELDS:
        if name != "episode_infos":
            assert getattr(labelled, name) is getattr(batch, name)


def test_with_episode_infos_checks_the_new_columns() -> None:
    with pytest.raises(InvalidBatchError, match="episode_infos"):
        make().with_episode_infos(stream=np.array([1, 2, 3]))


def test_sizes() -> None:
    batch = make()
    assert (batch.n_episodes, batch.total_steps) == (2, 5)


def test_is_frozen_and_takes_garages_positional_order() -> None:
    batch = make()
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.rewards = np.zeros(5)  # type: ignore[misc]
    # fields() lists garage's order: env_spec, episode_infos, observations, ...
    assert EpisodeBatch(*fields().values()) == batch


def test_repr_shows_shapes_not_data() -> None:
    text = repr(make())
    assert text.startswith("EpisodeBatch(n_episodes=2, total_steps=5, ")
    assert "observations=float64(5, 2)" in text
    assert "env_infos={'x': float64(5,), 'nested': {'y': int64(5, 2)}}" in text
    assert "14." not in text


def test_narrow_integer_step_types_are_kept_as_given() -> None:
    step_types = np.array([F, TERM, F, M, TOUT], dtype=np.uint8)
    assert make(step_types=step_types).step_types is step_types


def test_garage_style_step_type_arrays_keep_their_members() -> None:
    # Under numpy 2, dtype=StepType makes an object array; garage keeps it.
    step_types = np.array(
        [StepType.FIRST, StepType.TERMINAL, StepType.FIRST, StepType.MID, StepType.TIMEOUT],
        dtype=StepType,
    )
    assert step_types.dtype == object
    batch = make(step_types=step_types)
    assert batch.step_types is step_types
    assert batch.step_types[1] is StepType.TERMINAL
    np.testing.assert_array_equal(batch.step_types, [F, TERM, F, M, TOUT])
    # Object arrays of plain ints are not garage's form: stored as int64.
    ints = make(step_types=np.array([0, 2, 0, 1, 3], dtype=object))
    assert ints.step_types.dtype == np.int64


def test_empty_batch_is_valid() -> None:
    batch = make(
        episode_infos={},
        observations=np.zeros((0, 2)),
        last_observations=np.zeros((0, 2)),
        actions=np.zeros(0, dtype=int),
        rewards=np.zeros(0),
        env_infos={},
        agent_infos={},
        step_types=np.zeros(0, dtype=int),
        lengths=np.zeros(0, dtype=int),
    )
    assert (batch.n_episodes, batch.total_steps) == (0, 0)
    assert batch.next_observations.shape == (0, 2)
    assert batch.padded_rewards.shape == (0, 4)
    assert batch.split() == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"rewards": np.zeros(4)},
            r"EpisodeBatch\.rewards: expected shape \(5,\) \(sum of lengths\), got \(4,\)",
        ),
        ({"rewards": np.zeros((5, 1))}, r"EpisodeBatch\.rewards: expected shape \(5,\)"),
        (
            {"rewards": np.array(["a"] * 5)},
            r"EpisodeBatch\.rewards: expected a float or integer dtype, got <U1",
        ),
        (
            {"observations": np.zeros((4, 2))},
            r"EpisodeBatch\.observations: expected leading dimension 5 \(sum of lengths\), "
            r"got shape \(4, 2\)",
        ),
        (
            {"observations": np.zeros((5, 3))},
            r"EpisodeBatch\.observations: expected per-step shape \(2,\) for observation_space "
            r"Box\(-100\.0, 100\.0, \(2,\), float64\), got per-step shape \(3,\) "
            r"\(array shape \(5, 3\)\)",
        ),
        (
            {"observations": [[0, 1]] * 5},
            r"EpisodeBatch\.observations: expected a numpy array, got list; "
            r"convert it with np\.asarray",
        ),
        (
            {"last_observations": np.zeros((3, 2))},
            r"EpisodeBatch\.last_observations: expected shape \(2, 2\) "
            r"\(one per episode, shaped like observations\), got \(3, 2\)",
        ),
        (
            {"actions": np.zeros(4, dtype=int)},
            r"EpisodeBatch\.actions: expected leading dimension 5 \(sum of lengths\), "
            r"got shape \(4,\)",
        ),
        (
            {"actions": np.zeros((5, 2))},
            r"EpisodeBatch\.actions: expected per-step shape \(\) or \(3,\) for action_space "
            r"Discrete\(3\), got per-step shape \(2,\)",
        ),
        ({"actions": np.int64(1)}, r"EpisodeBatch\.actions: expected a numpy array, got int64"),
        (
            {"step_types": np.zeros(4, dtype=int)},
            r"EpisodeBatch\.step_types: expected shape \(5,\) \(sum of lengths\), got \(4,\)",
        ),
        (
            {"step_types": np.zeros(5)},
            r"EpisodeBatch\.step_types: expected an integer dtype holding StepType values, "
            r"got float64",
        ),
        (
            {"step_types": np.array([F, TERM, F, 4, TOUT])},
            r"EpisodeBatch\.step_types: expected StepType values 0\.\.3, got 4 at index 3",
        ),
        (
            {"step_types": np.array([F, TERM, F, 255, TOUT], dtype=np.uint8)},
            r"EpisodeBatch\.step_types: expected StepType values 0\.\.3, got 255 at index 3",
        ),
        (
            {"step_types": np.array([F, TERM, -1, M, TOUT], dtype=np.int8)},
            r"EpisodeBatch\.step_types: expected StepType values 0\.\.3, got -1 at index 2",
        ),
        (
            {"step_types": np.array([F, TERM, F, "x", TOUT], dtype=object)},
            r"EpisodeBatch\.step_types: expected StepType values, got an object array",
        ),
        (
            {"lengths": np.array([2.0, 3.0])},
            r"EpisodeBatch\.lengths: expected an integer dtype, got float64",
        ),
        ({"lengths": np.array([[2, 3]])}, r"EpisodeBatch\.lengths: expected shape \(N,\)"),
        (
            {"lengths": np.array([5, 0])},
            r"EpisodeBatch\.lengths: every episode needs at least one step, "
            r"got length 0 at index 1",
        ),
        (
            {"env_infos": {"x": np.zeros(5), "nested": {"y": np.zeros((4, 2))}}},
            r"EpisodeBatch\.env_infos\['nested'\]\['y'\]: expected leading dimension 5 "
            r"\(sum of lengths\), got shape \(4, 2\)",
        ),
        (
            {"env_infos": {"x": [1, 2, 3, 4, 5]}},
            r"EpisodeBatch\.env_infos\['x'\]: expected a numpy array or a dict, got list",
        ),
        (
            {"agent_infos": {"logp": np.float64(1.0)}},
            r"EpisodeBatch\.agent_infos\['logp'\]: expected a numpy array or a dict",
        ),
        (
            {"agent_infos": {"logp": np.array(1.0)}},
            r"EpisodeBatch\.agent_infos\['logp'\]: expected leading dimension 5 "
            r"\(sum of lengths\), got shape \(\)",
        ),
        ({"agent_infos": None}, r"EpisodeBatch\.agent_infos: expected a dict, got NoneType"),
        (
            {"episode_infos": {"seed": np.zeros(5)}},
            r"EpisodeBatch\.episode_infos\['seed'\]: expected leading dimension 2 "
            r"\(number of episodes\), got shape \(5,\)",
        ),
        ({"env_spec": None}, r"EpisodeBatch\.env_spec: expected an rlfleet EnvSpec"),
    ],
)
def test_validation_names_field_and_shapes(override: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBatchError, match=message):
        make(**override)


def test_invalid_batch_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"EpisodeBatch\.rewards"):
        make(rewards=np.zeros(3))


def test_one_hot_actions_are_accepted() -> None:
    one_hot = np.eye(3)[[0, 1, 2, 0, 1]]
    assert make(actions=one_hot).actions.shape == (5, 3)


def test_dict_observations_must_be_flattened() -> None:
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1, 1, (2,)), "mode": gym.spaces.Discrete(3)})
    spec = EnvSpec(space, gym.spaces.Discrete(3), 4)
    flat = np.zeros((5, 5))
    batch = make(env_spec=spec, observations=flat, last_observations=np.zeros((2, 5)))
    assert batch.observations is flat
    with pytest.raises(
        InvalidBatchError, match=r"per-step shape \(5,\).*gymnasium\.spaces\.flatten"
    ):
        make(env_spec=spec)


# ------------------------------------------------------------------ views


def test_next_observations() -> None:
    expected = [[2, 3], [4, 5], [12, 13], [14, 15], [16, 17]]
    np.testing.assert_array_equal(make().next_observations, expected)


def test_episode_infos_by_episode_and_by_step() -> None:
    batch = make()
    assert batch.episode_infos_by_episode is batch.episode_infos
    np.testing.assert_equal(
        batch.episode_infos_by_step,
        {
            "seed": np.array([7, 7, 8, 8, 8]),
            "goal": {"xy": np.array([[1.0, 1.0]] * 2 + [[2.0, 2.0]] * 3)},
        },
    )


def test_observations_and_actions_lists_are_per_episode_views() -> None:
    batch = make()
    obs = batch.observations_list
    np.testing.assert_equal(
        obs, [np.array([[0, 1], [2, 3]]), np.array([[10, 11], [12, 13], [14, 15]])]
    )
    assert all(np.shares_memory(o, batch.observations) for o in obs)
    np.testing.assert_equal(batch.actions_list, [np.array([0, 1]), np.array([2, 0, 1])])


# ---------------------------------------------------------------- padding


def test_padded_arrays() -> None:
    batch = make()
    np.testing.assert_array_equal(
        batch.padded_observations,
        [[[0, 1], [2, 3], [0, 0], [0, 0]], [[10, 11], [12, 13], [14, 15], [0, 0]]],
    )
    np.testing.assert_array_equal(
        batch.padded_next_observations,
        [[[2, 3], [4, 5], [0, 0], [0, 0]], [[12, 13], [14, 15], [16, 17], [0, 0]]],
    )
    np.testing.assert_array_equal(batch.padded_actions, [[0, 1, 0, 0], [2, 0, 1, 0]])
    np.testing.assert_array_equal(batch.padded_rewards, [[1, 2, 0, 0], [3, 4, 5, 0]])
    np.testing.assert_array_equal(batch.padded_step_types, [[F, TERM, 0, 0], [F, M, TOUT, 0]])
    np.testing.assert_array_equal(batch.valids, [[1, 1, 0, 0], [1, 1, 1, 0]])
    assert batch.valids.dtype == batch.rewards.dtype
    assert batch.padded_observations.dtype == np.float64
    assert batch.padded_actions.dtype == batch.actions.dtype


def test_padded_infos_keep_nesting() -> None:
    batch = make()
    np.testing.assert_array_equal(
        batch.padded_agent_infos["logp"], [[-1, -2, 0, 0], [-3, -4, -5, 0]]
    )
    np.testing.assert_array_equal(
        batch.padded_env_infos["x"], [[0.1, 0.2, 0, 0], [0.3, 0.4, 0.5, 0]]
    )
    np.testing.assert_array_equal(
        batch.padded_env_infos["nested"]["y"],
        [[[0, 1], [2, 3], [0, 0], [0, 0]], [[4, 5], [6, 7], [8, 9], [0, 0]]],
    )


@pytest.mark.parametrize(
    "prop",
    [
        "padded_observations",
        "padded_next_observations",
        "padded_actions",
        "padded_rewards",
        "padded_step_types",
        "padded_agent_infos",
        "padded_env_infos",
        "valids",
    ],
)
def test_padding_needs_a_max_episode_length(prop: str) -> None:
    batch = make(env_spec=EnvSpec(SPEC.observation_space, SPEC.action_space))
    with pytest.raises(
        InvalidBatchError, match=rf"EpisodeBatch\.{prop}: env_spec\.max_episode_length is None"
    ):
        getattr(batch, prop)


def test_padding_an_episode_longer_than_the_limit_warns_and_pads_to_it() -> None:
    batch = make(env_spec=EnvSpec(SPEC.observation_space, SPEC.action_space, 2))
    with pytest.warns(UserWarning, match="length 3 is longer than the requested max_length 2"):
        padded = batch.padded_rewards
    np.testing.assert_array_equal(padded, [[1, 2, 0], [3, 4, 5]])


def test_pad_batch_array_without_max_length_pads_to_the_longest() -> None:
    padded = pad_batch_array(np.arange(1, 6), np.array([3, 1, 1]))
    np.testing.assert_array_equal(padded, [[1, 2, 3], [4, 0, 0], [5, 0, 0]])


def test_pad_batch_array_checks_the_leading_dimension() -> None:
    with pytest.raises(
        ValueError, match=r"expected leading dimension 5 \(sum of lengths\), got shape \(4,\)"
    ):
        pad_batch_array(np.zeros(4), np.array([2, 3]), 4)


def test_pad_to_last() -> None:
    np.testing.assert_array_equal(pad_to_last([1, 2], 4), [1, 2, 0, 0])
    np.testing.assert_array_equal(pad_to_last(np.array([1.0, 2.0]), 3, val=9), [1, 2, 9])
    np.testing.assert_array_equal(pad_to_last(np.ones((1, 2)), 3, axis=0), [[1, 1], [0, 0], [0, 0]])
    np.testing.assert_array_equal(pad_to_last(np.ones((2, 1)), 2, axis=-1), [[1, 0], [1, 0]])
    np.testing.assert_array_equal(pad_to_last(np.ones((2, 1)), 3, axis=-2), [[1], [1], [0]])
    longer = np.arange(5)
    assert pad_to_last(longer, 3) is longer
    with pytest.raises(IndexError, match=r"axis 2 is out of range for shape \(2, 1\)"):
        pad_to_last(np.ones((2, 1)), 3, axis=2)
    with pytest.raises(IndexError, match="axis -3"):
        pad_to_last(np.ones((2, 1)), 3, axis=-3)


# --------------------------------------------------------- split / concat


def test_split_gives_one_batch_per_episode_as_views() -> None:
    batch = make()
    first, second = batch.split()
    np.testing.assert_array_equal(first.observations, [[0, 1], [2, 3]])
    np.testing.assert_array_equal(first.last_observations, [[4, 5]])
    np.testing.assert_array_equal(second.rewards, [3, 4, 5])
    np.testing.assert_array_equal(second.step_types, [F, M, TOUT])
    np.testing.assert_array_equal(second.lengths, [3])
    np.testing.assert_equal(
        second.episode_infos, {"seed": np.array([8]), "goal": {"xy": np.array([[2.0, 2.0]])}}
    )
    np.testing.assert_equal(
        second.env_infos,
        {"x": np.array([0.3, 0.4, 0.5]), "nested": {"y": np.arange(4, 10).reshape(3, 2)}},
    )
    assert np.shares_memory(second.observations, batch.observations)
    assert second.env_spec is SPEC


def test_concatenate_inverts_split() -> None:
    batch = make()
    assert_batches_equal(EpisodeBatch.concatenate(*batch.split()), batch)


def test_concatenate_two_batches() -> None:
    batch = make()
    doubled = EpisodeBatch.concatenate(batch, batch)
    np.testing.assert_array_equal(doubled.lengths, [2, 3, 2, 3])
    np.testing.assert_array_equal(doubled.episode_infos["seed"], [7, 8, 7, 8])
    np.testing.assert_array_equal(
        doubled.env_infos["nested"]["y"][5:], batch.env_infos["nested"]["y"]
    )
    np.testing.assert_array_equal(doubled.last_observations, [[4, 5], [16, 17], [4, 5], [16, 17]])
    assert doubled.total_steps == 10


def test_concatenate_one_batch_returns_it() -> None:
    batch = make()
    assert EpisodeBatch.concatenate(batch) is batch


def test_concatenate_nothing_is_an_error() -> None:
    with pytest.raises(InvalidBatchError, match="expected at least one batch, got none"):
        EpisodeBatch.concatenate()


def test_concatenate_rejects_other_spaces() -> None:
    other = make(env_spec=EnvSpec(OBS_SPACE, gym.spaces.Discrete(4), 4))
    with pytest.raises(
        InvalidBatchError, match=r"batch 1 has spaces .*Discrete\(4\).*batch 0 has .*Discrete\(3\)"
    ):
        EpisodeBatch.concatenate(make(), other)


def test_concatenate_allows_another_max_episode_length_and_keeps_the_first() -> None:
    other = make(env_spec=EnvSpec(OBS_SPACE, gym.spaces.Discrete(3), 10))
    assert EpisodeBatch.concatenate(make(), other).env_spec is SPEC


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            {"env_infos": {"x": np.zeros(5)}},
            r"env_infos: item 1 has keys \['x'\], item 0 has keys \['nested', 'x'\]",
        ),
        (
            {"episode_infos": {"seed": np.array([1, 2]), "goal": np.zeros((2, 2))}},
            r"EpisodeBatch\.concatenate episode_infos\['goal'\]: is a dict in item 0 but a ndarray "
            r"in item 1",
        ),
        (
            {"agent_infos": {"logp": np.zeros((5, 2))}},
            r"EpisodeBatch\.concatenate agent_infos\['logp'\]: "
            r"cannot concatenate shapes \[\(5,\), \(5, 2\)\]",
        ),
    ],
)
def test_concatenate_rejects_mismatched_infos(override: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidBatchError, match=message):
        EpisodeBatch.concatenate(make(), make(**override))


def test_concatenate_rejects_mismatched_array_layouts() -> None:
    spec = EnvSpec(gym.spaces.Box(-1, 1, (2, 2)), gym.spaces.Discrete(3), 4)
    shaped = make(
        env_spec=spec, observations=np.zeros((5, 2, 2)), last_observations=np.zeros((2, 2, 2))
    )
    flat = make(env_spec=spec, observations=np.zeros((5, 4)), last_observations=np.zeros((2, 4)))
    with pytest.raises(
        InvalidBatchError,
        match=r"EpisodeBatch\.concatenate observations: "
        r"cannot concatenate shapes \[\(5, 2, 2\), \(5, 4\)\]",
    ):
        EpisodeBatch.concatenate(shaped, flat)


# ---------------------------------------------------------------- to/from list


def test_to_list() -> None:
    paths = make().to_list()
    assert len(paths) == 2
    assert set(paths[1]) == {
        "episode_infos",
        "observations",
        "next_observations",
        "actions",
        "rewards",
        "env_infos",
        "agent_infos",
        "step_types",
    }
    np.testing.assert_equal(
        paths[1],
        {
            "episode_infos": {"seed": 8, "goal": {"xy": np.array([2.0, 2.0])}},
            "observations": np.array([[10, 11], [12, 13], [14, 15]]),
            "next_observations": np.array([[12, 13], [14, 15], [16, 17]]),
            "actions": np.array([2, 0, 1]),
            "rewards": np.array([3.0, 4.0, 5.0]),
            "env_infos": {
                "x": np.array([0.3, 0.4, 0.5]),
                "nested": {"y": np.arange(4, 10).reshape(3, 2)},
            },
            "agent_infos": {"logp": np.array([-3.0, -4.0, -5.0])},
            "step_types": np.array([F, M, TOUT]),
        },
    )


def test_from_list_inverts_to_list() -> None:
    batch = make()
    assert_batches_equal(EpisodeBatch.from_list(SPEC, batch.to_list()), batch)


def test_from_list_with_t_plus_one_observations() -> None:
    batch = make()
    paths = batch.to_list()
    for path, last in zip(paths, batch.last_observations, strict=True):
        path["observations"] = np.concatenate([path.pop("observations"), [last]])
        del path["next_observations"]
    assert len(paths[0]["observations"]) == 3
    assert_batches_equal(EpisodeBatch.from_list(SPEC, paths), batch)


def test_from_list_with_t_observations_repeats_the_last_one() -> None:
    paths = make().to_list()
    for path in paths:
        del path["next_observations"]
    rebuilt = EpisodeBatch.from_list(SPEC, paths)
    np.testing.assert_array_equal(rebuilt.last_observations, [[2, 3], [14, 15]])
    np.testing.assert_array_equal(rebuilt.observations, make().observations)


def test_from_list_reads_each_path_on_its_own() -> None:
    batch = make()
    paths = batch.to_list()
    paths[0]["observations"] = np.concatenate([paths[0]["observations"], [[4, 5]]])
    del paths[0]["next_observations"]
    assert_batches_equal(EpisodeBatch.from_list(SPEC, paths), batch)


def test_from_list_with_plain_lists_and_dones() -> None:
    paths = [
        {
            "observations": [[0, 1], [2, 3], [4, 5]],
            "actions": [0, 1],
            "rewards": [1.0, 2.0],
            "dones": [False, True],
        },
        {"observations": [[6, 7], [8, 9]], "actions": [2], "rewards": [3.0], "dones": [False]},
    ]
    batch = EpisodeBatch.from_list(SPEC, paths)
    np.testing.assert_array_equal(batch.observations, [[0, 1], [2, 3], [6, 7]])
    np.testing.assert_array_equal(batch.last_observations, [[4, 5], [8, 9]])
    np.testing.assert_array_equal(batch.step_types, [M, TERM, M])
    np.testing.assert_array_equal(batch.lengths, [2, 1])
    assert batch.episode_infos == batch.env_infos == batch.agent_infos == {}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda p: p[1].update(observations=np.zeros((5, 2))),
            r"path 1 has 5 observations, expected 3 \(T = len\(rewards\)\) or 4 \(T \+ 1\)",
        ),
        (lambda p: p[0].pop("step_types"), "path 0 has neither step_types nor dones"),
        (lambda p: p[1].pop("actions"), r"EpisodeBatch\.from_list: path 1 has no 'actions'"),
        (
            lambda p: p[1]["env_infos"].pop("x"),
            r"from_list env_infos: item 1 has keys \['nested'\]",
        ),
        (
            lambda p: p[0].update(actions=np.zeros(3, dtype=int)),
            r"EpisodeBatch\.actions: expected leading dimension 5 \(sum of lengths\), "
            r"got shape \(6,\)",
        ),
    ],
)
def test_from_list_errors(mutate: Callable[[list[dict[str, Any]]], object], message: str) -> None:
    paths = make().to_list()
    mutate(paths)
    with pytest.raises(InvalidBatchError, match=message):
        EpisodeBatch.from_list(SPEC, paths)


def test_from_list_needs_a_path() -> None:
    with pytest.raises(InvalidBatchError, match="expected at least one path, got none"):
        EpisodeBatch.from_list(SPEC, [])


# ------------------------------------------------------- real env, property


def test_batch_from_a_real_cartpole_rollout() -> None:
    env = gym.make("CartPole-v1", max_episode_steps=6)
    spec = EnvSpec.from_env(env)
    paths = []
    for seed in (0, 1):
        obs, _ = env.reset(seed=seed)
        observations, actions, rewards, step_types = [obs], [], [], []
        for step in range(1, 100):
            action = step % 2
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            actions.append(action)
            rewards.append(reward)
            step_types.append(int(StepType.FIRST if step == 1 else StepType.MID))
            if terminated or truncated:
                step_types[-1] = int(StepType.TERMINAL if terminated else StepType.TIMEOUT)
                break
        paths.append(
            {
                "observations": np.array(observations),
                "actions": np.array(actions),
                "rewards": np.array(rewards),
                "step_types": np.array(step_types),
            }
        )
    batch = EpisodeBatch.from_list(spec, paths)
    assert batch.env_spec.max_episode_length == 6
    np.testing.assert_array_equal(batch.lengths, [len(p["rewards"]) for p in paths])
    np.testing.assert_array_equal(batch.last_observations, [p["observations"][-1] for p in paths])
    assert batch.padded_observations.shape == (2, 6, 4)
    np.testing.assert_array_equal(
        batch.padded_observations[1, : batch.lengths[1]], paths[1]["observations"][:-1]
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_round_trips_for_any_lengths(lengths: list[int]) -> None:
    total = sum(lengths)
    observations = np.arange(2 * total, dtype=float).reshape(total, 2)
    batch = make(
        episode_infos={"seed": np.arange(len(lengths))},
        observations=observations,
        last_observations=-np.arange(2 * len(lengths), dtype=float).reshape(-1, 2),
        actions=np.arange(total) % 3,
        rewards=np.arange(total, dtype=float),
        env_infos={"nested": {"y": observations * 2}},
        agent_infos={},
        step_types=np.full(total, M),
        lengths=np.array(lengths),
    )
    assert_batches_equal(EpisodeBatch.from_list(SPEC, batch.to_list()), batch)
    assert_batches_equal(EpisodeBatch.concatenate(*batch.split()), batch)
    # Padding then masking with valids gives back the flat arrays, in order.
    np.testing.assert_array_equal(
        batch.padded_observations[batch.valids.astype(bool)], observations
    )
    ends = np.cumsum(lengths) - 1
    np.testing.assert_array_equal(batch.next_observations[ends], batch.last_observations)
    inner = np.setdiff1d(np.arange(total), ends)
    np.testing.assert_array_equal(batch.next_observations[inner], observations[inner + 1])


def test_take_episodes_reorders_and_subsets() -> None:
    batch = make()
    swapped = batch.take_episodes([1, 0])
    parts = batch.split()
    assert_batches_equal(swapped, EpisodeBatch.concatenate(parts[1], parts[0]))
    assert_batches_equal(batch.take_episodes([1]), parts[1])
    assert batch.take_episodes([0, 1]) is batch


def test_take_episodes_rejects_positions_out_of_range() -> None:
    with pytest.raises(InvalidBatchError, match=r"take_episodes: positions must be in 0\.\.1"):
        make().take_episodes([2])
