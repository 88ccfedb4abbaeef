"""The worker's TaskBook: units start only on env slots leased envs leave free."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.units import EpisodeUnit
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


def test_a_tasks_units_are_checked_once_and_equal_units_built_one_by_one() -> None:
    rows = [(k, 1000 + k, 2**32 - 1 - k) for k in range(50)]
    units = EpisodeUnit.many(UnitColumns.of_rows(rows), 7)
    assert units == [EpisodeUnit(k, e, p, 7) for k, e, p in rows]
    assert EpisodeUnit.many(UnitColumns.of_rows([]), 7) == []
    # What a hostile or broken coordinator could send is refused as the
    # constructor refuses it, naming the field.
    bad: dict[str, list[tuple[int, int, int]]] = {
        "episode_index must be an int >= 0, got -1": [(0, 1, 2), (-1, 1, 2)],
        "env_seed must fit in 32 bits": [(0, 2**32, 2)],
    }
    for message, bad_rows in bad.items():
        with pytest.raises(ConfigError, match=message):
            EpisodeUnit.many(UnitColumns.of_rows(bad_rows), 7)
    with pytest.raises(ConfigError, match="request must be an int >= 0"):
        EpisodeUnit.many(UnitColumns.of_rows([(0, 1, 2)]), -3)
