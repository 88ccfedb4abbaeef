"""A ``Fleet.local`` learner's results reach it with no copy of their chunks.

The coordinator hands a learner in its own process each result frame in
pieces (rlfleet.transport.frame_pieces): the result's small head and the
call's number joined, the chunk's data passed as the view of the buffer the
worker's message was received into. The learner reads the pieces where they
lie (read_result_frame_pieces), so the batch is the same as a socket's
frames give, and that receive buffer is not taken again until the learner
lets the result go.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import pytest

from rlfleet.client import Fleet, _learner_messages
from rlfleet.client._learner_messages import parse_result_frame
from rlfleet.coordinator.leases import data_connections
from rlfleet.coordinator.leases.data_connections import InProcessConnection
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.envs import EnvConfig
from rlfleet.errors import WireFormatError
from rlfleet.protocol.learner_calls import ResultPart
from rlfleet.transport.frame_pieces import FramePieces, frame_of
from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES, ReceiveBuffers
from rlfleet.v1 import batch_pb2, learner_pb2, worker_pb2
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import TEST_ENVS_MODULE, local_episodes

SEED = 41
#: Episodes of 20 Atari-sized frames: results far above LARGE_FRAME_BYTES.
FRAMES_ENV = EnvConfig("rlfleet/Frames-v0", {"length": 20}, imports=(TEST_ENVS_MODULE,))


def _result_frame(size: int) -> tuple[bytes, int, int]:
    """A result frame as protobuf writes it whose chunk holds ``size`` bytes of
    data, and where that data starts and ends in it."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    result = worker_pb2.EpisodeResult(
        task_id=3,
        episode_indices=[7, 8],
        lengths=[100, 120],
        agent_version=1,
        env_generation=1,
        worker_id=5,
        chunk=batch_pb2.BatchChunk(
            batch_id=3,
            count=1,
            total_bytes=size,
            kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
            data=data,
        ),
    )
    payload = learner_pb2.SampleResponse(result=result, result_call=9).SerializeToString()
    start = payload.index(data)
    return payload, start, start + size


def _in_process_connection() -> InProcessConnection:
    """An in-process connection whose data server is never asked anything here."""
    return InProcessConnection(cast(LeaseDataServer, types.SimpleNamespace()))


def test_a_result_frames_chunk_reaches_the_learner_as_its_receive_buffers_view() -> None:
    payload, start, end = _result_frame(3 * LARGE_FRAME_BYTES)
    buffers = ReceiveBuffers(16 * LARGE_FRAME_BYTES)
    received = buffers.take(len(payload))  # where the worker's message was read into
    received[:] = payload
    chunk = received[start:end].toreadonly()
    connection = _in_process_connection()
    connection.send_parts([payload[:start], chunk, payload[end:]], 1.0)
    kept = id(received.obj)
    del received
    handed = connection.link.receive_message(1.0)
    assert isinstance(handed, FramePieces) and handed.data is chunk  # not copied
    assert len(handed) == len(payload)
    call, part = parse_result_frame(handed)
    expected = parse_result_frame(payload)
    assert call == expected[0] == 9
    assert isinstance(part, ResultPart) and part == expected[1] and part.chunk is not None
    assert bytes(part.chunk.data) == payload[start:end]
    assert np.shares_memory(np.asarray(part.chunk.data), np.asarray(chunk))
    del handed, chunk

    # The learner still holds the result: its receive buffer is not taken again.
    other = buffers.take(len(payload))
    assert not np.shares_memory(np.asarray(other), np.asarray(part.chunk.data))
    assert bytes(part.chunk.data) == payload[start:end]
    del part
    # Let go, its buffer is taken again (the other one still held).
    again = buffers.take(len(payload))
    assert id(again.obj) == kept and buffers.made == 2
    del other


def test_small_frames_are_joined_and_a_frame_of_one_piece_is_passed_as_it_is() -> None:
    payload, start, end = _result_frame(1000)
    view = memoryview(payload)
    assert frame_of([view[:start], view[start:end], view[end:]]) == payload
    assert frame_of([b"", view, b""]) is view
    large, start, end = _result_frame(LARGE_FRAME_BYTES)
    pieces = frame_of([large[:2], large[2:start], large[start:end], large[end:]])
    assert isinstance(pieces, FramePieces)
    assert (pieces.head, pieces.tail) == (large[:start], large[end:])
    assert pieces.joined() == large


def test_a_frame_in_pieces_that_is_not_a_result_reads_as_the_joined_frame() -> None:
    payload, start, end = _result_frame(2 * LARGE_FRAME_BYTES)
    # Its data piece not the chunk's whole data: read as the joined frame is.
    split = FramePieces(payload[: start + 1], memoryview(payload)[start + 1 : end], payload[end:])
    assert parse_result_frame(split) == parse_result_frame(payload)
    # A bad frame: the same error as off a socket.
    spoiled = payload[:start] + payload[start:end] + b"\xc8"
    with pytest.raises(WireFormatError) as joined:
        parse_result_frame(spoiled)
    with pytest.raises(type(joined.value)) as in_pieces:
        parse_result_frame(FramePieces(payload[:start], payload[start:end], b"\xc8"))
    assert str(in_pieces.value) == str(joined.value)


@pytest.fixture
def pieces_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Counts the frames the learner reads in pieces and the frames it joins."""
    seen: dict[str, Any] = {"pieces": 0, "joined": 0, "chunks": []}
    read = _learner_messages.read_result_frame_pieces
    joined = FramePieces.joined

    def counted_read(head: bytes, data: bytes | memoryview, tail: bytes) -> Any:
        out = read(head, data, tail)
        if out is not None:
            seen["pieces"] += 1
            seen["chunks"].append(out[2].data)
        return out

    def counted_joined(self: FramePieces) -> bytes:
        seen["joined"] += 1
        return joined(self)

    monkeypatch.setattr(_learner_messages, "read_result_frame_pieces", counted_read)
    monkeypatch.setattr(FramePieces, "joined", counted_joined)
    yield seen


def test_a_local_learners_large_results_are_read_in_place_and_give_the_same_batch(
    pieces_read: dict[str, Any],
) -> None:
    expected = local_episodes(FRAMES_ENV, 8, seed=SEED)[0]
    fleet = Fleet.local(workers=1, envs_per_worker=4, env=FRAMES_ENV, seed=SEED)
    try:
        batch = fleet.sampler.obtain_episodes(8)
        server = fleet.server.coordinator.lease_data
        assert server is not None
        kept = [np.frombuffer(buffer, np.uint8) for buffer in server.buffers._buffers]
    finally:
        fleet.close()
    assert_same_batch(batch, expected)
    assert pieces_read["pieces"] >= 1 and pieces_read["joined"] == 0
    # Each chunk the learner read is a view of the coordinator's receive buffers.
    for data in pieces_read["chunks"]:
        assert any(np.shares_memory(np.asarray(data), buffer) for buffer in kept)


def test_a_local_learners_batch_is_the_same_with_its_frames_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def batch() -> Any:
        with Fleet.local(workers=1, envs_per_worker=4, env=FRAMES_ENV, seed=SEED) as sampler:
            return sampler.obtain_episodes(8)

    in_pieces = batch()
    monkeypatch.setattr(
        data_connections, "frame_of", lambda parts: b"".join(bytes(part) for part in parts)
    )
    assert_same_batch(in_pieces, batch(), skip_infos=())
