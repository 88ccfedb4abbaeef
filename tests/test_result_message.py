"""A result message read by hand means what protobuf reads from it, or is left to protobuf.

``read_result_message`` reads a worker's result (header and chunk) in one
walk when it is written as protobuf writes it; for anything else it returns
None and the coordinator's general path (``parse_with_chunk``, protobuf)
reads the message or refuses it with its own text. ``read_result_frame``
reads the same result passed on to a learner's results connection. Here
every message and frame, as rlfleet writes them and spoiled in many ways,
reads the same both ways, or is left to the general path.
"""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Callable
from types import FrameType, NotImplementedType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlfleet.client._learner_messages import ResultsEnd, parse_result_frame
from rlfleet.coordinator import worker_messages
from rlfleet.coordinator.calls import Forward
from rlfleet.coordinator.learner_messages import forwarded_parts, result_call_field
from rlfleet.coordinator.worker_messages import (
    ResultPiece,
    parse_worker_message,
    parse_worker_message_by_protobuf,
)
from rlfleet.envs import EnvConfig
from rlfleet.errors import WireFormatError
from rlfleet.protocol.learner_calls import ResultPart
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import batch_pb2, learner_pb2, worker_pb2
from rlfleet.wire import _result_reader, parse_with_chunk
from rlfleet.wire.chunks import Chunk
from rlfleet.wire.result_message import (
    _parts,
    read_frame_made,
    read_result_frame,
    read_result_frame_pieces,
    read_result_message,
)
from rlfleet.wire.results import ResultHeader
from rlfleet.worker.units import make_units
from rlfleet.worker.vec import VecWorker
from tests._coordinator_fakes import result_messages


@pytest.fixture(scope="module")
def messages() -> list[bytes]:
    """Result messages as a worker writes them: 1, 4 and 80 episodes, in one or
    several chunks, from a worker that sets its id and with a negative version."""
    vec = VecWorker(n_envs=4, env=EnvConfig("CartPole-v1"), worker_number=3)
    try:
        out: list[bytes] = []
        for batch_id, (episodes, max_bytes) in enumerate(
            [(1, 1 << 20), (4, 1 << 20), (4, 600), (80, 1 << 20), (80, 20_000)], start=1
        ):
            batch = vec.run(make_units(7, 0, range(1000, 1000 + episodes)))
            out += [
                _rpc.serialize(m)
                for m in result_messages(
                    batch, task_id=9, env_generation=2, batch_id=batch_id, max_bytes=max_bytes
                )
            ]
        message = worker_pb2.WorkerMessage.FromString(out[0])
        message.result.worker_id = 12
        message.result.agent_version = -1
        out.append(message.SerializeToString())
        return out
    finally:
        vec.shutdown()


def general(data: bytes | bytearray | memoryview) -> object:
    """What the general path (protobuf's parser) reads."""
    try:
        return parse_worker_message_by_protobuf(data)
    except WireFormatError as exc:
        return exc


def general_piece(data: bytes) -> ResultPiece:
    read = general(data)
    assert isinstance(read, ResultPiece)
    return read


def assert_same_or_left(data: bytes | bytearray | memoryview) -> bool:
    read = read_result_message(data)
    expected = general(data)
    if read is None:
        return False
    assert isinstance(expected, ResultPiece), f"the general path reads: {expected!r}"
    header, chunk = read
    assert header == expected.header
    assert chunk == expected.chunk
    assert expected.chunk is not None
    assert bytes(chunk.data) == bytes(expected.chunk.data)
    return True


def test_a_workers_result_messages_are_read_by_hand_as_protobuf_reads_them(
    messages: list[bytes],
) -> None:
    for data in messages:
        assert assert_same_or_left(data), "an honest result takes the hand-read path"
        piece = parse_worker_message(data)
        assert isinstance(piece, ResultPiece)
        assert piece.header.wire == general_piece(data).header.wire


