"""The coordinator's StreamBook stays bounded however many base seeds it serves.

It remembers the fragment streams of the MAX_STREAM_SEEDS base seeds used
last (rlfleet/protocol/stream_replay.py). A forgotten seed starts its streams over
at episode 0, on every worker, as a fresh sampler with that seed does; a
remembered one continues. The fleet test runs real worker processes over
more distinct seeds than the book keeps and compares every batch with
LocalSampler's, bit for bit.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.core._arrays import episode_starts
from rlfleet.core.episode_order import cut_pieces
from rlfleet.envs import EnvConfig
from rlfleet.protocol.stream_replay import (
    MAX_REPLAY_STEPS,
    MAX_STREAM_SEEDS,
    RECENT_SEED_SECONDS,
    StreamBook,
    StreamReplay,
    _Episode,
)
from rlfleet.sampling.local import LocalSampler
from rlfleet.worker import VecWorker
from tests.test_fleet_equivalence import assert_same_batch

pytestmark = pytest.mark.timeout(240)

CARTPOLE = EnvConfig("CartPole-v1")
ENVS_PER_WORKER = 2
LENGTH = 30  # cuts CartPole episodes under random actions: streams carry episodes over


def windows(seed: int, count: int) -> list[EpisodeBatch]:
    vec = VecWorker(n_envs=2, env=CARTPOLE)
    return [vec.collect_fragments(LENGTH, base_seed=seed, first_stream=0) for _ in range(count)]


def test_the_book_keeps_the_seeds_used_last_and_restarts_a_forgotten_one() -> None:
    book = StreamBook(max_seeds=3)
    for seed in range(10):
        assert book.replay(seed, 0, 1) == StreamReplay(0, 0)  # new: start at episode 0
        for batch in windows(seed, 2):
            book.record(seed, 1, batch)
        assert book.seeds == min(seed + 1, 3)
    # Remembered (seeds 7-9): its runner needs nothing, another worker the episode in
    # progress or the next one.
    assert book.replay(9, 0, 1) is None
    moved = book.replay(9, 1, 2)
    assert moved is not None and moved.episode_index > 0
    # Forgotten (seed 0, though worker 1 ran it): every worker starts over at episode 0.
    assert book.replay(0, 0, 1) == StreamReplay(0, 0)
    assert book.replay(0, 1, 2) == StreamReplay(1, 0)
    assert book.seeds == 3


def test_a_fleet_serving_many_seeds_keeps_the_book_bounded_and_batches_identical() -> None:
    slots = 2 * ENVS_PER_WORKER
    seeds = list(range(100, 100 + MAX_STREAM_SEEDS + 4))

    def local(seed: int, calls: int) -> EpisodeBatch:
        with LocalSampler(
            CARTPOLE, n_workers=2, envs_per_worker=ENVS_PER_WORKER, seed=seed
        ) as sampler:
            for _ in range(calls - 1):
                sampler.obtain_fragments(slots * LENGTH, LENGTH)
            return sampler.obtain_fragments(slots * LENGTH, LENGTH)

    def remote(fleet: Fleet, seed: int) -> EpisodeBatch:
        with RemoteSampler(fleet.address, seed=seed) as sampler:
            return sampler.obtain_fragments(slots * LENGTH, LENGTH)

    fleet = Fleet.local(2, ENVS_PER_WORKER, CARTPOLE, seed=1)
    try:
        workers = {w.worker_id for w in fleet.sampler.status().workers}
        book = fleet.server.coordinator._state.streams
        first = seeds[0]
        assert_same_batch(local(first, 1), remote(fleet, first), workers)
        assert_same_batch(local(first, 2), remote(fleet, first), workers)  # continues
        for seed in seeds[1:]:
            batch = remote(fleet, seed)
            assert book.seeds <= MAX_STREAM_SEEDS
            if seed % 16 == 0:
                assert_same_batch(local(seed, 1), batch, workers)
        assert book.seeds == MAX_STREAM_SEEDS
        last = seeds[-1]
        assert_same_batch(local(last, 2), remote(fleet, last), workers)  # still continues
        # The first seed was forgotten: it starts over, as a fresh sampler does.
        assert_same_batch(local(first, 1), remote(fleet, first), workers)
        assert book.seeds == MAX_STREAM_SEEDS
    finally:
        fleet.close()


def test_forgetting_a_seed_used_recently_warns_and_an_idle_one_does_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    book = StreamBook(max_seeds=2, clock=lambda: now[0])
    book.replay(1, 0, 1)
    book.replay(2, 0, 1)
    now[0] = RECENT_SEED_SECONDS + 1.0
    with caplog.at_level("WARNING", logger="rlfleet.protocol.stream_replay"):
        book.replay(3, 0, 1)  # forgets seed 1, idle longer than RECENT_SEED_SECONDS
    assert not caplog.records
    now[0] += 5.0
    with caplog.at_level("WARNING", logger="rlfleet.protocol.stream_replay"):
        book.replay(4, 0, 1)  # forgets seed 2... which was used before the clock moved
    assert not caplog.records
    book.replay(4, 0, 1)
    with caplog.at_level("WARNING", logger="rlfleet.protocol.stream_replay"):
        book.replay(5, 0, 1)  # forgets seed 3, used 5 s ago: its sampler may still run
    [record] = caplog.records
    message = record.getMessage()
    assert "base seed 3, last used 5 s ago" in message
    assert "repeat episodes already delivered" in message


# --- the book's record against the rules one piece at a time ---------------------------


def record_per_piece(book: StreamBook, base_seed: int, worker_id: int, batch: EpisodeBatch) -> None:
    """The book's rules applied one piece at a time, in the window's order: what
    :meth:`StreamBook.record` must leave, whatever the window holds."""
    infos = batch.episode_infos
    streams, episodes, fragments = (
        np.asarray(infos[key]).tolist() for key in ("stream", "episode_index", "fragment_index")
    )
    starts = episode_starts(batch.lengths)
    ends = starts + batch.lengths
    ended = ~cut_pieces(batch) if len(batch.lengths) else np.zeros(0, dtype=bool)
    known = book._touch(base_seed)
    for i, (stream, episode, fragment) in enumerate(zip(streams, episodes, fragments, strict=True)):
        known.runner[stream] = worker_id
        known.next_episode[stream] = max(known.next_episode.get(stream, 0), episode + 1)
        current = book._episodes.get(stream)
        if ended[i]:
            if current is not None and current.episode_index <= episode:
                del book._episodes[stream]
            continue
        actions = batch.actions[starts[i] : ends[i]]
        if fragment == 0:
            current = _Episode(base_seed, episode, 0, [], 0, batch.last_observations[i])
        elif current is None or (current.base_seed, current.episode_index, current.fragments) != (
            base_seed,
            episode,
            fragment,
        ):
            book._episodes.pop(stream, None)
            continue
        current.fragments += 1
        current.steps += len(actions)
        current.actions.append(np.array(actions))
        current.last_observation = np.array(batch.last_observations[i])
        if current.steps > book._max_steps:
            book._episodes.pop(stream, None)
            continue
        book._episodes[stream] = current


SPEC = EnvSpec(
    gym.spaces.Box(-1.0, 1.0, (3,), np.float32), gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
)


def random_window(rng: np.random.Generator, state: dict[int, tuple[int, int]]) -> EpisodeBatch:
    """A window of pieces that mostly continue ``state`` (stream: its episode and
    fragments out, updated) and sometimes do not: gaps, repeats, pieces out of
    order, several cut pieces in one stream, streams running many short episodes."""
    rows: list[tuple[int, int, int, int, bool]] = []  # stream, episode, fragment, steps, cut
    for stream in rng.choice(8, size=int(rng.integers(0, 6)), replace=False).tolist():
        episode, fragment = state.get(stream, (0, 0))
        if rng.random() < 0.15:  # a gap, a repeat, or a stale episode
            episode = max(episode + int(rng.integers(-2, 3)), 0)
            fragment = int(rng.integers(0, 3))
        for _ in range(int(rng.integers(1, 20 if rng.random() < 0.1 else 4))):
            cut = bool(rng.random() < 0.4)
            rows.append((stream, episode, fragment, int(rng.integers(1, 5)), cut))
            episode, fragment = (episode, fragment + 1) if cut else (episode + 1, 0)
            if cut and rng.random() < 0.85:
                break
        state[stream] = (episode, fragment)
    if rows and rng.random() < 0.3:
        rows = [rows[i] for i in rng.permutation(len(rows))]
    lengths = np.array([r[3] for r in rows], dtype=np.int64)
    total = int(lengths.sum())
    step_types = np.full(total, int(StepType.MID), dtype=np.uint8)
    ends = np.cumsum(lengths) - 1
    for end, row in zip(ends.tolist(), rows, strict=True):
        if not row[4]:
            step_types[end] = int(rng.choice([int(StepType.TERMINAL), int(StepType.TIMEOUT)]))
    column = lambda k: np.array([r[k] for r in rows], dtype=np.int64)  # noqa: E731
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={
            "stream": column(0),
            "episode_index": column(1),
            "fragment_index": column(2),
        },
        observations=rng.uniform(-1, 1, (total, 3)).astype(np.float32),
        last_observations=rng.uniform(-1, 1, (len(rows), 3)).astype(np.float32),
        actions=rng.uniform(-1, 1, (total, 2)).astype(np.float32),
        rewards=np.ones(total, np.float32),
        env_infos={},
        agent_infos={},
        step_types=step_types,
        lengths=lengths,
    )


def assert_same_books(got: StreamBook, want: StreamBook) -> None:
    assert list(got._seeds) == list(want._seeds)
    for seed, known in want._seeds.items():
        assert got._seeds[seed].next_episode == known.next_episode
        assert got._seeds[seed].runner == known.runner
    assert got._episodes.keys() == want._episodes.keys()
    for stream, episode in want._episodes.items():
        mine = got._episodes[stream]
        assert (mine.base_seed, mine.episode_index, mine.fragments, mine.steps) == (
            episode.base_seed,
            episode.episode_index,
            episode.fragments,
            episode.steps,
        )
        assert [len(a) for a in mine.actions] == [len(a) for a in episode.actions]
        for a, b in (
            (mine.actions, episode.actions),
            ([mine.last_observation], [episode.last_observation]),
        ):
            joined, expected = np.concatenate(a), np.concatenate(b)
            assert joined.dtype == expected.dtype and np.array_equal(joined, expected)
    for stream, episode in want._episodes.items():
        # What a replacement gets (worker 3 never runs a stream: it is always told).
        assert _same_replay(got, want, episode.base_seed, stream, 3)


def _same_replay(got: StreamBook, want: StreamBook, seed: int, stream: int, worker: int) -> bool:
    a, b = got.replay(seed, stream, worker), want.replay(seed, stream, worker)
    if a is None or b is None:
        return a is b
    return (a.stream, a.episode_index, a.fragment_index) == (
        b.stream,
        b.episode_index,
        b.fragment_index,
    ) and all(
        (x is None and y is None) or (x is not None and y is not None and np.array_equal(x, y))
        for x, y in ((a.actions, b.actions), (a.last_observation, b.last_observation))
    )


@pytest.mark.parametrize("case", range(40))
def test_recording_a_window_at_once_leaves_the_book_the_per_piece_rules_leave(case: int) -> None:
    rng = np.random.default_rng(case)
    max_steps = int(rng.choice([3, 6, 12, MAX_REPLAY_STEPS]))
    got, want = StreamBook(max_steps=max_steps, max_seeds=2), StreamBook(max_steps, max_seeds=2)
    state: dict[int, tuple[int, int]] = {}
    for _ in range(40):
        seed, worker = int(rng.integers(0, 3)), int(rng.integers(1, 3))
        window = random_window(rng, state)
        got.record(seed, worker, window)
        record_per_piece(want, seed, worker, window)
        assert_same_books(got, want)
        if rng.random() < 0.05:
            got.end_episodes()
            want.end_episodes()
