"""gymnasium spaces and EnvSpec through the wire: round trips and errors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import EnvSpec
from rlfleet.errors import WireFormatError
from rlfleet.v1 import spaces_pb2, tensor_pb2
from rlfleet.wire import (
    decode_env_spec,
    decode_space,
    encode_env_spec,
    encode_space,
    encode_tensor,
)

INF = np.inf


def round_trip(space: gym.Space) -> gym.Space:
    data = encode_space(space).SerializeToString()
    return decode_space(spaces_pb2.Space.FromString(data))


def assert_spaces_identical(got: gym.Space, expected: gym.Space) -> None:
    """Equality, plus what gymnasium's == leaves out: exact bounds, key order."""
    assert got == expected
    assert type(got) is type(expected)
    if isinstance(expected, gym.spaces.Box):
        assert isinstance(got, gym.spaces.Box)
        assert got.dtype == expected.dtype
        assert got.low.tobytes() == expected.low.tobytes()
        assert got.high.tobytes() == expected.high.tobytes()
    elif isinstance(expected, gym.spaces.Dict):
        assert isinstance(got, gym.spaces.Dict)
        assert list(got.spaces) == list(expected.spaces)
        for key, sub in expected.spaces.items():
            assert_spaces_identical(got.spaces[key], sub)
    elif isinstance(expected, gym.spaces.Tuple):
        assert isinstance(got, gym.spaces.Tuple)
        for got_sub, sub in zip(got.spaces, expected.spaces, strict=True):
            assert_spaces_identical(got_sub, sub)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 2.0, (3,), np.float32),
        gym.spaces.Box(np.array([-INF, 0.0]), np.array([1.0, INF]), dtype=np.float64),
        gym.spaces.Box(0, 255, (2, 2, 3), np.uint8),
        gym.spaces.Box(-5, 5, (), np.int64),
        # gymnasium's annotations leave out bool, which its Box accepts.
        gym.spaces.Box(np.zeros(2, bool), np.ones(2, bool), dtype=np.bool_),  # type: ignore[arg-type]
        gym.spaces.Box(-1.0, 1.0, (1,), np.float16),
        gym.spaces.Discrete(5),
        gym.spaces.Discrete(3, start=-2),
        gym.spaces.MultiDiscrete([3, 4]),
        gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, -1], [0, 7]])),
        gym.spaces.MultiDiscrete([3, 4], dtype=np.int32),
        gym.spaces.MultiBinary(4),
        gym.spaces.MultiBinary([2, 3]),
        gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (2,))]),
        gym.spaces.Dict(
            [("zeta", gym.spaces.Discrete(2)), ("alpha", gym.spaces.MultiBinary(3))],
        ),
        gym.spaces.Dict(
            {
                "pos": gym.spaces.Tuple(
                    [
                        gym.spaces.Box(-1, 1, (2,)),
                        gym.spaces.Dict({"inner": gym.spaces.Discrete(4)}),
                    ]
                ),
                "flag": gym.spaces.MultiBinary([1, 2]),
            }
        ),
        gym.spaces.Tuple([]),
        gym.spaces.Dict({}),
    ],
    ids=lambda space: type(space).__name__,
)
def test_supported_spaces_round_trip(space: gym.Space) -> None:
    assert_spaces_identical(round_trip(space), space)


def test_box_bounds_travel_as_full_tensors_of_the_space_dtype() -> None:
    box = gym.spaces.Box(np.array([0, 1], np.int16), np.array([5, 9], np.int16), dtype=np.int16)
    msg = encode_space(box)
    assert msg.WhichOneof("kind") == "box"
    assert list(msg.box.shape) == [2]
    assert msg.box.dtype == tensor_pb2.DTYPE_INT16
    assert msg.box.low.data == b"\x00\x00\x01\x00"
    assert msg.box.high.data == b"\x05\x00\x09\x00"


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1", "Blackjack-v1"])
def test_spaces_of_real_environments_round_trip(env_id: str) -> None:
    env = gym.make(env_id)
    spec = EnvSpec.from_env(env)
    decoded = decode_env_spec(
        spaces_pb2.EnvSpec.FromString(encode_env_spec(spec).SerializeToString())
    )
    assert decoded == spec
    assert_spaces_identical(decoded.observation_space, spec.observation_space)
    assert_spaces_identical(decoded.action_space, spec.action_space)