def test_a_result_in_a_receive_buffers_view_is_read_by_hand(
    messages: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lease data connection hands a large frame over as a view of the
    # buffer it was received into, not as bytes: it is read in the same walk.
    expected = [general_piece(data) for data in messages]
    monkeypatch.setattr(worker_messages, "parse_with_chunk", _no_protobuf)
    for data, general_read in zip(messages, expected, strict=True):
        buffer = bytearray(data)
        piece = parse_worker_message(memoryview(buffer))
        assert isinstance(piece, ResultPiece) and piece.chunk is not None
        assert piece.header == general_read.header
        assert piece.chunk == general_read.chunk
        assert isinstance(piece.chunk.data, memoryview) and piece.chunk.data.readonly
        assert bytes(piece.chunk.data) == bytes(general_read.chunk.data)
        buffer[-1] ^= 0xFF  # the chunk's data is a view of the frame, not a copy
        assert piece.chunk.data[-1] == buffer[-1]


def _no_protobuf(*args: object) -> None:
    raise AssertionError("an honest result message took protobuf's parser")


def test_the_hand_read_headers_columns_are_the_workers(messages: list[bytes]) -> None:
    long = next(
        m for m in messages if len(worker_pb2.WorkerMessage.FromString(m).result.lengths) == 80
    )
    read = read_result_message(long)
    assert read is not None
    meta = worker_pb2.WorkerMessage.FromString(long).result
    assert read[0].episode_indices == tuple(meta.episode_indices) == tuple(range(1000, 1080))
    assert read[0].lengths == tuple(meta.lengths)
    assert all(type(v) is int for v in read[0].lengths)


def encodings(message: worker_pb2.WorkerMessage) -> list[bytes]:
    """The same result written in forms protobuf reads but does not write."""
    result = message.result
    out = []
    # Unpacked columns, fields out of order, an unknown field, a zero written out.
    unpacked = b"".join(b"\x10" + _rpc_varint(v) for v in result.episode_indices)
    body = result.SerializeToString()
    out.append(_result_field(unpacked + body))
    out.append(_result_field(body + b"\x08\x05"))  # task_id again, after the chunk
    out.append(_result_field(body + b"\xa0\x06\x01"))  # unknown field 100
    out.append(_result_field(b"\x08\x00" + body))  # task_id 0 written out
    out.append(_result_field(b"\x28\x82\x00" + body))  # a varint longer than it needs
    out.append(message.SerializeToString() + b"\x2a\x00")  # another member of the oneof
    return out


def _rpc_varint(value: int) -> bytes:
    from rlfleet.wire._protowire import encode_varint

    return encode_varint(value)


def _result_field(body: bytes) -> bytes:
    from rlfleet.wire._protowire import len_prefix

    return len_prefix(4, len(body)) + body


def test_other_encodings_are_left_to_the_general_path(messages: list[bytes]) -> None:
    for data in messages[:3]:
        for other in encodings(worker_pb2.WorkerMessage.FromString(data)):
            assert read_result_message(other) is None
            assert_same_or_left(other)


def test_spoiled_messages_read_the_same_or_are_left_to_the_general_path(
    messages: list[bytes],
) -> None:
    rng = random.Random(3)
    taken = 0
    for _ in range(3000):
        data = bytearray(rng.choice(messages))
        kind = rng.randrange(3)
        if kind == 0:  # flip bytes near the front (the header and the chunk's fields)
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(min(len(data), 64))] = rng.randrange(256)
        elif kind == 1:  # truncated
            data = data[: rng.randrange(len(data))]
        else:  # a byte inserted
            at = rng.randrange(min(len(data), 64))
            data[at:at] = bytes([rng.randrange(256)])
        taken += assert_same_or_left(bytes(data))
    assert taken  # some spoiled ones still read (a changed number), the same both ways


def test_a_long_column_with_a_varint_longer_than_it_needs_is_left() -> None:
    meta = worker_pb2.EpisodeResult(task_id=1, episode_indices=list(range(200, 260)))
    body = meta.SerializeToString()
    assert body[3] == 120 and body[4:6] == b"\xc8\x01"  # read with numpy: 48 bytes or more
    column = b"\xc8\x81\x00" + body[6:]  # 200 in three bytes
    spoiled = b"\x08\x01\x12" + bytes([len(column)]) + column + b"\x3a\x02\x18\x01"
    data = _result_field(spoiled)
    assert read_result_message(data) is None
    assert general_piece(data).header.episode_indices == tuple(range(200, 260))


