"""A worker copies step data once after stepping.

In process, from its step ring into the batch; on a remote worker, from the
ring straight into the outgoing messages (``take_finished_pieces``), with
the bytes the joined batch would give. Finished episodes view their rows in
the ring (no copy) and pin them, so the ring must neither overwrite those
rows while the episode waits to be taken nor keep them once it is gone.
Real CartPole envs and the MLP policy.
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.core._pieces import RowPieces
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import InvalidBatchError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import decode_batch_chunks, parse_with_chunk, serialize_batch_messages
from rlfleet.worker import VecWorker, make_units
from rlfleet.worker._episode_buffer import (
    EPISODE_INFO_KEYS,
    MIN_PIECE_BYTES,
    Segment,
    build_batch,
    build_pieces,
)

CARTPOLE = EnvConfig("CartPole-v1")


def _worker() -> VecWorker:
    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(16, 16), seed=3)
    return VecWorker(n_envs=4, seed=0, env=CARTPOLE, policy=policy)


def test_finished_episodes_view_the_ring_and_the_batch_is_the_one_copy() -> None:
    worker = _worker()
    worker.submit(make_units(0, 0, range(40)))
    # The ring doubles as it fills, and segments keep viewing the arrays
    # they were made in: remember every generation of the ring's arrays.
    arrays: dict[int, tuple[np.ndarray, ...]] = {}
    while worker.finished_count < 20:
        worker.step()
        ring = worker._engine.ring
        assert ring is not None and ring.actions is not None
        arrays[id(ring.obs)] = (ring.obs, ring.actions, ring.rewards, ring.agent_infos["log_prob"])
    segments = [s for s in worker._units.finished if isinstance(s, Segment)]
    assert len(segments) == len(worker._units.finished)  # gym envs' records are segments

    def ring_of(segment: Segment) -> tuple[np.ndarray, ...] | None:
        for generation in arrays.values():
            if np.shares_memory(segment.observations, generation[0]):
                return generation
        return None

    # Every segment that does not wrap around the ring's end is a view of it
    # (at most a few of 20 short episodes wrap).
    viewing = [(s, ring_of(s)) for s in segments if ring_of(s) is not None]
    assert len(viewing) >= len(segments) - 3
    for segment, (obs, actions, rewards, log_prob) in viewing:  # type: ignore[misc]
        # Contiguous views (the ring is stored slot by slot): the remote
        # worker's serializer joins them into its messages as they are.
        for array in (segment.observations, segment.actions, segment.rewards):
            assert array.flags.c_contiguous
        assert np.shares_memory(segment.actions, actions)
        assert np.shares_memory(segment.rewards, rewards)
        assert np.shares_memory(segment.agent_infos["log_prob"], log_prob)
        # The cell after the last step is the slot's next first observation: copied.
        assert not np.shares_memory(segment.last_observation, obs)
    expected = np.concatenate(
        [np.array(s.observations) for s in sorted(segments, key=lambda s: s.key)]
    )
    batch = worker.take_finished()
    assert batch is not None
    for array in (batch.observations, batch.actions, batch.rewards, *batch.agent_infos.values()):
        assert array.base is None  # the batch owns the one copy
        assert not any(np.shares_memory(array, a) for g in arrays.values() for a in g)
    np.testing.assert_array_equal(batch.observations, expected)
    worker.shutdown()


def test_rows_of_untaken_episodes_are_kept_and_released_once_taken() -> None:
    units = make_units(0, 0, range(150))
    hoarder, taker = _worker(), _worker()
    hoarder.submit(units)
    while not hoarder.idle:
        hoarder.step()
    kept = hoarder.take_finished()
    taker.submit(units)
    taken: list[EpisodeBatch] = []
    while not taker.idle:
        taker.step()
        batch = taker.take_finished()
        if batch is not None:
            taken.append(batch)
    gc.collect()
    assert kept is not None and taken
    # The hoarder's episodes sat in its ring for the whole run, yet come out
    # exactly as the ones taken at once: their rows were never overwritten.
    assert kept.n_episodes == 150
    joined = EpisodeBatch.concatenate(*taken)
    in_order = joined.take_episodes(np.argsort(joined.episode_infos["episode_index"]))
    for name in ("observations", "actions", "rewards", "last_observations", "step_types"):
        np.testing.assert_array_equal(getattr(kept, name), getattr(in_order, name))
    np.testing.assert_array_equal(kept.agent_infos["log_prob"], in_order.agent_infos["log_prob"])
    # Taken episodes release their rows: the taker's ring stays at a few
    # episode lengths, the hoarder's kept growing (its old arrays live on
    # with the segments viewing them).
    hoarder_ring, taker_ring = hoarder._engine.ring, taker._engine.ring
    assert hoarder_ring is not None and taker_ring is not None
    assert taker_ring.capacity <= 256 < hoarder_ring.capacity
    hoarder.shutdown()
    taker.shutdown()


def _envelope(index: int) -> worker_pb2.WorkerMessage:
    task = worker_pb2.EpisodeResult(task_id=9, episode_indices=[4, 5] if index == 0 else [])
    return worker_pb2.WorkerMessage(result=task)


def _messages(batch: Any, max_bytes: int = 1 << 20) -> list[bytes]:
    messages, _ = serialize_batch_messages(
        batch, _envelope, _rpc.WORKER_CHUNK_PATH, max_bytes=max_bytes, include_env_spec=False
    )
    return messages


_SPEC = EnvSpec(
    observation_space=gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
    action_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    max_episode_length=50,
)

_INFO_DTYPES = st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_])


@st.composite
def _segments(draw: st.DrawFn) -> list[Segment]:
    """Segments viewing a slot-major ring, as a worker's engine makes them."""
    n_slots = draw(st.integers(1, 4))
    rows = 60
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    obs = rng.random((n_slots, rows + 1, 3), dtype=np.float32).swapaxes(0, 1)
    actions = rng.random((n_slots, rows, 2), dtype=np.float32).swapaxes(0, 1)
    rewards = rng.random((n_slots, rows)).swapaxes(0, 1)
    log_prob = rng.random((n_slots, rows)).swapaxes(0, 1)
    agent_keys = draw(st.sampled_from([(), ("log_prob",), ("log_prob", "mean")]))
    env_keys = draw(st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3))
    env_dtypes = {key: draw(_INFO_DTYPES) for key in env_keys}
    nested = draw(st.booleans())
    segments = []
    for n in range(draw(st.integers(1, 8))):
        slot = draw(st.integers(0, n_slots - 1))
        length = draw(st.integers(1, 20))
        start = draw(st.integers(0, rows - length))
        stop = start + length
        keys = env_keys if draw(st.integers(0, 5)) != 0 else env_keys[:-1]
        env_infos: dict[str, Any] = {
            key: rng.integers(0, 3, (length, 2)).astype(env_dtypes[key]) for key in keys
        }
        if nested and env_infos:
            env_infos["nested"] = {"x": rng.random(length)}
        segments.append(
            Segment(
                key=(0, n),
                infos=(1, n, n + 100, n, 0),
                observations=obs[start:stop, slot],
                last_observation=obs[stop, slot].copy(),
                actions=actions[start:stop, slot],
                rewards=rewards[start:stop, slot],
                agent_infos={key: log_prob[start:stop, slot] for key in agent_keys},
                env_infos=env_infos,
                first=draw(st.booleans()),
                last=draw(st.sampled_from([None, 2, 3])),
                env_spec=_SPEC,
            )
        )
    return segments


