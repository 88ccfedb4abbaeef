"""The coordinator's translation modules: worker and learner messages to rlfleet types and back."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.coordinator.calls import Forward
from rlfleet.coordinator.learner_messages import responses
from rlfleet.coordinator.worker_messages import ResultPiece, parse_worker_message
from rlfleet.core import EpisodeBatch, StepType
from rlfleet.envs import EnvConfig
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, worker_pb2
from rlfleet.wire import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    encode_batch_chunks,
    parse_with_chunk,
    serialize_with_chunk,
)
from rlfleet.wire._protowire import encode_varint

#: A field number this version of worker.proto does not define (a newer worker's).
UNKNOWN_FIELD = encode_varint((111 << 3) | 0) + encode_varint(7)
SPEC = EnvConfig("rlfleet/Counter-v0", imports=("rlfleet.envs.testing",)).env_spec()


def _batch(steps: int) -> EpisodeBatch:
    types = np.full(steps, int(StepType.MID), np.int8)
    types[0], types[-1] = int(StepType.FIRST), int(StepType.TERMINAL)
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={"episode_index": np.array([0])},
        observations=np.zeros((steps, *SPEC.observation_space.shape), np.float32),  # type: ignore[misc]
        last_observations=np.zeros((1, *SPEC.observation_space.shape), np.float32),  # type: ignore[misc]
        actions=np.zeros(steps, np.int64),
        rewards=np.zeros(steps, np.float32),
        env_infos={},
        agent_infos={},
        step_types=types,
        lengths=np.array([steps]),
    )


def test_a_results_metadata_reaches_the_learner_whole_with_the_workers_id() -> None:
    meta = worker_pb2.EpisodeResult(
        task_id=4, episode_indices=[0], lengths=[3], agent_version=1, env_generation=2
    )
    newer = worker_pb2.EpisodeResult.FromString(meta.SerializeToString() + UNKNOWN_FIELD)
    (chunk,) = encode_batch_chunks(_batch(3), include_env_spec=False)
    data = serialize_with_chunk(
        worker_pb2.WorkerMessage(result=newer), _rpc.WORKER_CHUNK_PATH, chunk
    )
    piece = parse_worker_message(data)
    assert isinstance(piece, ResultPiece) and piece.chunk is not None
    assert (piece.header.task_id, piece.header.episode_indices) == (4, (0,))

    (first,) = responses(Forward(piece.header, 9, (piece.chunk,), 3))
    assert isinstance(first, bytes)
    message, forwarded_chunk = parse_with_chunk(
        learner_pb2.SampleResponse, first, _rpc.RESPONSE_CHUNK_PATH
    )
    assert forwarded_chunk is not None and bytes(forwarded_chunk.data) == bytes(piece.chunk.data)
    forwarded = message.result
    assert (forwarded.task_id, forwarded.worker_id, list(forwarded.lengths)) == (4, 9, [3])
    assert UNKNOWN_FIELD in forwarded.SerializeToString()  # kept, for a newer learner


@pytest.mark.parametrize("unknown", [b"", UNKNOWN_FIELD])
@pytest.mark.parametrize("sent_worker_id", [0, 77])
@pytest.mark.parametrize("chunk_bytes", [None, 200])
def test_forwarded_results_are_what_protobuf_writes(
    unknown: bytes, sent_worker_id: int, chunk_bytes: int | None
) -> None:
    # The coordinator joins the worker's metadata, the id and each chunk as
    # bytes: they must parse as the message protobuf would write, for one
    # chunk or several and with a worker id the worker set itself (replaced,
    # not repeated), and be its very bytes when the worker sent no field
    # this version does not know (protobuf writes those last).
    meta = worker_pb2.EpisodeResult(
        task_id=4,
        episode_indices=[0],
        lengths=[300],
        agent_version=1,
        env_generation=2,
        worker_id=sent_worker_id,
    )
    sent_meta = worker_pb2.EpisodeResult.FromString(meta.SerializeToString() + unknown)
    chunks = encode_batch_chunks(
        _batch(300), chunk_bytes or DEFAULT_CHUNK_BYTES, include_env_spec=False
    )
    pieces: list[ResultPiece] = []
    received: list[Chunk] = []
    for chunk in chunks:
        envelope = worker_pb2.WorkerMessage(
            result=sent_meta if chunk.index == 0 else worker_pb2.EpisodeResult(task_id=4)
        )
        piece = parse_worker_message(serialize_with_chunk(envelope, _rpc.WORKER_CHUNK_PATH, chunk))
        assert isinstance(piece, ResultPiece) and piece.chunk is not None
        pieces.append(piece)
        received.append(piece.chunk)
    assert (len(pieces) > 1) == (chunk_bytes is not None)

    sent = list(responses(Forward(pieces[0].header, 9, tuple(received), 300)))

    assert len(sent) == len(pieces)
    for data, piece in zip(sent, pieces, strict=True):
        assert isinstance(data, bytes) and piece.chunk is not None
        result = worker_pb2.EpisodeResult()
        if piece.chunk.index == 0:
            result.MergeFromString(sent_meta.SerializeToString())
        result.worker_id = 9
        result.chunk.MergeFromString(piece.chunk.to_bytes())
        expected = learner_pb2.SampleResponse(result=result)
        got = learner_pb2.SampleResponse.FromString(data)
        assert got == expected
        assert got.result.worker_id == 9
        if not unknown:
            assert data == expected.SerializeToString()
        elif piece.chunk.index == 0:
            assert unknown in got.result.SerializeToString()