# --- a learner's results-connection frames ----------------------------------------


def frames_of(messages: list[bytes]) -> list[bytes]:
    """Each worker result passed on as the coordinator writes a results connection's
    frames: the result's chunks, the worker's id, the call's number."""
    out = []
    pieces = [parse_worker_message(data) for data in messages]
    for piece, call in zip(pieces, itertools.cycle((1, 300, 1 << 40)), strict=False):
        assert isinstance(piece, ResultPiece) and piece.chunk is not None
        forward = Forward(piece.header, 5, (piece.chunk,), 0)
        for parts in forwarded_parts(forward, result_call_field(call)):
            out.append(b"".join(bytes(part) for part in parts))
    return out


def general_frame(data: bytes | bytearray) -> object:
    """What protobuf reads from a frame (the general path of ``parse_result_frame``)."""
    try:
        message, chunk = parse_with_chunk(
            learner_pb2.SampleResponse, bytearray(data), _rpc.RESPONSE_CHUNK_PATH
        )
    except WireFormatError as exc:
        return exc
    if message.WhichOneof("body") != "result":
        return None
    return message.result_call, ResultHeader.of(message.result), chunk


def assert_frame_same_or_left(data: bytes | bytearray) -> bool:
    read = read_result_frame(memoryview(data))
    if read is None:
        return False
    expected = general_frame(data)
    assert isinstance(expected, tuple), f"the general path reads: {expected!r}"
    call, header, chunk = read
    assert (call, header) == expected[:2]
    assert chunk == expected[2]
    assert bytes(chunk.data) == bytes(expected[2].data)
    if expected[2].data:  # a chunk without data holds b"" both ways
        assert isinstance(chunk.data, memoryview) and chunk.data.readonly
    else:
        assert chunk.data == b""
    return True


def test_a_learners_result_frames_are_read_by_hand_as_protobuf_reads_them(
    messages: list[bytes],
) -> None:
    frames = frames_of(messages)
    for data in frames:
        assert assert_frame_same_or_left(bytearray(data)), "an honest frame takes the hand read"
    call, part = parse_result_frame(memoryview(bytearray(frames[0])))
    assert isinstance(part, ResultPart) and part.header.worker_id == 5 and call == 1


def test_other_frames_are_left_to_the_general_path(messages: list[bytes]) -> None:
    data = frames_of(messages[:1])[0]
    end = learner_pb2.SampleResponse(
        results_end=learner_pb2.ResultsEnd(results=3), result_call=1
    ).SerializeToString()
    others = [
        end,
        data[:-3],  # no result_call
        data + b"\x08\x01",  # a field after it
        data[:-1] + b"\x81\x00",  # the call's varint longer than it needs
        bytes(data[:1]) + b"\x82\x00" + bytes(data[2:]) if data[1] < 0x80 else data + b"\x00",
    ]
    for other in others:
        assert read_result_frame(other) is None
    assert parse_result_frame(end) == (1, ResultsEnd(3))


def test_spoiled_frames_read_the_same_or_are_left_to_the_general_path(
    messages: list[bytes],
) -> None:
    frames = frames_of(messages)
    rng = random.Random(5)
    taken = 0
    for _ in range(2000):
        data = bytearray(rng.choice(frames))
        kind = rng.randrange(3)
        if kind == 0:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(min(len(data), 64))] = rng.randrange(256)
        elif kind == 1:
            data = data[: rng.randrange(len(data))]
        else:
            at = rng.randrange(min(len(data), 64))
            data[at:at] = bytes([rng.randrange(256)])
        taken += assert_frame_same_or_left(data)
    assert taken


# --- a frame handed over in memory in pieces (Fleet.local) -------------------------


