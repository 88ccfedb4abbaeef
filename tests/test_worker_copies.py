"""A worker copies step data once after stepping: from its step ring into the batch.

Finished episodes view their rows in the ring (no copy) and pin them, so the
ring must neither overwrite those rows while the episode waits to be taken
nor keep them once it is gone. Real CartPole envs and the MLP policy.
"""

from __future__ import annotations

import gc

import numpy as np

from rlfleet.core import EpisodeBatch
from rlfleet.envs.config import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.worker import VecWorker, make_units
from rlfleet.worker._episode_buffer import Segment

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
    segments = list(worker._finished)

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
