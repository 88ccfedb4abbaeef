"""Chunking: sizes, zero-copy slicing, reassembly and every ordering fault."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlfleet.core import TimeStepBatch
from rlfleet.errors import ConfigError, ResourceExhaustedError, WireFormatError
from rlfleet.v1 import batch_pb2
from rlfleet.wire import (
    DEFAULT_CHUNK_BYTES,
    Chunk,
    ChunkAssembler,
    chunk_payload,
    decode_batch_chunks,
    encode_batch,
    encode_batch_chunks,
    parse_chunk,
)
from tests.test_wire_batches import (
    assert_batches_identical,
    cartpole_batch,
    cartpole_time_steps,
    shares_memory,
)

EPISODES = batch_pb2.PAYLOAD_KIND_EPISODE_BATCH


def chunks_of(data: bytes, max_bytes: int, batch_id: int = 7) -> list[Chunk]:
    return chunk_payload(data, kind=EPISODES, max_bytes=max_bytes, batch_id=batch_id)


def test_a_hand_computed_split() -> None:
    # 10 bytes, max 20 per BatchChunk. Header bound with count <= 2: one
    # byte per tag and value for fields 1-5, plus data tag and length:
    # 12 bytes, leaving 8 bytes of data per chunk.
    chunks = chunks_of(b"0123456789", 20, batch_id=0)
    assert [bytes(chunk.data) for chunk in chunks] == [b"01234567", b"89"]
    assert [(c.index, c.count, c.total_bytes, c.kind) for c in chunks] == [
        (0, 2, 10, EPISODES),
        (1, 2, 10, EPISODES),
    ]
    # count=2, total=10, kind=1 (batch_id and index 0 omitted), data tag+len, data
    assert chunks[0].to_bytes() == b"\x18\x02\x20\x0a\x28\x01\x32\x0801234567"
    assert chunks[0].byte_size() == 16


@pytest.mark.parametrize("max_bytes", [40, 100, 1000, 4096, DEFAULT_CHUNK_BYTES])
def test_chunks_fit_max_bytes_and_rebuild_the_batch(max_bytes: int) -> None:
    batch = cartpole_batch(num_episodes=4)
    data = encode_batch(batch)
    chunks = encode_batch_chunks(batch, max_bytes, batch_id=2**40)
    assert chunks[0].count == len(chunks) >= math.ceil(len(data) / max_bytes)
    for chunk in chunks:
        serialized = chunk.to_proto().SerializeToString()
        assert chunk.to_bytes() == serialized
        assert chunk.byte_size() == len(serialized) <= max_bytes
    assert b"".join(bytes(chunk.data) for chunk in chunks) == data
    assert_batches_identical(decode_batch_chunks(chunks), batch)


def test_chunks_are_views_of_one_serialization() -> None:
    data = encode_batch(cartpole_batch())
    chunks = chunks_of(data, 100)
    for chunk in chunks:
        assert isinstance(chunk.data, memoryview)
        assert shares_memory(np.frombuffer(chunk.data, np.uint8), data)


def test_every_chunk_but_the_last_is_full() -> None:
    chunks = chunks_of(bytes(1000), 100)
    sizes = [len(chunk.data) for chunk in chunks]
    assert len(set(sizes[:-1])) == 1
    assert 0 < sizes[-1] <= sizes[0]
    assert chunks[0].byte_size() <= 100 < chunks[0].byte_size() + len(chunks[0].header())


def test_an_empty_payload_is_one_empty_chunk() -> None:
    (chunk,) = chunks_of(b"", 100)
    assert (chunk.index, chunk.count, chunk.total_bytes, bytes(chunk.data)) == (0, 1, 0, b"")
    assert ChunkAssembler().add(chunk) == b""


def test_max_bytes_too_small_for_any_data_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_bytes=12 is too small"):
        chunks_of(b"0123456789", 12, batch_id=0)


def test_decoding_takes_chunk_objects_messages_or_bytes() -> None:
    batch = cartpole_batch()
    chunks = encode_batch_chunks(batch, 300)
    mixed = [
        chunk.to_bytes() if i % 3 == 0 else chunk.to_proto() if i % 3 == 1 else chunk
        for i, chunk in enumerate(chunks)
    ]
    assert_batches_identical(decode_batch_chunks(mixed), batch)


def test_a_single_chunk_decodes_without_a_copy() -> None:
    batch = cartpole_batch()
    (chunk,) = encode_batch_chunks(batch)
    decoded = decode_batch_chunks([chunk])
    assert shares_memory(decoded.observations, chunk.data)


def test_time_step_batches_carry_their_kind() -> None:
    batch = cartpole_time_steps(cartpole_batch())
    chunks = encode_batch_chunks(batch, 500, include_env_spec=True)
    assert {chunk.kind for chunk in chunks} == {batch_pb2.PAYLOAD_KIND_TIME_STEP_BATCH}
    decoded = decode_batch_chunks(chunks)
    assert isinstance(decoded, TimeStepBatch)
    assert_batches_identical(decoded, batch)


def test_chunks_without_env_spec_take_it_as_an_argument() -> None:
    batch = cartpole_batch()
    chunks = encode_batch_chunks(batch, 500, include_env_spec=False)
    with pytest.raises(WireFormatError, match="no env_spec"):
        decode_batch_chunks(chunks)
    assert_batches_identical(decode_batch_chunks(chunks, env_spec=batch.env_spec), batch)


def test_parse_chunk_reads_protobuf_bytes_without_copying() -> None:
    data = batch_pb2.BatchChunk(
        batch_id=3, index=1, count=4, total_bytes=99, kind=EPISODES, data=b"xyz"
    ).SerializeToString()
    chunk = parse_chunk(data)
    assert chunk == Chunk(3, 1, 4, 99, EPISODES, b"xyz")
    assert shares_memory(np.frombuffer(chunk.data, np.uint8), data)


# ------------------------------------------------------------ faults

# Batch 7, 250 bytes in BatchChunks of at most 60 bytes. Header bound for
# at most 6 chunks: batch_id, index, count, kind 2 bytes each, total_bytes 3,
# data tag and length 2: 13, so 47 bytes of data per chunk: 5 x 47 + 15.
CHUNKS = chunks_of(bytes(range(250)), 60)


def test_the_fault_fixture_is_split_as_computed_by_hand() -> None:
    assert [len(chunk.data) for chunk in CHUNKS] == [47] * 5 + [15]


def decode_payload(chunks: list[Chunk]) -> bytes | memoryview | None:
    assembler = ChunkAssembler()
    payload = None
    for chunk in chunks:
        payload = assembler.add(chunk)
    return payload


def renumbered(chunk: Chunk, **changes: int) -> Chunk:
    fields = {
        "batch_id": chunk.batch_id,
        "index": chunk.index,
        "count": chunk.count,
        "total_bytes": chunk.total_bytes,
        "kind": chunk.kind,
    }
    return Chunk(**{**fields, **changes}, data=chunk.data)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([CHUNKS[0], CHUNKS[1], CHUNKS[3]], "chunk 2 of batch 7 missing: got index 3"),
        ([CHUNKS[0], CHUNKS[2], CHUNKS[1]], "chunk 1 of batch 7 missing: got index 2"),
        ([CHUNKS[0], CHUNKS[1], CHUNKS[1]], "chunk 2 of batch 7 missing: got index 1"),
        ([CHUNKS[1]], "chunk 1 of batch 7 arrived first: chunk 0 is missing"),
        (
            [CHUNKS[0], renumbered(CHUNKS[1], batch_id=8)],
            r"batch 7 is incomplete \(1 of 6 chunks arrived\) but chunk 1 of batch 8 came next",
        ),
        (
            [CHUNKS[0], renumbered(CHUNKS[1], count=7)],
            "chunk 1 of batch 7 says count=7, chunk 0 said 6",
        ),
        (
            [CHUNKS[0], renumbered(CHUNKS[1], total_bytes=251)],
            "says total_bytes=251, chunk 0 said 250",
        ),
        ([CHUNKS[0], renumbered(CHUNKS[1], kind=2)], "says kind=2, chunk 0 said 1"),
        (
            [renumbered(c, total_bytes=260) for c in CHUNKS],
            "its 6 chunk.s. hold 250 bytes, total_bytes says 260",
        ),
        (
            [renumbered(c, total_bytes=100) for c in CHUNKS[:2]]
            + [renumbered(CHUNKS[2], total_bytes=100)],
            "hold 141 bytes, more than its total_bytes 100",
        ),
        ([renumbered(CHUNKS[0], count=1)], "its 1 chunk.s. hold 47 bytes, total_bytes says 250"),
    ],
    ids=[
        "missing",
        "reordered",
        "duplicate",
        "no-first",
        "other-batch",
        "count",
        "total",
        "kind",
        "short",
        "overflow",
        "single-short",
    ],
)
def test_ordering_and_consistency_faults_are_named(chunks: list[Chunk], message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        decode_payload(chunks)
    with pytest.raises(WireFormatError, match=message):
        decode_batch_chunks(chunks)


def test_decode_batch_chunks_rejects_early_ends_extra_chunks_and_nothing() -> None:
    with pytest.raises(
        WireFormatError, match="batch 7 ended after chunk 2 of 6: chunk 3 is missing"
    ):
        decode_batch_chunks(CHUNKS[:3])
    chunk = encode_batch_chunks(cartpole_batch(), batch_id=1)[0]
    with pytest.raises(WireFormatError, match="chunk 0 of batch 2 follows the last chunk"):
        decode_batch_chunks([chunk, renumbered(chunk, batch_id=2)])
    with pytest.raises(WireFormatError, match="no chunks to decode"):
        decode_batch_chunks([])


def test_an_unknown_payload_kind_is_rejected() -> None:
    chunks = [renumbered(chunk, kind=0) for chunk in encode_batch_chunks(cartpole_batch(), 500)]
    with pytest.raises(WireFormatError, match="unknown payload kind 0"):
        decode_batch_chunks(chunks)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"index": 3, "count": 3}, "index must be in 0..2"),
        ({"index": -1}, r"index must be in 0..0"),
        ({"count": 0}, r"count must be in 1..2\*\*32-1"),
        ({"count": 2**32}, r"count must be in 1..2\*\*32-1"),
        ({"batch_id": -1}, "must fit in uint64"),
        ({"total_bytes": 2}, "holds 3 bytes, more than the batch's total_bytes 2"),
        ({"kind": 2**31}, "not an int32 enum value"),
    ],
)
def test_chunk_fields_are_range_checked(fields: dict[str, int], message: str) -> None:
    base = {"batch_id": 1, "index": 0, "count": 1, "total_bytes": 3, "kind": EPISODES}
    with pytest.raises(WireFormatError, match=message):
        Chunk(**{**base, **fields}, data=b"abc")


# ---------------------------------------------------------- the assembler


def test_the_assembler_streams_batches_back_to_back() -> None:
    assembler = ChunkAssembler()
    first = cartpole_batch(seed=1)
    second = cartpole_batch(seed=2)
    stream = encode_batch_chunks(first, 400, batch_id=1) + encode_batch_chunks(
        second, 400, batch_id=2
    )
    payloads = []
    for chunk in stream:
        payload = assembler.add(chunk)
        assert assembler.in_progress == (payload is None and chunk.index < chunk.count - 1)
        if payload is not None:
            payloads.append(bytes(payload))
    assert payloads == [encode_batch(first), encode_batch(second)]


def test_a_multi_chunk_payload_is_read_only() -> None:
    payload = decode_payload(CHUNKS)
    assert isinstance(payload, memoryview)
    assert payload.readonly
    assert bytes(payload) == bytes(range(250))


def test_a_single_chunk_payload_is_the_chunk_data_itself() -> None:
    (chunk,) = chunks_of(b"abc", 100)
    assert ChunkAssembler().add(chunk) is chunk.data


def test_after_a_fault_the_assembler_accepts_a_new_batch() -> None:
    assembler = ChunkAssembler()
    assembler.add(CHUNKS[0])
    with pytest.raises(WireFormatError):
        assembler.add(CHUNKS[2])
    assert not assembler.in_progress
    payload = None
    for chunk in CHUNKS:
        payload = assembler.add(chunk)
    assert payload is not None and bytes(payload) == bytes(range(250))


def test_the_size_limit_is_checked_on_chunk_zero_before_allocating() -> None:
    assembler = ChunkAssembler(max_total_bytes=249)
    huge = Chunk(9, 0, 2, 2**60, EPISODES, b"x")  # would need an exabyte buffer
    with pytest.raises(ResourceExhaustedError, match=f"batch 9 is {2**60} bytes, over the limit"):
        assembler.add(huge)
    with pytest.raises(ResourceExhaustedError, match="over the limit of 249 bytes"):
        assembler.add(CHUNKS[0])
    assert not assembler.in_progress
    assert ChunkAssembler(max_total_bytes=250).add(CHUNKS[0]) is None


def test_reset_drops_a_partial_batch() -> None:
    assembler = ChunkAssembler()
    assembler.add(CHUNKS[0])
    assembler.reset()
    with pytest.raises(WireFormatError, match="arrived first"):
        assembler.add(CHUNKS[1])
