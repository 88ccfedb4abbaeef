"""A result lane's frames read without a ResultPiece: the same results, events and errors.

``join_frame`` reads a result message as protobuf writes it in one call and
joins it; every other frame goes through protobuf's parser. Whatever the
frames (results of one or several chunks, in protobuf's own form or not,
chunks past the data channel's bounds or out of order, end-of-results
markers, heartbeats), it answers as ``parse_worker_message``, the size
bound and ``WorkerEvents.join_chunk`` one after the other do.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.leases import result_lane
from rlfleet.coordinator.leases.result_lane import _check_size, join_frame
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.state import FleetState
from rlfleet.coordinator.worker_events import CAPABILITIES, WorkerEvents
from rlfleet.coordinator.worker_messages import ResultPiece, parse_worker_message
from rlfleet.envs import EnvConfig
from rlfleet.errors import ProtocolError, ResourceExhaustedError, WireFormatError
from rlfleet.protocol.join import WorkerHello
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import batch_pb2, worker_pb2
from rlfleet.wire.results import JoinedResult

_KIND = batch_pb2.PAYLOAD_KIND_EPISODE_BATCH


def _frame(
    task_id: int, batch_id: int, index: int, count: int, data: bytes, *, own_form: bool
) -> bytes:
    """A WorkerMessage holding one chunk of a result (metadata on chunk 0)."""
    result = worker_pb2.EpisodeResult(
        chunk=batch_pb2.BatchChunk(
            batch_id=batch_id,
            index=index,
            count=count,
            kind=_KIND,
            data=data,
            total_bytes=len(data) * count,
        )
    )
    if index == 0:
        result.task_id = task_id
        result.episode_indices.extend([task_id, task_id + 1])
        result.lengths.extend([3, 4])
        result.agent_version = 2
        result.env_generation = 1
    frame = worker_pb2.WorkerMessage(result=result).SerializeToString(deterministic=True)
    if own_form:
        return frame
    # The same message with an unknown field after its result: protobuf reads it,
    # the one-call reader leaves it.
    return frame + b"\x98\x3e\x01"


def _other(kind: str) -> bytes:
    if kind == "leaving":
        message = worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason="done"))
    elif kind == "heartbeat":
        message = worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat(steps_total=5))
    else:
        return b"\xff\xff\xff"  # malformed
    return message.SerializeToString()


def _handle(events: WorkerEvents, limit: int) -> WorkerHandle:
    hello = WorkerHello(_rpc.PROTOCOL_VERSION, CAPABILITIES, num_envs=4, name="w")
    handle = events.admit(hello, "test")
    handle.inflight.limit = limit
    return handle


def _reference(events: WorkerEvents, handle: WorkerHandle, budget: Any, payload: bytes) -> Any:
    """What the lane did before ``join_frame``: parse, bound, join."""
    item = parse_worker_message(payload)
    if not isinstance(item, ResultPiece):
        return item
    _check_size(handle.name, len(payload), item.chunk)
    return events.join_chunk(handle, handle.data_assembler, budget, item.header, item.chunk)


def _seen(read: Any) -> Any:
    """A comparable account of an answer."""
    if isinstance(read, JoinedResult):
        return ("result", read.header, [bytes(c.data) for c in read.chunks], read.message_sizes)
    return ("event", read)


def _run(step: Any, frames: list[bytes], limit: int, *, held: bool = False) -> list[Any]:
    events = WorkerEvents(FleetState(CoordinatorConfig(env=EnvConfig("CartPole-v1"))))
    handle = _handle(events, limit)
    budget = handle.inflight.carrier()
    seen = []
    for frame in frames:
        try:
            seen.append(_seen(step(events, handle, budget, frame)))
        except (ProtocolError, WireFormatError, ResourceExhaustedError) as exc:
            seen.append(("error", type(exc).__name__, str(exc)))
            break  # the lane stops at a refusal
        finally:
            if held:  # what the carrier and the session hold in flight after each frame
                seen.append(("held", budget.used, budget.session_used))
    return seen


_piece = st.one_of(
    st.tuples(
        st.just("result"),
        st.integers(1, 300),  # task id
        st.integers(1, 3),  # chunks
        st.binary(min_size=0, max_size=40),  # each chunk's data
        st.booleans(),  # protobuf's own form
        st.booleans(),  # a chunk left out (out of order)
    ),
    st.tuples(st.sampled_from(["leaving", "heartbeat", "malformed"])),
)


def _frames(pieces: list[tuple[Any, ...]]) -> list[bytes]:
    frames: list[bytes] = []
    for number, piece in enumerate(pieces, start=1):
        if piece[0] != "result":
            frames.append(_other(piece[0]))
            continue
        _, task_id, count, data, own_form, skip = piece
        for index in range(count):
            if skip and count > 1 and index == 1:
                continue
            frames.append(_frame(task_id, number, index, count, data, own_form=own_form))
    return frames


@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(_piece, min_size=1, max_size=6),
    # Below one chunk's overhead, around a small chunk's charge, and far above.
    limit=st.sampled_from([60, 1024 + 8, 1024 + 20, 1024 + 40, 1 << 20]),
)
def test_frames_are_read_and_joined_as_parsing_bounding_and_joining_them_did(
    pieces: list[tuple[Any, ...]], limit: int
) -> None:
    frames = _frames(pieces)
    seen = _run(join_frame, frames, limit, held=True)
    assert seen == _run(_reference, frames, limit, held=True)


def test_a_chunk_past_the_data_channels_bound_is_refused_with_its_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(result_lane, "DATA_CHANNEL_CHUNK_BYTES", 8)
    for own_form in (True, False):
        frames = [_frame(3, 1, 0, 1, b"x" * 9, own_form=own_form)]
        (seen,) = _run(join_frame, frames, 1 << 20)
        assert seen == _run(_reference, frames, 1 << 20)[0]
        assert seen[:2] == ("error", "ProtocolError") and "over the data channel's 8" in seen[2]


def test_a_result_in_protobufs_own_form_makes_no_result_piece(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[object] = []
    real = result_lane.parse_worker_message_by_protobuf

    def counted(data: Any) -> Any:
        made.append(data)
        return real(data)

    monkeypatch.setattr(result_lane, "parse_worker_message_by_protobuf", counted)
    frames = [_frame(3, 1, 0, 1, b"abc", own_form=True), _frame(4, 2, 0, 1, b"d", own_form=False)]
    seen = _run(join_frame, frames, 1 << 20)
    assert [s[0] for s in seen] == ["result", "result"]
    assert made == [frames[1]]  # only the frame not in protobuf's own form
