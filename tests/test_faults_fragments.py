"""Fragments under faults: long windows, bounded windows, killed workers.

Issue 12.3 (a worker stepping a long fragment window used to send no
heartbeats, and fragment_length had no bound) and 12.6 (a worker killed
mid-request used to change the answer). Real coordinator and worker
processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, InvalidArgumentError, UnavailableError
from rlfleet.sampling.local import LocalSampler
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import TEST_ENVS_MODULE, ProcessFleet, env_flags, run_in_thread

pytestmark = pytest.mark.timeout(240)

SEED = 61
#: 10 ms per step: a 400-step window lasts 4 s, past the tests' 3 s heartbeat timeout.
SLOW = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 0.01, "length": 150})
SLOW_TWIN = EnvConfig("rlfleet/Counter-v0", {"length": 150}, imports=(TEST_ENVS_MODULE,))
WINDOW = 400
VERSION = ("worker", "agent_version")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def test_a_worker_heartbeats_while_it_steps_a_window_longer_than_the_timeout(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator(*env_flags(SLOW))  # heartbeat timeout 3 s
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    before = fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=60)
    with LocalSampler(SLOW_TWIN, seed=SEED) as local:
        expected = [local.obtain_fragments(WINDOW, WINDOW) for _ in range(2)]
    for want in expected:
        assert_same_batch(sampler.obtain_fragments(WINDOW, WINDOW), want, skip_infos=VERSION)
    after = fleet.status()
    # Never declared dead: the same worker answered both windows.
    assert [w.worker_id for w in after.workers] == [w.worker_id for w in before.workers]


def test_fragment_length_is_bounded_with_an_error_naming_the_limit(fleet: ProcessFleet) -> None:
    fleet.start_coordinator("--max-fragment-length", "1000")
    fleet.start_worker()
    fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    with pytest.raises(InvalidArgumentError) as refused:
        sampler.obtain_fragments(10**6, 10**6)
    message = str(refused.value)
    assert "fragment_length 1000000" in message, message
    assert "1000" in message and "--max-fragment-length" in message, message
    # The client refuses what the protocol cannot carry before sending it.
    with pytest.raises(ConfigError, match="fragment_length"):
        sampler.obtain_fragments(100, 2**32)
    assert sampler.obtain_fragments(20, 10).total_steps == 20  # the fleet goes on


def test_a_worker_killed_mid_fragments_request_changes_no_answer(fleet: ProcessFleet) -> None:
    """Issue 12.6: whatever dies, every fragments answer is the undisturbed one.

    Two real workers, one SIGKILLed while it steps its second window. The
    survivor takes over the dead worker's stream (same id, its episode
    rebuilt by replaying reset(seed) and the delivered actions): that
    answer, the next one (the survivor runs both streams) and the one after
    a replacement worker joined (it adopts the orphaned stream) equal an
    undisturbed run's, bit for bit but for the ``worker`` info.
    """
    length, amount = 50, 200  # 0.5 s windows; two rounds of both streams
    fleet.start_coordinator(*env_flags(SLOW))
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(2)
    victim = fleet.workers[0]
    with LocalSampler(SLOW_TWIN, seed=SEED, n_workers=2) as local:
        undisturbed = [local.obtain_fragments(amount, length) for _ in range(3)]
    sampler = fleet.sampler(seed=SEED, timeout=120)
    answer = run_in_thread(lambda: sampler.obtain_fragments(amount, length))
    # Killed in its second window: its stream's episode is mid-way, with a window delivered.
    fleet.wait_until(lambda: fleet.units_on(victim.name) == 1, what="one window left on the victim")
    fleet.kill(victim)
    assert_same_batch(answer(120), undisturbed[0], skip_infos=VERSION)
    assert_same_batch(sampler.obtain_fragments(amount, length), undisturbed[1], skip_infos=VERSION)

    fleet.start_worker(imports=[TEST_ENVS_MODULE])  # the replacement adopts the dead stream
    fleet.wait_for_workers(2)
    last = sampler.obtain_fragments(amount, length)
    assert_same_batch(last, undisturbed[2], skip_infos=VERSION)
    assert len(set(last.episode_infos["worker"].tolist())) == 2  # both workers ran a stream


def test_a_worker_frozen_mid_fragments_request_is_dropped_and_changes_no_answer(
    fleet: ProcessFleet,
) -> None:
    """A SIGSTOPped worker is dropped at the heartbeat timeout; its stream is taken over.

    When it wakes it rejoins as a new worker and adopts its old stream back
    (rebuilt from a replay): both answers equal the undisturbed ones.
    """
    length, amount = 50, 200
    fleet.start_coordinator(*env_flags(SLOW))  # heartbeat timeout 3 s
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    before = fleet.wait_for_workers(2)
    victim = fleet.workers[0]
    with LocalSampler(SLOW_TWIN, seed=SEED, n_workers=2) as local:
        undisturbed = [local.obtain_fragments(amount, length) for _ in range(2)]
    sampler = fleet.sampler(seed=SEED, timeout=120)
    answer = run_in_thread(lambda: sampler.obtain_fragments(amount, length))
    fleet.wait_until(lambda: fleet.units_on(victim.name) == 1, what="one window left on the victim")
    fleet.freeze(victim)
    assert_same_batch(answer(120), undisturbed[0], skip_infos=VERSION)
    fleet.thaw(victim)
    fleet.wait_until(
        lambda: (
            {w.worker_id for w in fleet.wait_for_workers(2).workers}
            != {w.worker_id for w in before.workers}
        ),
        what="the woken worker to rejoin",
    )
    last = sampler.obtain_fragments(amount, length)
    assert_same_batch(last, undisturbed[1], skip_infos=VERSION)
    assert len(set(last.episode_infos["worker"].tolist())) == 2  # it runs its stream again


def test_a_fragments_request_retried_after_a_coordinator_crash_starts_the_streams_over(
    fleet: ProcessFleet,
) -> None:
    """The coordinator keeps its stream book in memory: after a restart, streams start over.

    The retried request is whole and equals what an undisturbed new fleet
    answers first (every stream from its first episode), not the
    continuation the crashed coordinator would have given.
    """
    length, amount = 50, 200
    fleet.start_coordinator(*env_flags(SLOW))
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    before = fleet.wait_for_workers(2)
    with LocalSampler(SLOW_TWIN, seed=SEED, n_workers=2) as local:
        first, continuation = (local.obtain_fragments(amount, length) for _ in range(2))
    sampler = fleet.sampler(seed=SEED, timeout=120)
    assert_same_batch(sampler.obtain_fragments(amount, length), first, skip_infos=VERSION)
    crashed = run_in_thread(lambda: sampler.obtain_fragments(amount, length))
    fleet.wait_until(fleet.busy, what="the request on the workers")
    fleet.kill(fleet.coordinator)
    with pytest.raises(UnavailableError):
        crashed(60)
    fleet.start_coordinator(*env_flags(SLOW))  # same port, fresh state
    fleet.wait_for_workers(2, coordinator_id=before.coordinator_id)
    retried = sampler.obtain_fragments(amount, length)
    assert_same_batch(retried, first, skip_infos=VERSION)
    assert not np.array_equal(retried.observations, continuation.observations)