@settings(max_examples=60, deadline=None)
@given(
    segments=_segments(),
    max_bytes=st.sampled_from([64, 300, 1 << 20]),
    min_piece_bytes=st.sampled_from([0, 64, MIN_PIECE_BYTES]),
)
def test_pieces_give_the_bytes_of_the_joined_batch(
    segments: list[Segment], max_bytes: int, min_piece_bytes: int
) -> None:
    batch = build_batch(_SPEC, segments, EPISODE_INFO_KEYS, from_ring=True, actions_checked=True)
    pieces = build_pieces(
        _SPEC, segments, EPISODE_INFO_KEYS, actions_checked=False, min_piece_bytes=min_piece_bytes
    )
    assert _messages(pieces, max_bytes) == _messages(batch, max_bytes)


def test_row_pieces_refuse_arrays_that_do_not_join() -> None:
    with pytest.raises(InvalidBatchError, match="does not join"):
        RowPieces((np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float64)))
    with pytest.raises(InvalidBatchError, match="does not join"):
        RowPieces((np.zeros((2, 3)), np.zeros((2, 4))))


def _finished(worker: VecWorker, episodes: int) -> VecWorker:
    worker.submit(make_units(0, 0, range(episodes)))
    while not worker.idle:
        worker.step()
    return worker


