"""A batch of several chunks decoded where its chunks are (rlfleet.wire.scattered).

Whatever the cut, it must stand for exactly the batch the joined bytes
decode to, be placed in the answer as the joined one is, and refuse what
the joined one refuses.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import EpisodeBatch
from rlfleet.errors import ProtocolError, WireFormatError
from rlfleet.v1 import batch_pb2, worker_pb2
from rlfleet.wire import Chunk, decode_batch, encode_batch
from rlfleet.wire.chunks import chunk_payload
from rlfleet.wire.results import (
    DecodedResult,
    Result,
    ResultAssembler,
    ScatteredResult,
    assemble_episodes,
    assemble_fragments,
)
from rlfleet.wire.scattered import Scattered, Spliced, decode_scattered
from tests._coordinator_fakes import assert_same_batch
from tests.test_client_assembly import SPEC, batch

_KIND = batch_pb2.PAYLOAD_KIND_EPISODE_BATCH


def _with_infos(b: EpisodeBatch) -> EpisodeBatch:
    """``b`` with a bool env info and a nested agent info (maps of several tensors)."""
    steps = b.total_steps
    return EpisodeBatch(
        env_spec=b.env_spec,
        episode_infos=b.episode_infos,
        observations=b.observations,
        last_observations=b.last_observations,
        actions=b.actions,
        rewards=b.rewards,
        env_infos={"flag": np.arange(steps) % 3 == 0},
        agent_infos={**b.agent_infos, "policy": {"value": np.arange(steps, dtype=np.float64)}},
        step_types=b.step_types,
        lengths=b.lengths,
    )


def _chunks(payload: bytes, room: int) -> list[Chunk]:
    """The chunks of ``payload`` as received: each its own bytes."""
    return [
        Chunk(c.batch_id, c.index, c.count, c.total_bytes, c.kind, bytes(c.data))
        for c in chunk_payload(payload, kind=_KIND, max_bytes=room)
    ]


def _results(b: EpisodeBatch, count: int) -> tuple[DecodedResult, ScatteredResult]:
    """``b`` received in about ``count`` chunks, joined and kept in pieces."""
    meta = worker_pb2.EpisodeResult(
        task_id=1, episode_indices=b.episode_infos["episode_index"].tolist(), lengths=b.lengths
    )
    payload = encode_batch(b, include_env_spec=False)
    chunks = _chunks(payload, max(64, len(payload) // count))
    assert len(chunks) > 1, "a result of several chunks: a real test"
    joined = scattered = None
    joining, keeping = ResultAssembler(SPEC), ResultAssembler(SPEC)
    for i, chunk in enumerate(chunks):
        envelope = meta if i == 0 else worker_pb2.EpisodeResult()
        joined = joining.add(envelope, chunk)
        scattered = keeping.add_kept(envelope, chunk)
    assert isinstance(joined, DecodedResult) and isinstance(scattered, ScatteredResult)
    return joined, scattered


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    count=st.integers(2, 9),
    keep=st.integers(1, 12),
)
def test_a_result_in_pieces_is_the_joined_one_whatever_the_cut(
    lengths: list[int], count: int, keep: int
) -> None:
    b = _with_infos(batch(lengths, list(range(len(lengths)))))
    joined, scattered = _results(b, count)
    _assert_same(scattered.batch, joined.batch)
    n = min(keep, len(lengths))
    _assert_same(assemble_episodes([scattered], n), assemble_episodes([joined], n))


def _assert_same(got: EpisodeBatch, want: EpisodeBatch) -> None:
    """Bit-for-bit equality, nested infos included."""

    def leaves(tree: object, prefix: str) -> dict[str, np.ndarray]:
        if isinstance(tree, dict):
            out: dict[str, np.ndarray] = {}
            for key, value in tree.items():
                out.update(leaves(value, f"{prefix}[{key}]"))
            return out
        return {prefix: np.asarray(tree)}

    names = (*_FIELDS, "lengths", "episode_infos", "env_infos", "agent_infos")
    a = {k: v for n in names for k, v in leaves(getattr(got, n), n).items()}
    b = {k: v for n in names for k, v in leaves(getattr(want, n), n).items()}
    assert a.keys() == b.keys()
    for name, array in b.items():
        assert a[name].dtype == array.dtype, name
        np.testing.assert_array_equal(a[name], array, err_msg=name)


_FIELDS = ("observations", "last_observations", "actions", "rewards", "step_types")


def test_results_in_pieces_are_placed_as_joined_ones_interleaved_or_not() -> None:
    # Episodes 0-3 in one result (a block of the answer), 4-7 dealt
    # alternately to two results (interleaved), arriving out of order.
    lengths = {0: 30, 1: 10, 2: 50, 3: 20, 4: 40, 5: 10, 6: 20, 7: 30}
    parts = [[4, 6], [0, 1, 2, 3], [5, 7]]
    pairs = [_results(batch([lengths[i] for i in p], p), 5) for p in parts]
    joined = [j for j, _ in pairs]
    scattered = [s for _, s in pairs]
    assert_same_batch(assemble_episodes(scattered, 8), assemble_episodes(joined, 8))
    mixed: list[Result] = [scattered[0], joined[1], scattered[2]]
    assert_same_batch(assemble_episodes(mixed, 8), assemble_episodes(joined, 8))


def test_fragments_in_pieces_are_placed_as_joined_ones() -> None:
    results = []
    for stream, lengths in ((1, [30, 25]), (0, [50])):
        b = batch(lengths, list(range(len(lengths))))
        infos = {
            "stream": np.full(len(lengths), stream, dtype=np.int64),
            "fragment_index": np.zeros(len(lengths), dtype=np.int64),
        }
        results.append(_results(b.with_episode_infos(**infos), 5))
    assert_same_batch(
        assemble_fragments([s for _, s in results]), assemble_fragments([j for j, _ in results])
    )


def test_tensors_are_views_of_their_chunk_or_its_pieces() -> None:
    b = batch([200, 100], [0, 1])
    payload = encode_batch(b, include_env_spec=False)
    chunks = _chunks(payload, 700)
    pieces = [memoryview(c.data) for c in chunks]
    decoded = decode_scattered(pieces, SPEC)
    assert isinstance(decoded.observations, Scattered)
    assert b"".join(decoded.observations.pieces) == b.observations.tobytes()
    received = [np.frombuffer(c.data, np.uint8) for c in chunks]
    for piece in decoded.observations.pieces:
        assert any(np.shares_memory(np.frombuffer(piece, np.uint8), r) for r in received)


def test_spliced_reads_bytes_across_pieces() -> None:
    data = bytes(range(50))
    spliced = Spliced([data[:7], data[7:8], data[8:30], data[30:]])
    assert len(spliced) == 50
    assert [spliced[i] for i in range(50)] == list(data)
    assert spliced[5:33] == data[5:33]
    assert b"".join(spliced.pieces(6, 30)) == data[6:36]
    assert spliced[1:20:3] == data[1:20:3]
    with pytest.raises(WireFormatError, match="byte 50 read past the end of a 50-byte message"):
        spliced[50]


def _corrupted(b: EpisodeBatch, field: str, value: int) -> bytes:
    """``b``'s bytes with the first byte of ``field``'s data set to ``value``."""
    payload = encode_batch(b, include_env_spec=False)
    leaf: Any = decode_batch(payload, env_spec=SPEC)
    for name in field.split("."):
        leaf = leaf[name] if isinstance(leaf, dict) else getattr(leaf, name)
    offset = leaf.ctypes.data - np.frombuffer(payload, np.uint8).ctypes.data
    broken = bytearray(payload)
    broken[offset] = value
    return bytes(broken)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("step_types", 9, "expected StepType values"),
        ("env_infos.flag", 2, "bool tensor holds byte 2"),
        ("lengths", 7, "lengths"),
    ],
)
def test_a_result_in_pieces_refuses_what_the_joined_one_refuses(
    field: str, value: int, message: str
) -> None:
    b = _with_infos(batch([40, 30], [0, 1]))
    chunks = _chunks(_corrupted(b, field, value), 200)
    meta = worker_pb2.EpisodeResult(task_id=1, episode_indices=[0, 1], lengths=[40, 30])
    joining, keeping = ResultAssembler(SPEC), ResultAssembler(SPEC)
    for add in (joining.add, keeping.add_kept):
        with pytest.raises(ProtocolError, match=message):
            for i, chunk in enumerate(chunks):
                add(meta if i == 0 else worker_pb2.EpisodeResult(), chunk)


def test_a_scattered_batch_refuses_shapes_its_spaces_do_not_accept() -> None:
    b = batch([40, 30], [0, 1])
    wide = EpisodeBatch.prechecked(
        env_spec=SPEC,
        episode_infos=b.episode_infos,
        observations=np.repeat(b.observations, 3, axis=1),
        last_observations=np.repeat(b.last_observations, 3, axis=1),
        actions=b.actions,
        rewards=b.rewards,
        env_infos={},
        agent_infos={},
        step_types=b.step_types,
        lengths=b.lengths,
        check_actions=False,
    )
    pieces = [memoryview(c.data) for c in _chunks(encode_batch(wide, include_env_spec=False), 200)]
    with pytest.raises(WireFormatError, match="observation_space"):
        decode_scattered(pieces, SPEC)