def test_env_spec_without_a_length_limit_leaves_the_field_absent() -> None:
    spec = EnvSpec(gym.spaces.Discrete(2), gym.spaces.Discrete(3))
    msg = encode_env_spec(spec)
    assert not msg.HasField("max_episode_length")
    assert decode_env_spec(msg) == spec


# ------------------------------------------------- random nested spaces

leaf_spaces = st.one_of(
    st.builds(
        lambda shape, dtype, low: gym.spaces.Box(low, low + 10, shape, dtype),
        st.lists(st.integers(1, 3), max_size=3).map(tuple),
        st.sampled_from([np.float32, np.float64, np.int8, np.uint8, np.int64]),
        st.integers(0, 50),
    ),
    st.builds(gym.spaces.Discrete, st.integers(1, 10), start=st.integers(-5, 5)),
    st.builds(
        lambda nvec, offset, dtype: gym.spaces.MultiDiscrete(
            nvec, dtype=dtype, start=[offset] * len(nvec)
        ),
        st.lists(st.integers(1, 5), min_size=1, max_size=3),
        st.integers(-3, 3),
        st.sampled_from([np.int64, np.int32]),
    ),
    st.builds(gym.spaces.MultiBinary, st.integers(1, 4)),
    st.builds(gym.spaces.MultiBinary, st.lists(st.integers(1, 3), min_size=2, max_size=3)),
)
keys = st.text(min_size=1, max_size=5)
spaces = st.recursive(
    leaf_spaces,
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(gym.spaces.Tuple),
        st.lists(st.tuples(keys, children), max_size=3, unique_by=lambda kv: kv[0]).map(
            gym.spaces.Dict
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=60, deadline=None)
@given(spaces)
def test_random_nested_spaces_round_trip(space: gym.Space) -> None:
    assert_spaces_identical(round_trip(space), space)


# ------------------------------------------------------------ limitations


def test_discrete_dtype_does_not_travel_and_decodes_as_int64() -> None:
    # spaces.proto's DiscreteSpace has no dtype: samples travel as int64.
    decoded = round_trip(gym.spaces.Discrete(4, dtype=np.int32))
    assert decoded == gym.spaces.Discrete(4)
    assert decoded.dtype == np.int64


def test_one_dimensional_multibinary_decodes_in_its_int_form() -> None:
    decoded = round_trip(gym.spaces.MultiBinary([3]))
    assert isinstance(decoded, gym.spaces.MultiBinary)
    assert decoded.n == 3


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Text(5),
        gym.spaces.Graph(gym.spaces.Discrete(2), None),
        gym.spaces.Sequence(gym.spaces.Discrete(2)),
        gym.spaces.OneOf([gym.spaces.Discrete(2)]),
    ],
    ids=lambda space: type(space).__name__,
)
def test_unsupported_spaces_are_refused_naming_their_type(space: gym.Space) -> None:
    with pytest.raises(WireFormatError, match=f"space type {type(space).__name__} cannot"):
        encode_space(space)


def test_an_unsupported_nested_space_is_named_with_its_position() -> None:
    space = gym.spaces.Dict({"a": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Text(3)])})
    with pytest.raises(WireFormatError, match=r"space\['a'\]\[1\]: gymnasium space type Text"):
        encode_space(space)
    spec = EnvSpec(gym.spaces.Discrete(2), gym.spaces.Text(3))
    with pytest.raises(WireFormatError, match=r"EnvSpec\.action_space: gymnasium space type Text"):
        encode_env_spec(spec)


# ----------------------------------------------------------- decode errors