def pieces_of(messages: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    """Each frame of :func:`frames_of` as the coordinator hands it over in memory:
    the pieces before its chunk's data joined, the data, the call's number."""
    out = []
    for data in messages:
        piece = parse_worker_message(data)
        assert isinstance(piece, ResultPiece) and piece.chunk is not None
        forward = Forward(piece.header, 5, (piece.chunk,), 0)
        for head, chunk, tail in forwarded_parts(forward, result_call_field(300)):
            out.append((bytes(head), bytes(chunk), bytes(tail)))
    return out


def assert_pieces_same_or_left(head: bytes, data: bytes, tail: bytes) -> bool:
    """The pieces read where they lie as the joined frame is read, or left; the
    chunk's data a view of ``data``."""
    whole = bytearray(head + data + tail)
    held = bytearray(data)
    # The head in memory of its own size (bytes end in a NUL the reader could
    # read unnoticed): a read past it is caught by an address-sanitized build.
    own = np.frombuffer(head, np.uint8).copy()
    read = read_result_frame_pieces(own.data, memoryview(held), tail)
    plain = _result_reader.read_frame(whole)
    if plain is not None and plain[2:4] == (len(head), len(head) + len(data)) and data:
        assert read is not None, "a frame split at its chunk's data is read in pieces"
    if read is None:
        return False
    assert read == read_result_frame(whole)
    chunk = read[2]
    assert isinstance(chunk.data, memoryview) and chunk.data.readonly
    assert np.shares_memory(np.asarray(chunk.data), np.frombuffer(held, np.uint8))
    assert bytes(chunk.data) == data
    return True


def test_a_frame_in_pieces_is_read_where_they_lie_as_the_joined_frame(
    messages: list[bytes],
) -> None:
    for head, data, tail in pieces_of(messages):
        assert assert_pieces_same_or_left(head, data, tail) == bool(data)


def test_a_frame_split_at_any_point_of_its_head_is_read_as_joined_or_left(
    messages: list[bytes],
) -> None:
    taken = 0
    for head, chunk, tail in pieces_of(messages[:6]):
        frame = head + chunk + tail
        data_end = len(head) + len(chunk)
        for start in range(len(head) + 3):
            for end in (data_end - 1, data_end, data_end + 1):
                taken += assert_pieces_same_or_left(frame[:start], frame[start:end], frame[end:])
    assert taken == 6  # each frame only where it was cut


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_spoiled_frames_in_pieces_read_as_joined_or_are_left(
    messages: list[bytes], data: st.DataObject
) -> None:
    head, chunk, tail = data.draw(st.sampled_from(pieces_of(messages[:6])))
    frame = bytearray(head + chunk + tail)
    cut = (len(head), len(head) + len(chunk))
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, len(frame) - 1))
        change = data.draw(st.sampled_from(["byte", "insert", "remove"]))
        if change == "byte":
            frame[at] = data.draw(st.integers(0, 255))
        elif change == "insert":
            frame[at:at] = bytes([data.draw(st.integers(0, 255))])
        else:
            del frame[at]
        if len(frame) < 2:
            return
    # Each split point anywhere, or at or near where the data was; the head
    # also cut short among the result's fields.
    start = data.draw(
        st.integers(0, len(frame)) | st.integers(0, cut[0]) | st.integers(cut[0] - 3, cut[0] + 3)
    )
    end = data.draw(st.integers(0, len(frame)) | st.integers(cut[1] - 3, cut[1] + 3))
    start = min(max(start, 0), len(frame))
    end = min(max(end, start), len(frame))
    assert_pieces_same_or_left(bytes(frame[:start]), bytes(frame[start:end]), bytes(frame[end:]))


def python_calls(run: Callable[[], object]) -> int:
    """Python functions ``run`` calls (C functions not counted)."""
    count = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal count
        count += event == "call"

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return count


def _frame(episodes: int, first: int = 0, size: int = 10, number: int = 3) -> bytearray:
    """A frame of a result of ``episodes`` from ``first``, ``size`` bytes of data,
    task and batch ``number``."""
    result = worker_pb2.EpisodeResult(
        task_id=number,
        episode_indices=range(first, first + episodes),
        lengths=[100] * episodes,
        agent_version=1,
        env_generation=1,
        worker_id=5,
        chunk=batch_pb2.BatchChunk(
            batch_id=number,
            count=1,
            total_bytes=size,
            kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
            data=b"x" * size,
        ),
    )
    message = learner_pb2.SampleResponse(result=result, result_call=1)
    return bytearray(message.SerializeToString())


