"""The worker's TaskBook: units start only on env slots leased envs leave free."""

from __future__ import annotations

from rlfleet.envs import EnvConfig
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.units import EpisodeUnit
from rlfleet.worker.vec import VecWorker


def test_units_start_only_on_slots_leases_leave_free_and_on_one_at_least() -> None:
    vec = VecWorker(n_envs=4, env=EnvConfig("CartPole-v1"))
    leased = [3]
    book = TaskBook(vec, lambda: leased[0])
    units = [EpisodeUnit(k, env_seed=k, policy_seed=k, request=1) for k in range(8)]
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
