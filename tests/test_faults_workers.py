"""Workers die, freeze, hang or leave mid-request: nothing lost, duplicated or stale.

Guarantees 1 and 4 (worker side) of docs/reliability.md, against real
coordinator and worker processes. With a seed, every answer must equal
LocalSampler's bit for bit (all fields but ``episode_infos["worker"]``),
which rules out a lost, partial, repeated or stale episode at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from tests._coordinator_fakes import Answer, assert_same_batch, sample
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    ProcessFleet,
    env_flags,
    local_episodes,
    run_in_thread,
)

pytestmark = pytest.mark.timeout(240)

SEED = 21
EPISODES = 2  # SAMPLE_MODE_EPISODES


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def expected_episodes(env: EnvConfig, n: int) -> EpisodeBatch:
    """LocalSampler's answer to a first ``obtain_episodes(n)`` with SEED."""
    return local_episodes(env, n, seed=SEED)[0]


def removal_reason(coordinator_log: str, name: str) -> str:
    """Why the coordinator removed a worker, from its log line."""
    match = re.search(rf"worker '{re.escape(name)}' removed \(([^)]*)\)", coordinator_log)
    assert match, f"the coordinator never removed {name!r}:\n{coordinator_log[-3000:]}"
    return match.group(1)


def test_a_worker_killed_mid_request_loses_nothing(fleet: ProcessFleet) -> None:
    fleet.start_coordinator(*env_flags(SLOW_ENV))
    for _ in range(3):
        fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(3)
    victim = fleet.workers[0]

    answer = run_in_thread(
        lambda: sample(fleet.address, mode=EPISODES, amount=24, seed=SEED, request_index=0)
    )
    fleet.wait_until(lambda: fleet.units_on(victim.name), what="units on the victim")
    fleet.kill(victim)  # a preempted machine: no goodbye, the stream breaks
    result: Answer = answer(120)

    assert_same_batch(result.batch, expected_episodes(SLOW_ENV_TWIN, 24))
    assert result.footer.num_episodes == 24
    assert result.footer.reassigned_units >= 1
    # Noticed by its stream breaking (long before the 3 s heartbeat timeout).
    assert "stream broke" in removal_reason(fleet.coordinator.log_text(), victim.name)
    # The fleet goes on with the others.
    with fleet.sampler(seed=SEED, timeout=120) as sampler:
        assert_same_batch(sampler.obtain_episodes(6), expected_episodes(SLOW_ENV_TWIN, 6))


def test_a_frozen_worker_is_declared_dead_and_its_episodes_rerun(fleet: ProcessFleet) -> None:
    cartpole = EnvConfig("CartPole-v1")
    fleet.start_coordinator()
    frozen, _ = fleet.start_worker(), fleet.start_worker()
    fleet.wait_for_workers(2)
    # Connected but silent: its TCP connection stays up, only heartbeats stop.
    fleet.freeze(frozen)
    answer = run_in_thread(
        lambda: sample(fleet.address, mode=EPISODES, amount=10, seed=SEED, request_index=0)
    )
    fleet.wait_until(lambda: fleet.units_on(frozen.name), what="units on the frozen worker")
    result: Answer = answer(120)

    assert_same_batch(result.batch, expected_episodes(cartpole, 10))
    assert result.footer.reassigned_units >= 1
    assert "heartbeat timeout" in removal_reason(fleet.coordinator.log_text(), frozen.name)

    # Thawed, it finds its call ended, rejoins as a new worker, and whatever
    # it still held is ignored: the next answer is exact again.
    fleet.thaw(frozen)
    fleet.wait_for_workers(2)
    with fleet.sampler(seed=SEED, timeout=120) as sampler:
        first, second = local_episodes(cartpole, 10, 10, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(10), first)
        assert_same_batch(sampler.obtain_episodes(10), second)


def test_an_update_does_not_wait_for_a_frozen_worker(fleet: ProcessFleet) -> None:
    cartpole = EnvConfig("CartPole-v1")
    fleet.start_coordinator()
    frozen, _ = fleet.start_worker(), fleet.start_worker()
    fleet.wait_for_workers(2)
    fleet.freeze(frozen)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    policy = MLPCategoricalPolicy(cartpole.env_spec(), hidden_sizes=[4], seed=3)
    # Applied by the live worker; the frozen one stops counting once it is
    # declared dead, long before the 120 s update timeout.
    version = run_in_thread(lambda: sampler.update_agent(policy))(60)
    assert version == 1
    (expected,) = local_episodes(cartpole, 6, seed=SEED, policy=policy)
    assert_same_batch(sampler.obtain_episodes(6), expected, skip_infos=("worker", "agent_version"))


def test_a_worker_stuck_in_env_step_is_declared_dead(fleet: ProcessFleet) -> None:
    # Each env instance works for 10 steps (two 5-step episodes), then hangs
    # forever in its next reset: the worker stays connected (gRPC answers
    # keepalive pings from its own threads) but its main loop sends no
    # heartbeat any more.
    hanging = EnvConfig("rlfleet/Hanging-v0", {"hang_in": "reset", "hang_at_step": 10, "length": 5})
    fleet.start_coordinator(*env_flags(hanging))
    stuck = fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(1)
    answer = run_in_thread(
        lambda: sample(
            fleet.address,
            mode=EPISODES,
            amount=6,
            seed=SEED,
            request_index=0,
            wait_for_workers_seconds=60,
        )
    )
    log = fleet.wait_for_log(fleet.coordinator, f"worker '{stuck.name}' removed")
    assert "heartbeat timeout" in removal_reason(log, stuck.name)
    assert stuck.alive  # stuck, not dead: only heartbeats could tell
    # Its units wait for another worker; four fresh envs cannot hang on 6 episodes.
    fleet.start_worker(envs=4, imports=[TEST_ENVS_MODULE])
    result: Answer = answer(120)

    assert_same_batch(result.batch, expected_episodes(SLOW_ENV_TWIN, 6))
    assert result.footer.reassigned_units >= 1


def test_sigterm_makes_a_worker_leave_without_losing_episodes(fleet: ProcessFleet) -> None:
    fleet.start_coordinator(*env_flags(SLOW_ENV))
    leaving = fleet.start_worker(imports=[TEST_ENVS_MODULE], envs=2)
    fleet.start_worker(imports=[TEST_ENVS_MODULE], envs=2)
    fleet.wait_for_workers(2)
    answer = run_in_thread(
        lambda: sample(fleet.address, mode=EPISODES, amount=24, seed=SEED, request_index=0)
    )
    fleet.wait_until(lambda: fleet.units_on(leaving.name), what="units on the leaving worker")
    # Kubernetes preemption: SIGTERM, then the grace period.
    assert fleet.terminate(leaving, timeout=60) == 0
    result: Answer = answer(120)

    assert_same_batch(result.batch, expected_episodes(SLOW_ENV_TWIN, 24))
    coordinator_log = fleet.coordinator.log_text()
    assert f"worker '{leaving.name}' is leaving" in coordinator_log
    # It closed its stream itself: nothing broke and no heartbeat was missed.
    assert "closed its stream" in removal_reason(coordinator_log, leaving.name)
    assert [w.name for w in fleet.status().workers] == [fleet.workers[1].name]