def box(**fields: Any) -> spaces_pb2.Space:
    base: dict[str, Any] = {
        "shape": [2],
        "dtype": tensor_pb2.DTYPE_FLOAT32,
        "low": encode_tensor(np.zeros(2, np.float32)),
        "high": encode_tensor(np.ones(2, np.float32)),
    }
    return spaces_pb2.Space(box=spaces_pb2.BoxSpace(**{**base, **fields}))


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (spaces_pb2.Space(), "sets no kind"),
        (box(dtype=0), r"space.dtype: no dtype \(DTYPE_UNSPECIFIED\)"),
        (box(dtype=99), "space.dtype: unknown dtype 99"),
        (box(shape=[3]), r"space.low: expected a float32 tensor of shape \(3,\)"),
        (
            box(high=encode_tensor(np.ones(2, np.float64))),
            "space.high: expected a float32 tensor",
        ),
        (box(low=encode_tensor(np.full(2, 5, np.float32))), "gymnasium rejected the box space"),
        (
            spaces_pb2.Space(box=spaces_pb2.BoxSpace(shape=[2], dtype=tensor_pb2.DTYPE_FLOAT32)),
            "space.low: missing",
        ),
        (box(shape=[-1]), "negative dimension"),
        (spaces_pb2.Space(discrete=spaces_pb2.DiscreteSpace(n=0)), "n >= 1, got 0"),
        (
            spaces_pb2.Space(
                multi_discrete=spaces_pb2.MultiDiscreteSpace(
                    nvec=encode_tensor(np.array([2.0])),
                    start=encode_tensor(np.array([0])),
                    dtype=tensor_pb2.DTYPE_INT64,
                )
            ),
            "space.nvec: expected an int64 tensor, got float64",
        ),
        (
            spaces_pb2.Space(
                multi_discrete=spaces_pb2.MultiDiscreteSpace(
                    nvec=encode_tensor(np.array([2, 3])),
                    start=encode_tensor(np.array([0])),
                    dtype=tensor_pb2.DTYPE_INT64,
                )
            ),
            r"space.start: expected shape \(2,\)",
        ),
        (
            spaces_pb2.Space(
                multi_discrete=spaces_pb2.MultiDiscreteSpace(dtype=tensor_pb2.DTYPE_INT64)
            ),
            "space.nvec: missing",
        ),
        (
            spaces_pb2.Space(multi_binary=spaces_pb2.MultiBinarySpace(shape=[2, 0])),
            "expected positive dimensions",
        ),
        (spaces_pb2.Space(multi_binary=spaces_pb2.MultiBinarySpace()), "positive dimensions"),
        (
            spaces_pb2.Space(
                dict=spaces_pb2.DictSpace(
                    entries=[
                        spaces_pb2.DictSpaceEntry(
                            key="a", space=encode_space(gym.spaces.Discrete(2))
                        ),
                        spaces_pb2.DictSpaceEntry(
                            key="a", space=encode_space(gym.spaces.Discrete(2))
                        ),
                    ]
                )
            ),
            "duplicate key 'a'",
        ),
        (
            spaces_pb2.Space(tuple=spaces_pb2.TupleSpace(spaces=[box(), spaces_pb2.Space()])),
            r"space\[1\]: the Space message sets no kind",
        ),
    ],
    ids=[
        "no-kind",
        "box-unspecified-dtype",
        "box-unknown-dtype",
        "box-shape",
        "box-bound-dtype",
        "box-low-above-high",
        "box-missing-bounds",
        "box-negative-dim",
        "discrete-n",
        "multidiscrete-float",
        "multidiscrete-start-shape",
        "multidiscrete-missing",
        "multibinary-zero",
        "multibinary-empty",
        "dict-duplicate",
        "tuple-nested",
    ],
)
def test_malformed_spaces_are_rejected(msg: spaces_pb2.Space, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        decode_space(msg)


def test_malformed_env_specs_are_rejected() -> None:
    discrete = encode_space(gym.spaces.Discrete(2))
    with pytest.raises(WireFormatError, match=r"EnvSpec\.observation_space: missing"):
        decode_env_spec(spaces_pb2.EnvSpec(action_space=discrete))
    with pytest.raises(WireFormatError, match=r"EnvSpec\.action_space: missing"):
        decode_env_spec(spaces_pb2.EnvSpec(observation_space=discrete))
    with pytest.raises(WireFormatError, match="max_episode_length must be a positive int"):
        decode_env_spec(
            spaces_pb2.EnvSpec(
                observation_space=discrete, action_space=discrete, max_episode_length=0
            )
        )
