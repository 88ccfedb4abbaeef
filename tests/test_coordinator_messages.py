"""The coordinator's translation modules: worker and learner messages to rlfleet types and back."""

from __future__ import annotations

import numpy as np

from rlfleet.coordinator.calls import Forward
from rlfleet.coordinator.learner_messages import responses
from rlfleet.coordinator.worker_messages import ResultPiece, parse_worker_message
from rlfleet.core import EpisodeBatch, StepType
from rlfleet.envs import EnvConfig
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import encode_batch_chunks, serialize_with_chunk
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
    assert isinstance(first, _rpc.WithChunk) and first.chunk is piece.chunk
    forwarded = first.message.result
    assert (forwarded.task_id, forwarded.worker_id, list(forwarded.lengths)) == (4, 9, [3])
    assert UNKNOWN_FIELD in forwarded.SerializeToString()  # kept, for a newer learner
