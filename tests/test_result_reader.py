"""The compiled result reader agrees with protobuf on any message, honest or spoiled.

``read_result_message`` and ``read_result_frame`` read a result in one call
into ``rlfleet.wire._result_reader`` (C). Here protobuf writes random
results (columns with huge and negative values, random chunk fields, values
at every varint length up to 10 bytes), and the reader must read each one
protobuf writes in range the way protobuf reads it, and leave the others to
the general path (None). Random byte flips, insertions, deletions and
truncations of those messages never crash it: it reads the same as protobuf
or returns None.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlfleet.errors import WireFormatError
from rlfleet.v1 import batch_pb2, learner_pb2, worker_pb2
from rlfleet.wire.result_message import read_result_frame, read_result_message
from tests.test_result_message import assert_frame_same_or_left, assert_same_or_left

UINT64 = st.integers(0, (1 << 64) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
UINT32 = st.integers(0, (1 << 32) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)


def _small_or(strategy: st.SearchStrategy[int]) -> st.SearchStrategy[int]:
    """Mostly values of one or two bytes (a result's own), sometimes any."""
    return st.one_of(st.integers(0, 300), strategy)


#: A column: short or past the 48 bytes the Python walk once left to protobuf,
#: values small, large, huge or negative.
COLUMN = st.lists(st.one_of(st.integers(0, 127), st.integers(0, 20_000), INT64), max_size=120)


@st.composite
def results(draw: st.DrawFn) -> worker_pb2.EpisodeResult:
    """An EpisodeResult as protobuf writes it, with or without its chunk."""
    result = worker_pb2.EpisodeResult(
        task_id=draw(_small_or(UINT64)),
        episode_indices=draw(COLUMN),
        lengths=draw(COLUMN),
        agent_version=draw(st.one_of(st.integers(-2, 300), INT64)),
        env_generation=draw(_small_or(UINT64)),
        worker_id=draw(_small_or(UINT64)),
    )
    if draw(st.integers(0, 9)):  # now and then a result without a chunk
        data = draw(st.binary(max_size=40))
        result.chunk.CopyFrom(
            batch_pb2.BatchChunk(
                batch_id=draw(_small_or(UINT64)),
                index=draw(st.one_of(st.integers(0, 3), UINT32)),
                count=draw(st.one_of(st.integers(0, 4), UINT32)),
                total_bytes=draw(st.one_of(st.just(len(data)), _small_or(UINT64))),
                kind=draw(st.one_of(st.integers(0, 3), INT32)),  # type: ignore[arg-type]
                data=data,
            )
        )
    return result


def in_range(result: worker_pb2.EpisodeResult) -> bool:
    """Whether the reader must read ``result`` itself (not leave it): its columns
    not negative, a chunk that says something, in its fields' ranges."""
    chunk = result.chunk
    return (
        result.HasField("chunk")
        and chunk.ByteSize() > 0
        and min((*result.episode_indices, *result.lengths), default=0) >= 0
        and chunk.kind >= 0
        and chunk.index < chunk.count
        and len(chunk.data) <= chunk.total_bytes
    )


@settings(max_examples=400, deadline=None)
@given(results())
@example(worker_pb2.EpisodeResult(agent_version=-1, chunk=batch_pb2.BatchChunk(count=1)))
@example(
    worker_pb2.EpisodeResult(
        task_id=(1 << 64) - 1,
        episode_indices=[(1 << 63) - 1, 0, 127, 128, 16_383, 16_384],
        chunk=batch_pb2.BatchChunk(
            batch_id=(1 << 64) - 1,
            index=(1 << 32) - 2,
            count=(1 << 32) - 1,
            kind=(1 << 31) - 1,  # type: ignore[arg-type]
        ),
    )
)
def test_a_result_protobuf_writes_is_read_as_protobuf_reads_it(
    result: worker_pb2.EpisodeResult,
) -> None:
    message = worker_pb2.WorkerMessage(result=result).SerializeToString()
    read = assert_same_or_left(message)
    assert read == in_range(result)
    assert assert_same_or_left(memoryview(bytearray(message))) == read


@settings(max_examples=300, deadline=None)
@given(results(), _small_or(UINT64))
def test_a_frame_protobuf_writes_is_read_as_protobuf_reads_it(
    result: worker_pb2.EpisodeResult, call: int
) -> None:
    frame = learner_pb2.SampleResponse(result=result, result_call=call).SerializeToString()
    assert assert_frame_same_or_left(bytearray(frame)) == (in_range(result) and call > 0)


#: How a message is spoiled: (what, where, byte) applied in turn.
SPOILS = st.lists(
    st.tuples(
        st.sampled_from(("flip", "insert", "delete", "truncate")),
        st.integers(0, 1 << 16),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=4,
)


def spoiled(data: bytes, spoils: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for what, where, byte in spoils:
        at = where % (len(out) + 1)
        if what == "flip" and at < len(out):
            out[at] = byte
        elif what == "insert":
            out[at:at] = bytes([byte])
        elif what == "delete":
            del out[at : at + 1 + byte % 3]
        else:
            del out[at:]
    return bytes(out)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results(), SPOILS)
def test_a_spoiled_result_reads_as_protobuf_reads_it_or_is_left(
    result: worker_pb2.EpisodeResult, spoils: list[tuple[str, int, int]]
) -> None:
    message = spoiled(worker_pb2.WorkerMessage(result=result).SerializeToString(), spoils)
    read = assert_same_or_left(message)
    # A view into a larger receive buffer reads the same.
    buffer = bytearray(b"\xff" * 3 + message + b"\x00" * 2)
    assert assert_same_or_left(memoryview(buffer)[3 : 3 + len(message)]) == read


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results(), _small_or(UINT64), SPOILS)
def test_a_spoiled_frame_reads_as_protobuf_reads_it_or_is_left(
    result: worker_pb2.EpisodeResult, call: int, spoils: list[tuple[str, int, int]]
) -> None:
    frame = learner_pb2.SampleResponse(result=result, result_call=call).SerializeToString()
    assert_frame_same_or_left(bytearray(spoiled(frame, spoils)))


def _message(fields: bytes) -> bytes:
    """A WorkerMessage whose result holds ``fields`` and a chunk of one byte."""
    body = fields + b"\x3a\x07\x18\x01\x20\x01\x32\x01x"
    return bytes([0x22, len(body)]) + body


@pytest.mark.parametrize(
    "fields",
    [
        b"\x08" + b"\xff" * 9 + b"\x02",  # task_id past 64 bits (10 bytes)
        b"\x08" + b"\xff" * 10 + b"\x01",  # an 11-byte varint
        b"\x08" + b"\x81\x80\x00",  # not the shortest form
        b"\x12\x0a" + b"\x80" * 9 + b"\x01",  # a column value of 2**63 (negative)
        b"\x12\x02\x80\x80",  # a truncated column value
        b"\x12\x0b" + b"\xff" * 10 + b"\x01",  # a column value of 11 bytes
        b"\x08\xff",  # a scalar running into the chunk's key
        b"\x12\x02\x01",  # a column running past the result's end
    ],
)
def test_values_out_of_protobufs_own_form_are_left(fields: bytes) -> None:
    data = _message(fields)
    assert read_result_message(data) is None
    assert not assert_same_or_left(data)


def test_the_largest_values_are_read() -> None:
    largest = b"\xff" * 9 + b"\x01"  # 2**64 - 1
    read = read_result_message(_message(b"\x08" + largest + b"\x20" + largest))
    assert read is not None
    assert read[0].task_id == (1 << 64) - 1 and read[0].agent_version == -1


def test_a_buffer_that_is_not_contiguous_is_refused() -> None:
    data = _message(b"\x08\x01") * 2
    with pytest.raises(WireFormatError, match="contiguous"):
        read_result_message(memoryview(data)[::2])
    with pytest.raises(WireFormatError, match="expected bytes"):
        read_result_message("text")  # type: ignore[arg-type]


def test_a_chunk_running_past_the_results_end_is_left() -> None:
    # The chunk says 10 bytes and its data 4: they run over the result's end
    # into the frame's result_call, exactly to the frame's end.
    frame = b"\x12\x09" + b"\x3a\x0a\x18\x01\x20\x09\x32\x04x" + b"\xc8\x02\x01"
    assert read_result_frame(memoryview(frame)) is None
    assert not assert_frame_same_or_left(frame)