def _frame_calls(data: bytearray) -> tuple[int, int]:
    """The Python calls reading ``data`` makes, and its calls into the extension."""
    assert assert_frame_same_or_left(data)
    into = 0

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal into
        into += event == "c_call" and arg is _result_reader.read_frame_made

    view = memoryview(data)
    sys.setprofile(profile)
    try:
        read_result_frame(view)
    finally:
        sys.setprofile(None)
    return python_calls(lambda: read_result_frame(view)), into


def test_a_frame_is_read_in_one_call_into_the_extension() -> None:
    """A frame's fields are read in one call into the compiled reader, with no
    Python call per field or value: one-byte values, two-byte ones (episode
    indices past 127, sizes past 127 bytes, task and batch numbers), 400
    episodes, values of six bytes and more."""
    calls = {
        _frame_calls(frame)
        for frame in (
            _frame(4),
            _frame(40),
            _frame(4, 1000, 12_000, 300),
            _frame(20, 200, 300, 200),
            _frame(400, 1 << 40, 100_000, 1 << 50),
        )
    }
    assert len(calls) == 1
    python, into = calls.pop()
    assert into == 1
    assert python <= 2  # the lambda and the function: the header and chunk are made in C


# --- a frame's header and chunk made in the reader's call -----------------------------


def spoiled(data: st.DataObject, honest: bytes) -> bytearray:
    """``honest`` with up to three bytes changed, inserted or removed, or cut
    short (maybe to nothing), as hypothesis draws them."""
    frame = bytearray(honest)
    for _ in range(data.draw(st.integers(0, 3))):
        if not frame:
            break
        at = data.draw(st.integers(0, len(frame) - 1))
        change = data.draw(st.sampled_from(["byte", "insert", "remove", "cut"]))
        if change == "byte":
            frame[at] = data.draw(st.integers(0, 255))
        elif change == "insert":
            frame[at:at] = bytes([data.draw(st.integers(0, 255))])
        elif change == "remove":
            del frame[at]
        else:
            del frame[at:]
    return frame


def assert_made_as_read(data: bytearray, *, message: bool = False) -> bool:
    """``read_frame_made`` of ``data`` holds what ``read_frame`` reads, made into
    the header and chunk as Python makes them from it (``_parts``): the same
    fields, in the same order, the chunk's data a read-only view of ``data``.
    With ``message``: ``read_message_made`` and ``read_message`` (a worker's
    message, its header keeping its wire)."""
    view = memoryview(data)
    made: tuple[Any, ...] | NotImplementedType | None
    if message:
        made = _result_reader.read_message_made(view, ResultHeader, Chunk)
        read: tuple[Any, ...] | None = _result_reader.read_message(view)
    else:
        made = read_frame_made(view, ResultHeader, Chunk)
        read = _result_reader.read_frame(view)
    if read is None:
        assert made is None
        return False
    assert isinstance(made, tuple)
    if message:
        header, chunk = made
    else:
        call, header, chunk = made
        assert call == read[4]
    expected = _parts(view, read)
    assert type(header) is ResultHeader and type(chunk) is Chunk
    for got, want in ((header, expected[0]), (chunk, expected[1])):
        assert list(vars(got)) == list(vars(want))
        assert vars(got) == vars(want)
        assert got == want and hash(got) == hash(want) if got is header else got == want
    if read[3] > read[2]:
        assert isinstance(chunk.data, memoryview) and chunk.data.readonly
        assert chunk.data.format == "B" and chunk.data.ndim == 1
        assert np.shares_memory(np.asarray(chunk.data), np.frombuffer(data, np.uint8))
    else:
        assert chunk.data == b"" and type(chunk.data) is bytes
    return True


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_a_frames_header_and_chunk_made_in_c_are_those_python_makes_of_its_fields(
    messages: list[bytes], data: st.DataObject
) -> None:
    """Random frames as the coordinator writes them, spoiled by changed, inserted
    and removed bytes: made in the reader's call as Python makes them from the
    fields it reads, or both left (read under ASan and UBSan too)."""
    frame = spoiled(data, data.draw(st.sampled_from(frames_of(messages))))
    if frame:
        # A frame's own buffer of its size: a read past its end is caught by ASan.
        assert_made_as_read(frame)


