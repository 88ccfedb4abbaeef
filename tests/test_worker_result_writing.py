"""A remote worker writes each result's messages by hand, as protobuf writes them, in one copy.

``result_messages`` writes a result's ``WorkerMessage``\\ s without protobuf
objects: the ``EpisodeResult`` header by hand (its columns packed with a
few numpy calls), and a native worker's step columns gathered from its ring
straight into the message (``TakenRows``), with no array in between. The
bytes are protobuf's own for the same message (the coordinator's hand
reader, ``rlfleet.wire.result_message``, reads exactly that form). Real
CartPole vector envs and the MLP policy.
"""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core._pieces import EpisodePieces, TakenRows
from rlfleet.envs.config import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import DEFAULT_CHUNK_BYTES, serialize_batch_messages
from rlfleet.wire._protowire import packed_varints
from rlfleet.worker import VecWorker, make_units
from rlfleet.worker._flush import KEPT_BYTES, FlushMemory
from rlfleet.worker._join_messages import result_messages
from tests.test_result_message import python_calls

NATIVE = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
#: Room result_messages leaves for the envelope (as the worker's own constant).
ALLOWANCE = 64


@pytest.fixture(scope="module")
def worker() -> Iterator[VecWorker]:
    policy = MLPCategoricalPolicy(NATIVE.env_spec(), hidden_sizes=(16, 16), seed=3)
    vec = VecWorker(n_envs=64, seed=0, env=NATIVE, policy=policy)
    vec.submit(make_units(0, 0, range(20_000)))
    for _ in range(3):  # until the ring has its size: episodes of one ring's columns
        finished(vec, 8192)
    yield vec
    vec.shutdown()


def finished(vec: VecWorker, steps: int) -> EpisodePieces:
    while vec.finished_steps < steps:
        vec.step()
    pieces = vec.take_finished_pieces()
    assert pieces is not None
    return pieces


def protobufs(
    batch: Any, task_id: int, generation: int, batch_id: int, max_message_bytes: int
) -> list[bytes]:
    """The messages written through protobuf's objects (the envelope) and the batch codec."""
    meta = worker_pb2.EpisodeResult(
        task_id=task_id,
        episode_indices=batch.episode_infos["episode_index"].tolist(),
        lengths=batch.lengths.tolist(),
        agent_version=int(batch.episode_infos["agent_version"][0]),
        env_generation=generation,
    )
    first = worker_pb2.WorkerMessage(result=meta)
    rest = worker_pb2.WorkerMessage(result=worker_pb2.EpisodeResult(task_id=task_id))
    room = min(DEFAULT_CHUNK_BYTES, max_message_bytes - meta.ByteSize() - ALLOWANCE)
    messages, _ = serialize_batch_messages(
        batch,
        lambda index: first if index == 0 else rest,
        _rpc.WORKER_CHUNK_PATH,
        max_bytes=room,
        batch_id=batch_id,
        include_env_spec=False,
    )
    return messages


def by_hand(
    batch: Any, task_id: int, generation: int, batch_id: int, max_message_bytes: int
) -> list[bytes]:
    messages, total = result_messages(
        batch,
        task_id=task_id,
        episode_indices=batch.episode_infos["episode_index"],
        env_generation=generation,
        batch_id=batch_id,
        max_message_bytes=max_message_bytes,
    )
    assert total > 0
    return [bytes(message) for message in messages]


@pytest.mark.parametrize(
    ("task_id", "generation", "version", "max_message_bytes"),
    [
        (3, 1, None, 4 << 20),  # one message
        (0, 0, None, 4 << 20),  # fields at their defaults are left out
        (1 << 40, 7, -1, 50_000),  # several chunks; a negative version is ten bytes
        (9, 2, 1 << 33, 20_000),
    ],
)
def test_a_result_is_written_by_hand_byte_for_byte_as_protobuf_writes_it(
    worker: VecWorker, task_id: int, generation: int, version: int | None, max_message_bytes: int
) -> None:
    pieces = finished(worker, 8192)
    assert isinstance(pieces.observations, TakenRows)  # gathered into the message
    if version is not None:
        infos = dict(pieces.episode_infos)
        infos["agent_version"] = np.full(pieces.n_episodes, version, np.int64)
        pieces = dataclasses.replace(pieces, episode_infos=infos)
    args = (task_id, generation, 5, max_message_bytes)
    written = by_hand(pieces, *args)
    assert written == protobufs(pieces, *args)
    assert (len(written) > 1) == (max_message_bytes < 400_000)


