"""Envelopes carrying a chunk: byte compatibility with protobuf both ways."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import WireFormatError
from rlfleet.v1 import batch_pb2, learner_pb2, worker_pb2
from rlfleet.wire import (
    Chunk,
    decode_batch_chunks,
    encode_batch_chunks,
    parse_with_chunk,
    serialize_with_chunk,
)
from rlfleet.wire._protowire import iter_fields, len_prefix
from tests.test_wire_batches import assert_batches_identical, cartpole_batch, shares_memory

PATH = ("result", "chunk")
CHUNK = Chunk(7, 1, 3, 5000, batch_pb2.PAYLOAD_KIND_EPISODE_BATCH, b"payload bytes")


def result(**fields: object) -> worker_pb2.EpisodeResult:
    base: dict[str, object] = {
        "task_id": 3,
        "episode_indices": [4, 5],
        "lengths": [10, 200],
        "agent_version": -2,
        "env_generation": 1,
    }
    return worker_pb2.EpisodeResult(**{**base, **fields})  # type: ignore[arg-type]


def with_chunk(envelope: worker_pb2.WorkerMessage, chunk: Chunk) -> worker_pb2.WorkerMessage:
    """What the envelope looks like with the chunk set through protobuf."""
    expected = worker_pb2.WorkerMessage()
    expected.CopyFrom(envelope)
    expected.result.chunk.CopyFrom(chunk.to_proto())
    return expected


# ------------------------------------------------------------- serialize


def test_serialized_bytes_are_exactly_protobufs() -> None:
    envelope = worker_pb2.WorkerMessage(result=result())
    data = serialize_with_chunk(envelope, PATH, CHUNK)
    # The chunk is the last field at every level, so protobuf writes the same.
    assert data == with_chunk(envelope, CHUNK).SerializeToString()


def test_the_envelope_is_left_untouched() -> None:
    envelope = worker_pb2.WorkerMessage(result=result())
    before = envelope.SerializeToString()
    serialize_with_chunk(envelope, PATH, CHUNK)
    assert envelope.SerializeToString() == before
    assert not envelope.result.HasField("chunk")


def test_an_unset_parent_is_created() -> None:
    data = serialize_with_chunk(worker_pb2.WorkerMessage(), PATH, CHUNK)
    parsed = worker_pb2.WorkerMessage.FromString(data)
    assert parsed.WhichOneof("body") == "result"
    assert Chunk.from_proto(parsed.result.chunk) == CHUNK


def test_sample_responses_carry_chunks_too() -> None:
    envelope = learner_pb2.SampleResponse(result=result(worker_id=9))
    data = serialize_with_chunk(envelope, PATH, CHUNK)
    expected = learner_pb2.SampleResponse()
    expected.CopyFrom(envelope)
    expected.result.chunk.CopyFrom(CHUNK.to_proto())
    assert learner_pb2.SampleResponse.FromString(data) == expected
    message, chunk = parse_with_chunk(learner_pb2.SampleResponse, data, PATH)
    assert message == envelope
    assert chunk == CHUNK


def test_a_bare_batch_chunk_parses_with_an_empty_path() -> None:
    message, chunk = parse_with_chunk(batch_pb2.BatchChunk, CHUNK.to_bytes(), ())
    assert chunk == CHUNK
    assert message == batch_pb2.BatchChunk(
        batch_id=7, index=1, count=3, total_bytes=5000, kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH
    )
    with pytest.raises(WireFormatError, match="needs a non-empty path"):
        serialize_with_chunk(batch_pb2.BatchChunk(), (), CHUNK)


def test_long_payloads_get_multi_byte_lengths_at_every_level() -> None:
    chunk = Chunk(1, 0, 1, 300_000, 1, bytes(range(256)) * 1171 + b"1234")
    envelope = worker_pb2.WorkerMessage(result=result())
    data = serialize_with_chunk(envelope, PATH, chunk)
    assert data == with_chunk(envelope, chunk).SerializeToString()


@pytest.mark.parametrize(
    ("envelope", "path", "message"),
    [
        (
            worker_pb2.WorkerMessage(result=result(chunk=CHUNK.to_proto())),
            PATH,
            "WorkerMessage.result.chunk is already set",
        ),
        (
            worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat(steps_total=5)),
            PATH,
            "WorkerMessage.body already holds 'heartbeat'; cannot also set 'result'",
        ),
        (worker_pb2.WorkerMessage(), ("result", "nothing"), "has no singular message field"),
        (worker_pb2.WorkerMessage(), ("result", "task_id"), "has no singular message field"),
        (worker_pb2.WorkerMessage(), ("result",), "leads to rlfleet.v1.EpisodeResult, not"),
        (worker_pb2.WorkerMessage(), (), "leads to rlfleet.v1.WorkerMessage"),
    ],
    ids=["already-set", "oneof", "unknown-field", "scalar-field", "short-path", "empty-path"],
)
def test_bad_envelopes_and_paths_are_refused(
    envelope: worker_pb2.WorkerMessage, path: tuple[str, ...], message: str
) -> None:
    with pytest.raises(WireFormatError, match=message):
        serialize_with_chunk(envelope, path, CHUNK)


def test_a_repeated_field_cannot_be_on_the_path() -> None:
    with pytest.raises(
        WireFormatError, match="FleetStatus has no singular message field 'workers'"
    ):
        parse_with_chunk(learner_pb2.FleetStatus, b"", ("workers",))


# ----------------------------------------------------------------- parse


def test_parsing_protobufs_bytes_takes_the_chunk_without_a_copy() -> None:
    envelope = worker_pb2.WorkerMessage(result=result())
    data = with_chunk(envelope, CHUNK).SerializeToString()
    message, chunk = parse_with_chunk(worker_pb2.WorkerMessage, data, PATH)
    assert message == envelope  # the chunk field is cleared
    assert not message.result.HasField("chunk")
    assert chunk == CHUNK
    assert chunk is not None
    assert isinstance(chunk.data, memoryview)
    assert chunk.data.readonly
    assert shares_memory(np.frombuffer(chunk.data, np.uint8), data)


@pytest.mark.parametrize(
    "envelope",
    [
        worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat(steps_total=5)),
        worker_pb2.WorkerMessage(result=result()),
        worker_pb2.WorkerMessage(),
    ],
    ids=["heartbeat", "result-without-chunk", "empty"],
)
def test_envelopes_without_a_chunk_parse_normally(envelope: worker_pb2.WorkerMessage) -> None:
    message, chunk = parse_with_chunk(worker_pb2.WorkerMessage, envelope.SerializeToString(), PATH)
    assert message == envelope
    assert chunk is None


def test_a_chunk_with_empty_data_is_still_a_chunk() -> None:
    empty = Chunk(1, 0, 1, 0, 1, b"")
    data = serialize_with_chunk(worker_pb2.WorkerMessage(result=result()), PATH, empty)
    _, chunk = parse_with_chunk(worker_pb2.WorkerMessage, data, PATH)
    assert chunk == empty


def reversed_fields(data: bytes) -> bytes:
    records = []
    start = 0
    for *_, end in iter_fields(data, 0, len(data), "test"):
        records.append(data[start:end])
        start = end
    return b"".join(reversed(records))


def test_any_field_order_and_unknown_fields_parse_the_same() -> None:
    # The chunk's fields reversed, plus unknown fields at each level.
    chunk_body = reversed_fields(CHUNK.to_bytes()) + b"\x78\x01"
    envelope = result()
    result_body = (
        len_prefix(7, len(chunk_body))
        + chunk_body
        + b"\xa2\x06\x01z"
        + envelope.SerializeToString()
    )
    data = b"\x50\x09" + len_prefix(4, len(result_body)) + result_body
    message, chunk = parse_with_chunk(worker_pb2.WorkerMessage, data, PATH)
    assert chunk == CHUNK
    assert message.result.task_id == 3
    assert list(message.result.lengths) == [10, 200]
    assert not message.result.HasField("chunk")
    # protobuf agrees on every known field
    expected = worker_pb2.WorkerMessage.FromString(data)
    assert Chunk.from_proto(expected.result.chunk) == CHUNK
    expected.result.ClearField("chunk")
    assert message == expected


def test_a_later_oneof_member_replaces_the_chunk_as_in_protobuf() -> None:
    data = serialize_with_chunk(worker_pb2.WorkerMessage(result=result()), PATH, CHUNK)
    data += worker_pb2.WorkerMessage(
        heartbeat=worker_pb2.Heartbeat(steps_total=1)
    ).SerializeToString()
    message, chunk = parse_with_chunk(worker_pb2.WorkerMessage, data, PATH)
    assert message == worker_pb2.WorkerMessage.FromString(data)
    assert message.WhichOneof("body") == "heartbeat"
    assert chunk is None


def test_a_repeated_chunk_field_is_rejected_not_merged() -> None:
    data = serialize_with_chunk(worker_pb2.WorkerMessage(result=result()), PATH, CHUNK)
    with pytest.raises(WireFormatError, match=r"WorkerMessage.result occurs more than once"):
        parse_with_chunk(worker_pb2.WorkerMessage, data + data, PATH)
    chunk_field = len_prefix(7, len(CHUNK.to_bytes())) + CHUNK.to_bytes()
    body = result().SerializeToString() + chunk_field + chunk_field
    with pytest.raises(WireFormatError, match=r"WorkerMessage.result.chunk occurs more than once"):
        parse_with_chunk(worker_pb2.WorkerMessage, len_prefix(4, len(body)) + body, PATH)
    twice = CHUNK.to_bytes() + b"\x32\x01x"
    with pytest.raises(WireFormatError, match=r"BatchChunk.data occurs more than once"):
        parse_with_chunk(batch_pb2.BatchChunk, twice, ())


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x20\x01", "WorkerMessage.result: expected a length-delimited field, got varint"),
        (b"\x22\x05\x3a", "runs past the end"),
        (b"\x22\x02\x3a\x05", "runs past the end"),
        (b"\x22\x06\x3a\x04\x10\x05\x18\x02", "chunk 5 of batch 0: index must be in 0..1"),
        (b"\x22\x02\x3a\x00", r"count must be in 1..2\*\*32-1"),
        (b"\x22\x03\x3a\x01\x18", "result.chunk: truncated varint"),
        (b"\x22\x03\x12\x01\x80", "WorkerMessage .chunk path result.chunk.: malformed message"),
    ],
    ids=[
        "wire-type",
        "truncated-result",
        "truncated-chunk",
        "bad-index",
        "no-count",
        "bad-header",
        "bad-packed",
    ],
)
def test_malformed_envelopes_raise_wire_format_errors(data: bytes, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        parse_with_chunk(worker_pb2.WorkerMessage, data, PATH)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupted_envelopes_raise_only_wire_format_errors(data: st.DataObject) -> None:
    message = bytearray(ENCODED_ENVELOPE)
    for _ in range(data.draw(st.integers(1, 3))):
        message[data.draw(st.integers(0, len(message) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(WireFormatError):
        parse_with_chunk(worker_pb2.WorkerMessage, bytes(message), PATH)


ENCODED_ENVELOPE = serialize_with_chunk(worker_pb2.WorkerMessage(result=result()), PATH, CHUNK)


def test_every_truncation_raises_wire_format_error() -> None:
    data = serialize_with_chunk(worker_pb2.WorkerMessage(result=result()), PATH, CHUNK)
    for cut in range(1, len(data)):
        try:
            parse_with_chunk(worker_pb2.WorkerMessage, data[:cut], PATH)
        except WireFormatError:
            continue
        # A cut at a field boundary of the outer message is itself valid.
        worker_pb2.WorkerMessage.FromString(data[:cut])


# ------------------------------------------------------------ end to end


def test_a_batch_travels_in_worker_messages_and_back() -> None:
    batch = cartpole_batch(num_episodes=4)
    chunks = encode_batch_chunks(batch, 500, batch_id=11, include_env_spec=False)
    messages = [
        serialize_with_chunk(
            worker_pb2.WorkerMessage(result=result() if chunk.index == 0 else None), PATH, chunk
        )
        for chunk in chunks
    ]
    received = [parse_with_chunk(worker_pb2.WorkerMessage, data, PATH) for data in messages]
    assert received[0][0].result.task_id == 3
    assert all(message.result.task_id == 0 for message, _ in received[1:])
    parsed = [chunk for _, chunk in received if chunk is not None]
    assert_batches_identical(decode_batch_chunks(parsed, env_spec=batch.env_spec), batch)


@st.composite
def chunks(draw: st.DrawFn) -> Chunk:
    """Chunks with every header field anywhere in its protobuf range."""
    count = draw(st.integers(1, 2**32 - 1))
    data = draw(st.binary(max_size=300))
    return Chunk(
        batch_id=draw(st.integers(0, 2**64 - 1)),
        index=draw(st.integers(0, count - 1)),
        count=count,
        total_bytes=len(data) + draw(st.integers(0, 2**40)),
        kind=draw(st.integers(-(2**31), 2**31 - 1)),
        data=data,
    )


envelopes = st.builds(
    lambda task_id, indices: worker_pb2.WorkerMessage(
        result=worker_pb2.EpisodeResult(task_id=task_id, episode_indices=indices)
    ),
    st.integers(0, 2**64 - 1),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
)


@settings(max_examples=100, deadline=None)
@given(envelopes, chunks())
def test_random_envelopes_match_protobuf_both_ways(
    envelope: worker_pb2.WorkerMessage, chunk: Chunk
) -> None:
    expected = with_chunk(envelope, chunk)
    ours = serialize_with_chunk(envelope, PATH, chunk)
    assert ours == expected.SerializeToString()
    message, parsed = parse_with_chunk(worker_pb2.WorkerMessage, expected.SerializeToString(), PATH)
    assert message == envelope
    assert parsed == chunk
