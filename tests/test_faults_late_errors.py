"""A worker's error is charged only to the task or update it belongs to.

Issue 12.2: with two workers, a broken policy or env makes both fail; the
request ends on the first error, and the second arrives after it ended.
That late error used to count as the refusal of the learner's next, valid
update, and the fleet rolled back to the broken state (2-3 runs in 10).
Real coordinator and worker processes; each sequence runs 20 times.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.envs import EnvConfig
from rlfleet.errors import EnvError, PolicyError
from rlfleet.policies import PolicySpec
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import TEST_ENVS_MODULE, ProcessFleet, env_flags, local_episodes

pytestmark = pytest.mark.timeout(300)

SEED = 12
ROUNDS = 20
CARTPOLE = EnvConfig("CartPole-v1")
COUNTER = EnvConfig("rlfleet/Counter-v0", {"length": 3}, imports=(TEST_ENVS_MODULE,))
#: Crashes in the first step of every episode; workers get no restarts.
CRASHING = EnvConfig("rlfleet/Crashing-v0", {"crash_at_step": 1}, imports=(TEST_ENVS_MODULE,))
BAD_POLICY = PolicySpec("tests.fixtures.fault_policies:BadActionPolicy", {"fault": "range"})
VERSION = ("worker", "agent_version")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def test_a_late_error_of_a_broken_policy_is_not_charged_to_the_next_update(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator()
    for _ in range(2):
        fleet.start_worker(imports=["tests.fixtures.fault_policies"], envs=2)
    fleet.wait_for_workers(2)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    expected = local_episodes(CARTPOLE, *[4] * ROUNDS, seed=SEED, policy="random")
    for round_ in range(ROUNDS):
        sampler.update_agent(BAD_POLICY)
        with pytest.raises(PolicyError, match="BadActionPolicy"):
            sampler.obtain_episodes(8)  # both workers fail; the request ends on the first
        sampler.update_agent("random")  # must not be refused by the other's late error
        # A failed request does not count: the next one gets request index `round_`.
        assert_same_batch(sampler.obtain_episodes(4), expected[round_], skip_infos=VERSION)


def test_a_late_error_of_a_broken_env_is_not_charged_to_the_next_update(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator(*env_flags(COUNTER))
    for _ in range(2):
        fleet.start_worker("--env-restarts", "0", imports=[TEST_ENVS_MODULE], envs=2)
    fleet.wait_for_workers(2)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    expected = local_episodes(COUNTER, *[4] * ROUNDS, seed=SEED, policy="random")
    for round_ in range(ROUNDS):
        sampler.update_env(CRASHING)
        with pytest.raises(EnvError, match="crashed on purpose"):
            sampler.obtain_episodes(8)
        sampler.update_env(COUNTER)  # must not be rolled back to the crashing env
        assert_same_batch(sampler.obtain_episodes(4), expected[round_], skip_infos=VERSION)