def test_a_remote_workers_messages_are_those_of_its_batch() -> None:
    pieces_worker, batch_worker = _finished(_worker(), 100), _finished(_worker(), 100)
    pieces = pieces_worker.take_finished_pieces()
    batch = batch_worker.take_finished()
    assert pieces is not None and batch is not None
    messages = _messages(pieces, max_bytes=4096)
    assert len(messages) > 1 and messages == _messages(batch, max_bytes=4096)
    parsed = [
        parse_with_chunk(worker_pb2.WorkerMessage, m, _rpc.WORKER_CHUNK_PATH) for m in messages
    ]
    decoded = decode_batch_chunks([c for _, c in parsed if c is not None], env_spec=batch.env_spec)
    np.testing.assert_array_equal(decoded.observations, batch.observations)
    np.testing.assert_array_equal(decoded.agent_infos["log_prob"], batch.agent_infos["log_prob"])
    pieces_worker.shutdown()
    batch_worker.shutdown()


def _long_segments(n: int, length: int) -> list[Segment]:
    """Segments of 64-float observations viewing a slot-major ring, as an engine's."""
    rng = np.random.default_rng(0)
    obs = rng.random((n, length + 1, 64), dtype=np.float32).swapaxes(0, 1)
    actions = rng.random((n, length, 2), dtype=np.float32).swapaxes(0, 1)
    rewards = rng.random((n, length)).swapaxes(0, 1)
    spec = EnvSpec(
        observation_space=gym.spaces.Box(-1.0, 1.0, (64,), np.float32),
        action_space=gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        max_episode_length=length,
    )
    return [
        Segment(
            key=(0, i),
            infos=(1, i, i, i, 0),
            observations=obs[:length, i],
            last_observation=obs[length, i].copy(),
            actions=actions[:, i],
            rewards=rewards[:, i],
            agent_infos={},
            env_infos={},
            first=True,
            last=3,
            env_spec=spec,
        )
        for i in range(n)
    ]


def test_serializing_the_pieces_copies_the_step_data_once() -> None:
    segments = _long_segments(64, 200)  # about 3.4 MB, in 1 MiB messages
    spec = segments[0].env_spec
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        pieces = build_pieces(spec, segments, EPISODE_INFO_KEYS, actions_checked=True)
        messages = _messages(pieces)
        _, one_copy_peak = tracemalloc.get_traced_memory()
        del pieces, messages
        tracemalloc.reset_peak()
        batch = build_batch(spec, segments, EPISODE_INFO_KEYS, from_ring=True)
        joined = _messages(batch)
        _, two_copy_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = sum(len(m) for m in joined)
    assert len(joined) > 2 and size > 3_000_000
    # The messages are the one copy; joining the batch first held it too.
    assert one_copy_peak < 1.1 * size
    assert two_copy_peak > 1.9 * size
