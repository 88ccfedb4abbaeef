"""The coordinator's StreamBook stays bounded however many base seeds it serves.

It remembers the fragment streams of the MAX_STREAM_SEEDS base seeds used
last (rlfleet/protocol/stream_replay.py). A forgotten seed starts its streams over
at episode 0, on every worker, as a fresh sampler with that seed does; a
remembered one continues. The fleet test runs real worker processes over
more distinct seeds than the book keeps and compares every batch with
LocalSampler's, bit for bit.
"""

from __future__ import annotations

import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.protocol.stream_replay import (
    MAX_STREAM_SEEDS,
    RECENT_SEED_SECONDS,
    StreamBook,
    StreamReplay,
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
