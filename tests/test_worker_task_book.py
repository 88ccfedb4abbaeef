"""The worker's TaskBook: units start only on env slots leased envs leave free,
and reach the VecWorker in blocks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._tasks import BLOCK_SHARE, EpisodeTask, TaskBook
from rlfleet.worker.units import EpisodeUnit, UnitRow
from rlfleet.worker.vec import VecWorker


def test_units_start_only_on_slots_leases_leave_free_and_on_one_at_least() -> None:
    vec = VecWorker(n_envs=4, env=EnvConfig("CartPole-v1"))
    leased = [3]
    book = TaskBook(vec, lambda: leased[0])
    units = UnitColumns(np.arange(8), np.arange(8), np.arange(8))
    book.add(EpisodeTask(task_id=1, request_id=1, agent_version=-1, env_generation=0), units)
    assert vec.active_count + vec.queued_count == 1  # 4 slots, 3 leased
    assert book.queued_units == 8  # none started yet: 7 wait here, 1 in the VecWorker
    leased[0] = 4  # every slot leased: the unit it runs still finishes, no more start
    book.feed()
    assert vec.active_count + vec.queued_count == 1
    leased[0] = 1  # a lease released: three slots sample
    book.feed()
    assert vec.active_count + vec.queued_count == 3
    vec.shutdown()


def _native_book(n_envs: int, leased: list[int]) -> tuple[VecWorker, TaskBook]:
    env = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
    vec = VecWorker(n_envs=n_envs, env=env, policy="mlp-categorical")
    book = TaskBook(vec, lambda: leased[0])
    units = UnitColumns.seeded(0, 0, np.arange(400))
    book.add(EpisodeTask(task_id=5, request_id=1, agent_version=-1, env_generation=0), units)
    return vec, book


def test_units_reach_the_vec_worker_in_blocks_not_at_every_vector_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vec, book = _native_book(16, [0])
    assert vec.queued_count == 16 + 16 // BLOCK_SHARE  # every slot, and as many again
    hand_offs: list[int] = []
    submit = vec.submit_rows

    def counted(units: list[UnitRow]) -> None:
        hand_offs.append(len(units))
        submit(units)

    monkeypatch.setattr(vec, "submit_rows", counted)
    vector_steps = 0
    while sum(hand_offs) < 40:  # as the session steps: feed, then one vector step
        book.feed()
        assert vec.active_count + vec.queued_count >= 16  # no slot waits for a unit
        vec.step()
        vector_steps += 1
    # Episodes end about one per vector step here; a hand-off of a slot's worth
    # of units and more serves ten vector steps and more.
    assert all(count >= 16 // BLOCK_SHARE for count in hand_offs)
    assert len(hand_offs) * 10 <= vector_steps
    vec.shutdown()


def test_a_lease_takes_back_the_units_queued_beyond_the_slots_it_leaves_free() -> None:
    leased = [0]
    vec, book = _native_book(16, leased)
    vec.step()  # 16 episodes start
    queued_before = [unit.episode_index for unit in vec._units.queue]
    assert queued_before == list(range(16, 32))  # the block beyond the 16 running
    leased[0] = 10
    book.feed()
    # The queued units come back; the episodes running go on to their end.
    assert vec.queued_count == 0 and vec.active_count == 16
    assert book.queued_units == 400 - 16
    leased[0] = 0
    while not vec.queued_count:  # the lease released: a block again once a slot frees
        vec.step()
        book.feed()
    queued = [unit.episode_index for unit in vec._units.queue]
    started = 400 - book.queued_units  # queued_units counts the VecWorker's too
    assert queued == list(range(started, started + len(queued)))  # the same order as before
    vec.shutdown()


def test_leaving_drops_the_units_the_vec_worker_has_not_started() -> None:
    vec, book = _native_book(16, [0])
    vec.step()
    assert vec.queued_count
    book.drop_unstarted()
    assert vec.queued_count == 0 and book.queued_units == 0
    assert vec.active_count == 16  # the running episodes go on
    vec.shutdown()


def test_a_cancel_drops_the_units_of_a_block_the_vec_worker_holds_and_none_of_them_runs() -> None:
    vec, book = _native_book(16, [0])
    vec.step()  # 16 episodes start; the block's next 16 wait in the VecWorker
    queued = [unit.episode_index for unit in vec._units.queue]
    assert queued == list(range(16, 32))
    book.cancel(5, queued[::2])  # the coordinator moves every other one elsewhere
    assert [unit.episode_index for unit in vec._units.queue] == queued[1::2]
    ran: set[int] = set()
    while len(ran) < 40:  # the next step takes the cancelled units' places at once
        vec.step()
        book.feed()
        ran.update(unit.episode_index for _, unit in vec._engine.running_units())
    assert not ran & set(queued[::2])
    assert set(queued[1::2]) <= ran
    vec.shutdown()


@pytest.mark.parametrize(
    "build", [EpisodeUnit.many, UnitRow.many], ids=["EpisodeUnit.many", "UnitRow.many"]
)
def test_a_tasks_units_are_checked_once_and_equal_units_built_one_by_one(
    build: Callable[[UnitColumns, int], list[EpisodeUnit] | list[UnitRow]],
) -> None:
    """``UnitRow.many`` (the in-process sampler's units) and ``EpisodeUnit.many``
    check columns once, refuse what the constructor refuses, and hold its units."""
    rows = [(k, 1000 + k, 2**32 - 1 - k) for k in range(50)]
    units = build(UnitColumns.of_rows(rows), 7)
    assert [(u.episode_index, u.env_seed, u.policy_seed, u.request) for u in units] == [
        (k, e, p, 7) for k, e, p in rows
    ]
    assert build(UnitColumns.of_rows([]), 7) == []
    # What a hostile or broken coordinator could send is refused as the
    # constructor refuses it, naming the field.
    bad: dict[str, list[tuple[int, int, int]]] = {
        "episode_index must be an int >= 0, got -1": [(0, 1, 2), (-1, 1, 2)],
        "env_seed must fit in 32 bits": [(0, 2**32, 2)],
    }
    for message, bad_rows in bad.items():
        with pytest.raises(ConfigError, match=message):
            build(UnitColumns.of_rows(bad_rows), 7)
    with pytest.raises(ConfigError, match="request must be an int >= 0"):
        build(UnitColumns.of_rows([(0, 1, 2)]), -3)
