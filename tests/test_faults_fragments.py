"""Fragments under faults: long windows, bounded windows.

Issue 12.3 (a worker stepping a long fragment window used to send no
heartbeats, and fragment_length had no bound). Real coordinator and worker
processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, InvalidArgumentError
from rlfleet.local_sampler import LocalSampler
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import TEST_ENVS_MODULE, ProcessFleet, env_flags

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