def test_a_frames_header_and_chunk_are_made_in_c(messages: list[bytes]) -> None:
    """Every honest frame (and one whose chunk has no data) is made in the
    reader's call, its chunk's data a view of the frame."""
    empty = _frame(4, size=0)
    for frame in [*frames_of(messages), empty]:
        assert assert_made_as_read(bytearray(frame))


def test_a_frame_viewed_as_other_items_is_read_as_bytes() -> None:
    """A frame given as a view of other items than bytes (or of several
    dimensions) is read by the general wrapper, which casts it as Chunk
    does: the same call, header and chunk."""
    # A whole number of 4-byte items.
    data = next(frame for size in range(64, 68) if len(frame := _frame(4, size=size)) % 4 == 0)
    plain = read_result_frame(memoryview(data))
    assert plain is not None
    for view in (memoryview(data).cast("I"), memoryview(data).cast("B", (len(data) // 4, 4))):
        assert read_frame_made(view, ResultHeader, Chunk) is NotImplemented
        read = read_result_frame(view)
        assert read == plain
        assert read is not None and bytes(read[2].data) == bytes(plain[2].data)
        data_view = read[2].data
        assert isinstance(data_view, memoryview)
        assert data_view.format == "B" and data_view.ndim == 1 and data_view.readonly


def test_the_reader_refuses_what_is_no_buffer_or_no_type() -> None:
    with pytest.raises(TypeError):
        read_frame_made("frame", ResultHeader, Chunk)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        read_frame_made(_frame(4), ResultHeader)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        read_frame_made(_frame(4), ResultHeader, "Chunk")  # type: ignore[arg-type]


# --- a worker's message made in the reader's call ----------------------------------


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_a_messages_header_and_chunk_made_in_c_are_those_python_makes_of_its_fields(
    messages: list[bytes], data: st.DataObject
) -> None:
    """Random worker messages, spoiled by changed, inserted and removed bytes:
    made in the reader's call (``read_message_made``, what a result lane
    reads) as Python makes them from the fields ``read_message`` reads, wire
    and all, or both left (read under ASan and UBSan too)."""
    frame = spoiled(data, data.draw(st.sampled_from(messages)))
    if frame:
        assert_made_as_read(frame, message=True)


def test_every_workers_message_is_made_in_c(messages: list[bytes]) -> None:
    """Every honest message, of one chunk or several, is made in the reader's
    call, the header's wire on chunk 0 only."""
    for message in messages:
        assert assert_made_as_read(bytearray(message), message=True)


def test_a_message_viewed_as_other_items_is_read_as_bytes(messages: list[bytes]) -> None:
    """A message given as a view of other items than bytes is left by the made
    call and read by ``read_result_message``'s general wrapper, cast as Chunk
    casts it: the same header and chunk."""
    data = next(m for m in messages if len(m) % 4 == 0)
    plain = read_result_message(memoryview(data))
    assert plain is not None
    view = memoryview(data).cast("I")
    assert _result_reader.read_message_made(view, ResultHeader, Chunk) is NotImplemented
    read = read_result_message(view)
    assert read == plain and read is not None
    data_view = read[1].data
    assert isinstance(data_view, memoryview) and data_view.readonly
    assert bytes(data_view) == bytes(plain[1].data)


def test_the_message_reader_refuses_what_is_no_buffer_or_no_type() -> None:
    made = _result_reader.read_message_made
    with pytest.raises(TypeError):
        made("message", ResultHeader, Chunk)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        made(b"", ResultHeader)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        made(b"", ResultHeader, "Chunk")  # type: ignore[arg-type]
