"""serialize_batch_messages: a batch straight into its chunk messages, data copied once.

The bytes must be exactly those of the two-step path (serialize the batch,
cut it into chunks, serialize each chunk into its envelope), which the
coordinator already reads; and the data must be copied only once, which
shows in the peak memory of the call (tracemalloc counts numpy's and
Python's allocations).
"""

from __future__ import annotations

import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import (
    ChunkAssembler,
    decode_batch,
    encode_batch_chunks,
    parse_with_chunk,
    serialize_batch_messages,
    serialize_with_chunk,
)
from tests.test_wire_batches import assert_batches_identical, cartpole_batch


def _envelope(index: int) -> worker_pb2.WorkerMessage:
    if index == 0:
        result = worker_pb2.EpisodeResult(task_id=7, episode_indices=[1, 2], agent_version=3)
    else:
        result = worker_pb2.EpisodeResult(task_id=7)
    return worker_pb2.WorkerMessage(result=result)


@pytest.mark.parametrize("max_bytes", [64, 100, 257, 1000, 1 << 20])
@pytest.mark.parametrize("include_env_spec", [False, True])
def test_messages_are_byte_identical_to_chunking_a_serialized_batch(
    max_bytes: int, include_env_spec: bool
) -> None:
    batch = cartpole_batch(num_episodes=4)
    messages, total = serialize_batch_messages(
        batch,
        _envelope,
        _rpc.WORKER_CHUNK_PATH,
        max_bytes=max_bytes,
        batch_id=5,
        include_env_spec=include_env_spec,
    )
    chunks = encode_batch_chunks(batch, max_bytes, batch_id=5, include_env_spec=include_env_spec)
    assert total == chunks[0].total_bytes
    expected = [
        serialize_with_chunk(_envelope(i), _rpc.WORKER_CHUNK_PATH, chunk)
        for i, chunk in enumerate(chunks)
    ]
    assert messages == expected
    # And they read back as the batch.
    assembler = ChunkAssembler()
    payload = None
    for message in messages:
        _, chunk = parse_with_chunk(worker_pb2.WorkerMessage, message, _rpc.WORKER_CHUNK_PATH)
        assert chunk is not None
        payload = assembler.add(chunk)
    assert payload is not None
    back = decode_batch(payload, env_spec=None if include_env_spec else batch.env_spec)
    assert_batches_identical(back, batch)


def test_an_empty_looking_batch_still_makes_one_message() -> None:
    batch = cartpole_batch(num_episodes=1, max_length=1)
    messages, total = serialize_batch_messages(
        batch, _envelope, _rpc.WORKER_CHUNK_PATH, max_bytes=1 << 20
    )
    assert len(messages) == 1
    assert total == encode_batch_chunks(batch)[0].total_bytes


def _big_batch(steps: int) -> EpisodeBatch:
    """One episode of ``steps`` steps with 1 KiB observations."""
    space = gym.spaces.Box(-1.0, 1.0, (256,), np.float32)
    spec = EnvSpec(space, gym.spaces.Discrete(2), max_episode_length=steps)
    rng = np.random.default_rng(0)
    step_types = np.full(steps, int(StepType.MID), np.uint8)
    step_types[0], step_types[-1] = int(StepType.FIRST), int(StepType.TIMEOUT)
    return EpisodeBatch(
        env_spec=spec,
        episode_infos={},
        observations=rng.uniform(-1, 1, (steps, 256)).astype(np.float32),
        last_observations=np.zeros((1, 256), np.float32),
        actions=rng.integers(0, 2, steps),
        rewards=np.ones(steps),
        env_infos={},
        agent_infos={},
        step_types=step_types,
        lengths=np.array([steps]),
    )


def test_the_data_is_copied_once_into_the_messages() -> None:
    batch = _big_batch(8192)  # about 8.5 MB
    size = batch.observations.nbytes + batch.actions.nbytes + batch.rewards.nbytes
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        messages, total = serialize_batch_messages(
            batch, _envelope, _rpc.WORKER_CHUNK_PATH, max_bytes=1 << 20
        )
        _, one_path_peak = tracemalloc.get_traced_memory()
        del messages
        tracemalloc.reset_peak()
        chunks = encode_batch_chunks(batch, 1 << 20)
        two_step = [
            serialize_with_chunk(_envelope(i), _rpc.WORKER_CHUNK_PATH, c)
            for i, c in enumerate(chunks)
        ]
        _, two_step_peak = tracemalloc.get_traced_memory()
        del two_step, chunks
    finally:
        tracemalloc.stop()
    assert total > size
    # The messages themselves are one copy of the data; nothing else as large.
    assert one_path_peak < 1.1 * total
    # The old path held the whole serialized batch as well as the messages.
    assert two_step_peak > 1.9 * total