def test_a_result_is_written_without_protobuf_objects(
    worker: VecWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = finished(worker, 2048)
    expected = protobufs(pieces, 4, 1, 2, 4 << 20)

    def refused(*_: object, **__: object) -> None:
        raise AssertionError("a protobuf object on a result's path")

    monkeypatch.setattr(worker_pb2, "EpisodeResult", refused)
    monkeypatch.setattr(worker_pb2, "WorkerMessage", refused)
    assert by_hand(pieces, 4, 1, 2, 4 << 20) == expected


def test_a_native_workers_result_is_the_one_copy_of_its_steps(worker: VecWorker) -> None:
    finished(worker, 1)
    while worker.finished_steps < 8192:
        worker.step()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        start, _ = tracemalloc.get_traced_memory()
        pieces = worker.take_finished_pieces()
        assert pieces is not None
        messages, total = result_messages(
            pieces,
            task_id=1,
            episode_indices=pieces.episode_infos["episode_index"],
            env_generation=1,
            batch_id=1,
            max_message_bytes=4 << 20,
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = sum(len(message) for message in messages)
    assert len(messages) == 1 and size > total > 300_000
    # The message, and the ring's index of each step (8 bytes a step, about
    # a tenth of a CartPole step's bytes): no gathered column besides.
    assert peak - start < 1.4 * size


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=40))
def test_packed_columns_are_protobufs(values: list[int]) -> None:
    message = worker_pb2.EpisodeResult(lengths=values).SerializeToString()
    packed = packed_varints(np.array(values, dtype=np.int64))
    assert message == (b"\x1a" + _varint(len(packed)) + packed if values else b"")


def _varint(value: int) -> bytes:
    from rlfleet.wire._protowire import encode_varint

    return encode_varint(value)


def test_a_sessions_flushes_write_their_messages_into_reused_memory(worker: VecWorker) -> None:
    memory = FlushMemory()

    def flush() -> list[memoryview]:
        messages = []
        for task_id in (1, 2):  # two results of one flush: side by side, not overlapping
            pieces = finished(worker, 2048)
            written, _ = result_messages(
                pieces,
                task_id=task_id,
                episode_indices=pieces.episode_infos["episode_index"],
                env_generation=1,
                batch_id=task_id,
                max_message_bytes=4 << 20,
                allocate=memory.allocate,
            )
            assert [bytes(m) for m in written] == protobufs(pieces, task_id, 1, task_id, 4 << 20)
            messages += written
        return messages

    flush()  # the memory grows to hold a flush
    memory.reset()
    first = flush()
    starts = [address(m) for m in first]
    assert starts[1] == starts[0] + len(first[0])
    memory.reset()  # sent: the next flush writes where these were
    assert address(flush()[0]) == starts[0]
    memory.reset()
    # The kept memory's start now: the flush above grew a new buffer if its
    # episodes (the module's worker's, so the tests run before) were longer.
    kept = address(memory.allocate(10))
    memory.reset()
    large = memory.allocate(KEPT_BYTES + 1)  # memory of its own, not kept
    assert len(large) == KEPT_BYTES + 1
    assert address(memory.allocate(10)) == kept


def test_a_flushs_python_calls_do_not_grow_with_its_episodes(worker: VecWorker) -> None:
    """Taking a flush's finished episodes, writing their result and listing them as
    reported makes about as many Python calls for 300 episodes as for 10: the finished
    table is read as one array, its ints packed in one C call, and the result's
    header is written per message, so nothing runs Python once per episode (a
    native worker ends about three an env step)."""
    memory = FlushMemory()

    def flush(steps: int) -> tuple[int, int]:
        finished(worker, 1)
        while worker.finished_steps < steps:
            worker.step()
        episodes = worker.finished_count

        def take_and_write() -> None:
            pieces = worker.take_finished_pieces()
            assert pieces is not None
            indices = pieces.episode_infos["episode_index"]
            result_messages(
                pieces,
                task_id=1,
                episode_indices=indices,
                env_generation=1,
                batch_id=1,
                max_message_bytes=4 << 20,
                allocate=memory.allocate,
            )
            indices.tolist()  # what the session marks reported

        gc.disable()  # a collection may run the test runner's Python callbacks
        try:
            calls = python_calls(take_and_write)
        finally:
            gc.enable()
        memory.reset()
        return episodes, calls

    for steps in (300, 6_000, 6_000, 6_000):  # the worker's memory grows to hold a flush
        flush(steps)
    few, few_calls = flush(200)
    many, many_calls = flush(6_000)
    assert many > 10 * few
    # Per-batch work differs by up to about 50 calls between two flushes
    # (where their steps lie in the worker's memory: the module's worker
    # starts each test where the last left it); work per episode adds a call
    # or more for each of the 250-odd episodes more.
    assert abs(many_calls - few_calls) < (many - few) // 3, (
        f"{few_calls} calls for {few} episodes, {many_calls} for {many}"
    )


def address(view: memoryview) -> int:
    return int(np.frombuffer(view, np.uint8).ctypes.data)
