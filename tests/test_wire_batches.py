"""The hand-written batch codec: protobuf compatibility, zero copy, errors.

Batches come from real CartPole rollouts and from a hypothesis strategy of
small random batches (random dtypes, shapes, bit patterns and nested info
dicts). The helpers here are shared with the chunk and envelope tests.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.core import EnvSpec, EpisodeBatch, StepType, TimeStepBatch
from rlfleet.errors import WireFormatError
from rlfleet.v1 import batch_pb2, tensor_pb2
from rlfleet.wire import decode_batch, encode_batch, encode_tensor
from rlfleet.wire._protowire import encode_varint, iter_fields, len_prefix
from rlfleet.wire._reference import batch_from_proto, batch_to_proto

EPISODE_FIELDS = (
    "observations",
    "last_observations",
    "actions",
    "rewards",
    "step_types",
    "lengths",
)
TIME_STEP_FIELDS = ("observations", "actions", "rewards", "next_observations", "step_types")
INFO_FIELDS = ("episode_infos", "env_infos", "agent_infos")
EPISODE_INFO_KEYS = ("agent_version", "env_seed", "policy_seed", "episode_index", "worker")


def cartpole_batch(num_episodes: int = 3, max_length: int = 25, seed: int = 0) -> EpisodeBatch:
    """Episodes of CartPole-v1 under a uniformly random policy."""
    env = gym.make("CartPole-v1")
    spec = EnvSpec.from_env(env, max_episode_length=max_length)
    rng = np.random.default_rng(seed)
    obs: list[np.ndarray] = []
    last_obs: list[np.ndarray] = []
    actions: list[int] = []
    rewards: list[float] = []
    step_types: list[StepType] = []
    lengths: list[int] = []
    for episode in range(num_episodes):
        observation, _ = env.reset(seed=seed + episode)
        for step in range(1, max_length + 1):
            action = int(rng.integers(2))
            obs.append(observation)
            actions.append(action)
            observation, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            step_types.append(StepType.get_step_type(step, max_length, terminated or truncated))
            if step_types[-1] in (StepType.TERMINAL, StepType.TIMEOUT):
                break
        last_obs.append(observation)
        lengths.append(step)
    total = sum(lengths)
    n = num_episodes
    return EpisodeBatch(
        env_spec=spec,
        episode_infos={
            key: np.arange(n, dtype=np.int64) + i for i, key in enumerate(EPISODE_INFO_KEYS)
        },
        observations=np.array(obs, np.float32),
        last_observations=np.array(last_obs, np.float32),
        actions=np.array(actions, np.int64),
        rewards=np.array(rewards, np.float32),
        env_infos={"diagnostics": {"step": np.arange(total), "ok": np.ones(total, bool)}},
        agent_infos={"log_prob": np.full(total, math.log(0.5), np.float32)},
        step_types=np.array(step_types, np.uint8),
        lengths=np.array(lengths, np.int64),
    )


def cartpole_time_steps(batch: EpisodeBatch) -> TimeStepBatch:
    """The transitions of an EpisodeBatch as a TimeStepBatch."""
    next_obs = np.concatenate([batch.observations[1:], batch.last_observations[-1:]])
    return TimeStepBatch(
        env_spec=batch.env_spec,
        episode_infos={"index": np.arange(batch.total_steps)},
        observations=batch.observations,
        actions=batch.actions,
        rewards=batch.rewards,
        next_observations=next_obs,
        env_infos={},
        agent_infos=batch.agent_infos,
        step_types=batch.step_types,
    )


# ------------------------------------------------------ random small batches

WIRE_DTYPES = ("?", "i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8")


@st.composite
def random_arrays(draw: st.DrawFn, rows: int, dtype: Any = None, shape: Any = None) -> np.ndarray:
    """(rows, *shape) arrays of random bits; some strided or big-endian."""
    dtype = np.dtype(dtype or draw(st.sampled_from(WIRE_DTYPES)))
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    count = rows * math.prod(shape)
    if dtype.kind == "b":
        array = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), bool)
    else:
        raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
        array = np.frombuffer(raw, dtype).copy()
    array = array.reshape((rows, *shape))
    layout = draw(st.sampled_from(["c", "c", "strided", "big-endian"]))
    if layout == "strided":
        array = np.repeat(array, 2, axis=0)[::2]
    elif layout == "big-endian" and dtype.itemsize > 1:
        array = array.astype(dtype.newbyteorder(">"))
    return array


@st.composite
def info_dicts(draw: st.DrawFn, rows: int, depth: int = 2) -> dict[str, Any]:
    keys = draw(st.lists(st.text(min_size=1, max_size=4), max_size=3, unique=True))
    result: dict[str, Any] = {}
    for key in keys:
        if depth and draw(st.booleans()):
            result[key] = draw(info_dicts(rows, depth - 1))
        else:
            result[key] = draw(random_arrays(rows))
    return result


@st.composite
def episode_batches(draw: st.DrawFn) -> EpisodeBatch:
    lengths = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    total, n = sum(lengths), len(lengths)
    obs_dtype = draw(st.sampled_from(["<f4", "<f8", "u1", "<i2"]))
    obs_shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    obs_space = gym.spaces.Box(0, 100, obs_shape, np.dtype(obs_dtype))
    action_space = draw(
        st.sampled_from([gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)])
    )
    if isinstance(action_space, gym.spaces.Discrete):
        actions = draw(random_arrays(total, "<i8", ()))
    else:
        actions = draw(random_arrays(total, "<f4", (2,)))
    spec = EnvSpec(obs_space, action_space, draw(st.one_of(st.none(), st.integers(1, 9))))
    return EpisodeBatch(
        env_spec=spec,
        episode_infos=draw(info_dicts(n)),
        observations=draw(random_arrays(total, obs_dtype, obs_shape)),
        last_observations=draw(random_arrays(n, obs_dtype, obs_shape)),
        actions=actions,
        rewards=draw(random_arrays(total, draw(st.sampled_from(["<f4", "<f8"])), ())),
        env_infos=draw(info_dicts(total)),
        agent_infos=draw(info_dicts(total)),
        step_types=np.array(
            draw(st.lists(st.integers(0, 3), min_size=total, max_size=total)), np.uint8
        ),
        lengths=np.array(lengths, np.int64),
    )


# ---------------------------------------------------------------- checks


def wire_bytes(array: np.ndarray) -> bytes:
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def assert_arrays_identical(got: np.ndarray, expected: np.ndarray, where: str) -> None:
    assert got.dtype == expected.dtype.newbyteorder("<"), where
    assert got.shape == expected.shape, where
    assert got.tobytes() == wire_bytes(expected), where


def assert_infos_identical(got: Mapping, expected: Mapping, where: str) -> None:
    assert list(got) == list(expected), where
    for key, value in expected.items():
        if isinstance(value, Mapping):
            assert_infos_identical(got[key], value, f"{where}[{key!r}]")
        else:
            assert_arrays_identical(got[key], value, f"{where}[{key!r}]")


def assert_batches_identical(got: Any, expected: Any) -> None:
    """Same type, spec, info keys (in order) and bit-identical arrays."""
    assert type(got) is type(expected)
    assert got.env_spec == expected.env_spec
    fields = EPISODE_FIELDS if isinstance(expected, EpisodeBatch) else TIME_STEP_FIELDS
    for name in fields:
        value = getattr(expected, name)
        if name == "step_types":
            value = value.astype(np.uint8)
        assert_arrays_identical(getattr(got, name), value, name)
    for name in INFO_FIELDS:
        assert_infos_identical(getattr(got, name), getattr(expected, name), name)


def shares_memory(array: np.ndarray, data: bytes | bytearray | memoryview) -> bool:
    return bool(np.shares_memory(array, np.frombuffer(data, np.uint8)))


# ------------------------------------------------------- compatibility


def test_a_cartpole_batch_round_trips_and_matches_protobuf_bytes() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch)
    assert data == batch_to_proto(batch).SerializeToString()
    decoded = decode_batch(data)
    assert_batches_identical(decoded, batch)
    assert_batches_identical(batch_from_proto(batch_pb2.EpisodeBatch.FromString(data)), batch)


def test_a_time_step_batch_round_trips_and_matches_protobuf_bytes() -> None:
    batch = cartpole_time_steps(cartpole_batch())
    data = encode_batch(batch, include_env_spec=False)
    assert data == batch_to_proto(batch, include_env_spec=False).SerializeToString()
    decoded = decode_batch(data, env_spec=batch.env_spec, kind=TimeStepBatch)
    assert_batches_identical(decoded, batch)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(episode_batches())
def test_random_batches_round_trip_bit_exactly_in_both_directions(batch: EpisodeBatch) -> None:
    data = encode_batch(batch)
    reference = batch_to_proto(batch).SerializeToString()
    assert data == reference
    assert_batches_identical(decode_batch(reference), batch)
    assert_batches_identical(batch_from_proto(batch_pb2.EpisodeBatch.FromString(data)), batch)


def shuffled_fields(data: bytes, seed: int) -> bytes:
    """The same message with its top-level fields in another order."""
    records = []
    start = 0
    for *_, end in iter_fields(data, 0, len(data), "test"):
        records.append(data[start:end])
        start = end
    random.Random(seed).shuffle(records)
    return b"".join(records)


@pytest.mark.parametrize("seed", range(5))
def test_fields_in_any_order_and_unknown_fields_decode_the_same(seed: int) -> None:
    batch = cartpole_batch(seed=seed)
    data = shuffled_fields(encode_batch(batch), seed)
    unknown = (
        b"\x58\x05"  # field 11 varint
        + b"\xfa\x01\x03abc"  # field 31 bytes
        + b"\x65\x00\x00\x00\x00"  # field 12 fixed32
        + b"\x6b\x08\x01\x6c"  # group 13
    )
    assert_batches_identical(decode_batch(unknown + data + unknown), batch)


def test_unpacked_shapes_decode_the_same() -> None:
    batch = cartpole_batch()
    msg = batch_to_proto(batch, include_env_spec=False)
    # observations rewritten with one varint record per dimension
    obs = msg.observations
    tensor = b"\x08" + encode_varint(obs.dtype)
    tensor += b"".join(b"\x10" + encode_varint(dim) for dim in obs.shape)
    tensor += b"\x1a" + encode_varint(len(obs.data)) + obs.data
    msg.ClearField("observations")
    data = msg.SerializeToString() + len_prefix(3, len(tensor)) + tensor
    decoded = decode_batch(data, env_spec=batch.env_spec)
    assert_batches_identical(decoded, batch)


# ---------------------------------------------------------- zero copy


def test_decoding_views_the_input_without_copying() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch)
    decoded = decode_batch(data)
    for name in EPISODE_FIELDS:
        array = getattr(decoded, name)
        assert shares_memory(array, data), name
        assert not array.flags.writeable, name
    assert shares_memory(decoded.agent_infos["log_prob"], data)
    assert shares_memory(decoded.env_infos["diagnostics"]["step"], data)


@pytest.mark.parametrize("wrap", [bytearray, memoryview, lambda data: memoryview(bytearray(data))])
def test_decoding_a_mutable_buffer_gives_read_only_views_of_it(wrap: Any) -> None:
    batch = cartpole_batch()
    buffer = wrap(encode_batch(batch))
    decoded = decode_batch(buffer)
    assert_batches_identical(decoded, batch)
    assert shares_memory(decoded.observations, buffer)
    with pytest.raises(ValueError, match="read-only"):
        decoded.observations[0, 0] = 1.0


def test_encoding_copies_the_data_exactly_once() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch)
    assert isinstance(data, bytes)
    assert not shares_memory(batch.observations, data)


# ----------------------------------------------------- env spec handling


def test_the_env_spec_argument_wins_over_the_message() -> None:
    batch = cartpole_batch()
    other = EnvSpec(batch.env_spec.observation_space, batch.env_spec.action_space, 500)
    decoded = decode_batch(encode_batch(batch), env_spec=other)
    assert decoded.env_spec is other


def test_a_message_without_env_spec_needs_the_argument() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch, include_env_spec=False)
    assert decode_batch(data, env_spec=batch.env_spec).env_spec == batch.env_spec
    with pytest.raises(WireFormatError, match="carries no env_spec and none was given"):
        decode_batch(data)


def test_a_malformed_embedded_env_spec_is_reported() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch, include_env_spec=False)
    with pytest.raises(WireFormatError, match=r"EpisodeBatch\.env_spec: malformed EnvSpec"):
        decode_batch(b"\x0a\x02\x0a\x05" + data)
    with pytest.raises(WireFormatError, match=r"EnvSpec\.observation_space: missing"):
        decode_batch(b"\x0a\x00" + data)


# -------------------------------------------------------------- dtypes


def test_step_types_and_lengths_travel_as_uint8_and_int64() -> None:
    batch = cartpole_batch()
    wide = EpisodeBatch(
        **{
            **{name: getattr(batch, name) for name in (*EPISODE_FIELDS, *INFO_FIELDS)},
            "env_spec": batch.env_spec,
            "step_types": batch.step_types.astype(np.int64),
            "lengths": batch.lengths.astype(np.int32),
        }
    )
    data = encode_batch(wide)
    assert data == encode_batch(batch)
    decoded = decode_batch(data)
    assert isinstance(decoded, EpisodeBatch)
    assert decoded.step_types.dtype == np.uint8
    assert decoded.lengths.dtype == np.int64


def replace_tensor(data: bytes, number: int, tensor: tensor_pb2.Tensor) -> bytes:
    """The message with top-level field ``number`` replaced by ``tensor``."""
    out = []
    start = 0
    for field, _, _, end in iter_fields(data, 0, len(data), "test"):
        if field != number:
            out.append(data[start:end])
        start = end
    body = tensor.SerializeToString()
    return b"".join(out) + len_prefix(number, len(body)) + body


def test_step_types_of_another_dtype_are_rejected() -> None:
    batch = cartpole_batch()
    data = replace_tensor(encode_batch(batch), 9, encode_tensor(batch.step_types.astype(np.int64)))
    with pytest.raises(WireFormatError, match="step_types: expected a uint8 tensor, got int64"):
        decode_batch(data)


def test_lengths_of_another_dtype_are_rejected() -> None:
    batch = cartpole_batch()
    data = replace_tensor(encode_batch(batch), 10, encode_tensor(batch.lengths.astype(np.uint32)))
    with pytest.raises(WireFormatError, match="lengths: expected a int64 tensor, got uint32"):
        decode_batch(data)


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("number", "name"), [(3, "observations"), (4, "last_observations"), (10, "lengths")]
)
def test_a_missing_tensor_is_named(number: int, name: str) -> None:
    data = encode_batch(cartpole_batch())
    kept = b"".join(
        data[start:end] for (field, *_), start, end in _records(data) if field != number
    )
    with pytest.raises(WireFormatError, match=f"EpisodeBatch.{name}: missing"):
        decode_batch(kept)


def _records(data: bytes) -> list[tuple[tuple[int, int, int, int], int, int]]:
    records = []
    start = 0
    for record in iter_fields(data, 0, len(data), "test"):
        records.append((record, start, record[3]))
        start = record[3]
    return records


def test_a_field_sent_twice_is_rejected_not_merged() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch, include_env_spec=False)
    obs = batch_to_proto(batch).observations.SerializeToString()
    with pytest.raises(WireFormatError, match="observations occurs more than once"):
        decode_batch(data + len_prefix(3, len(obs)) + obs, env_spec=batch.env_spec)
    with pytest.raises(WireFormatError, match="env_infos occurs more than once"):
        decode_batch(data + b"\x3a\x00", env_spec=batch.env_spec)


def test_a_known_field_with_the_wrong_wire_type_is_rejected() -> None:
    batch = cartpole_batch()
    data = encode_batch(batch, include_env_spec=False)
    with pytest.raises(WireFormatError, match=r"EpisodeBatch\.rewards: expected a message field"):
        decode_batch(b"\x30\x01" + data, env_spec=batch.env_spec)


def test_an_inconsistent_batch_is_reported_with_the_core_message() -> None:
    batch = cartpole_batch()
    data = replace_tensor(encode_batch(batch), 10, encode_tensor(batch.lengths + 1))
    with pytest.raises(WireFormatError, match=r"decoded EpisodeBatch is inconsistent: .*lengths"):
        decode_batch(data)


def test_decoding_as_the_wrong_kind_fails_cleanly() -> None:
    data = encode_batch(cartpole_batch())
    with pytest.raises(WireFormatError, match="TimeStepBatch"):
        decode_batch(data, kind=TimeStepBatch)
    with pytest.raises(TypeError, match="expected EpisodeBatch or TimeStepBatch, got dict"):
        decode_batch(data, kind=dict)


def test_every_truncation_raises_wire_format_error() -> None:
    batch = cartpole_batch(num_episodes=1, max_length=4)
    data = encode_batch(batch)
    decode_batch(data)
    for cut in range(len(data)):
        with pytest.raises(WireFormatError):
            decode_batch(data[:cut])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_corrupted_bytes_raise_only_wire_format_errors(data: st.DataObject) -> None:
    payload = bytearray(ENCODED_SMALL)
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireFormatError):
        decode_batch(bytes(payload))


ENCODED_SMALL = encode_batch(cartpole_batch(num_episodes=2, max_length=3))


def test_an_undecodable_dtype_in_a_batch_is_refused_on_encode() -> None:
    batch = cartpole_batch()
    bad = EpisodeBatch(
        **{
            **{name: getattr(batch, name) for name in (*EPISODE_FIELDS, *INFO_FIELDS)},
            "env_spec": batch.env_spec,
            "agent_infos": {"note": np.zeros(batch.total_steps, np.complex64)},
        }
    )
    with pytest.raises(
        WireFormatError, match=r"EpisodeBatch.agent_infos\['note'\]: dtype complex64"
    ):
        encode_batch(bad)
