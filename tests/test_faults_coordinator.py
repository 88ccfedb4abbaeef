"""No workers, a coordinator that crashes and restarts, a coordinator that drains.

Guarantees 2, 3 and 4 (coordinator side) of docs/reliability.md, against
real coordinator and worker processes and the client library.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import NoWorkersError, UnavailableError
from rlfleet.policies import MLPCategoricalPolicy
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    Proc,
    ProcessFleet,
    env_flags,
    local_episodes,
    run_in_thread,
)

pytestmark = pytest.mark.timeout(240)

SEED = 34
#: WorkerConfig.reconnect_base_seconds, and the cap the tests give workers.
BACKOFF_BASE, BACKOFF_CAP = 0.1, 1.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: Agent versions count updates per coordinator; LocalSampler's stay 0.
VERSION = ("worker", "agent_version")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def expected_episodes(env: EnvConfig, *counts: int) -> list[EpisodeBatch]:
    """LocalSampler's answers to successive ``obtain_episodes(n)`` calls with SEED."""
    return local_episodes(env, *counts, seed=SEED)


# --- 2. no workers ----------------------------------------------------------------------


def test_a_request_without_workers_fails_at_its_deadline_saying_what_to_do(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator()
    sampler = fleet.sampler(seed=SEED, timeout=120, wait_for_workers=1.5)
    for call in (lambda: sampler.obtain_samples(0, 100), lambda: sampler.obtain_exact_episodes(1)):
        with pytest.raises(NoWorkersError) as failure:
            run_in_thread(call)(60)  # never hangs
        message = str(failure.value)
        assert "1.5 seconds" in message, message
        assert "rlfleet worker --coordinator" in message, message
    assert sampler.requests_made == 0  # a retry gets the same seeds


def test_a_worker_that_joins_mid_request_is_used_at_once(fleet: ProcessFleet) -> None:
    fleet.start_coordinator()
    sampler = fleet.sampler(seed=SEED, timeout=120, wait_for_workers=60)
    pending = run_in_thread(lambda: sampler.obtain_episodes(5))
    fleet.wait_until(lambda: fleet.status().requests_in_flight == 1, what="a waiting request")
    fleet.start_worker()
    (expected,) = expected_episodes(EnvConfig("CartPole-v1"), 5)
    assert_same_batch(pending(120), expected)


# --- 3. coordinator crash and restart ---------------------------------------------------


def reconnect_delays(worker: Proc) -> list[tuple[int, float]]:
    """(attempt, delay) of every reconnect the worker logged, in order."""
    found = re.findall(r"reconnecting in ([0-9.]+) s \(attempt (\d+)\)", worker.log_text())
    return [(int(attempt), float(delay)) for delay, attempt in found]


def test_after_a_coordinator_crash_only_the_request_in_flight_fails(fleet: ProcessFleet) -> None:
    fleet.start_coordinator(*env_flags(SLOW_ENV))
    workers = [fleet.start_worker(imports=[TEST_ENVS_MODULE]) for _ in range(2)]
    before = fleet.wait_for_workers(2)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    policy = MLPCategoricalPolicy(SLOW_ENV_TWIN.env_spec(), hidden_sizes=[4], seed=3)
    sampler.update_agent(policy)
    first, second, third = local_episodes(SLOW_ENV_TWIN, 4, 30, 4, seed=SEED, policy=policy)
    assert_same_batch(sampler.obtain_episodes(4), first, skip_infos=VERSION)

    crashed = run_in_thread(lambda: sampler.obtain_episodes(30))
    fleet.wait_until(fleet.busy, what="the request on the workers")
    fleet.kill(fleet.coordinator)
    with pytest.raises(UnavailableError) as failure:
        crashed(60)
    assert failure.value.retryable is True
    assert "retry" in str(failure.value)
    # The workers keep trying while it is down (a few attempts each)...
    for worker in workers:
        fleet.wait_for_log(worker, "(attempt 3)")
        assert worker.alive

    fleet.start_coordinator(*env_flags(SLOW_ENV))  # same port, fresh state
    fleet.wait_for_workers(2, coordinator_id=before.coordinator_id)
    # ...and the same sampler retries the failed request: same seeds, same
    # policy (the sampler restores the agent it pushed), same batch.
    assert_same_batch(sampler.obtain_episodes(30), second, skip_infos=VERSION)
    # A training loop's parameter-only update works on the new coordinator too.
    batch = sampler.obtain_episodes(4, agent_update=policy.get_param_values())
    assert_same_batch(batch, third, skip_infos=VERSION)
    assert sampler.requests_made == 3

    # Exponential backoff with full jitter: attempt n waits up to
    # min(cap, base * 2**(n-1)), numbered from 1 after each success.
    sequences = []
    for worker in workers:
        delays = reconnect_delays(worker)
        assert [a for a, _ in delays][:3] == [1, 2, 3], delays
        for attempt, delay in delays:
            assert 0 <= delay <= min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempt - 1)) + 0.005
        sequences.append([d for _, d in delays[:3]])
    assert sequences[0] != sequences[1], "two workers backed off in lockstep: no jitter"


# --- 4. graceful drain of the coordinator -----------------------------------------------


def test_sigterm_drains_the_coordinator(fleet: ProcessFleet) -> None:
    coordinator = fleet.start_coordinator(*env_flags(SLOW_ENV), "--drain-grace", "60")
    workers = [fleet.start_worker(imports=[TEST_ENVS_MODULE], envs=2) for _ in range(2)]
    fleet.wait_for_workers(2)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    in_flight = run_in_thread(lambda: sampler.obtain_episodes(24))
    fleet.wait_until(fleet.busy, what="the request on the workers")

    fleet.signal(coordinator, signal.SIGTERM)  # Kubernetes preemption
    fleet.wait_until(lambda: fleet.health() == NOT_SERVING, what="health NOT_SERVING")
    assert fleet.status().draining
    with pytest.raises(UnavailableError, match="draining") as refused:
        fleet.sampler(timeout=30).obtain_episodes(1)
    assert refused.value.retryable is True

    (expected,) = expected_episodes(SLOW_ENV_TWIN, 24)
    assert_same_batch(in_flight(120), expected)  # finished, not cut short
    assert coordinator.popen.wait(timeout=60) == 0
    for worker in workers:
        fleet.wait_for_log(worker, "coordinator drains this worker")
        assert worker.alive  # drained workers wait for the replacement


def test_a_drain_ends_requests_that_outlast_the_grace(fleet: ProcessFleet) -> None:
    # The grace comes from the environment, as a Kubernetes ConfigMap sets it.
    coordinator = fleet.start_coordinator(*env_flags(SLOW_ENV), env={"RLFLEET_DRAIN_GRACE": "1"})
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    too_long = run_in_thread(lambda: sampler.obtain_episodes(200))  # ~40 s of episodes
    fleet.wait_until(fleet.busy, what="the request on the worker")

    fleet.signal(coordinator, signal.SIGTERM)
    with pytest.raises(UnavailableError) as failure:
        too_long(60)
    assert failure.value.retryable is True
    assert coordinator.popen.wait(timeout=60) == 0
    assert "draining" in coordinator.log_text()


def test_a_coordinator_restarted_while_the_learner_is_idle_is_noticed(
    fleet: ProcessFleet,
) -> None:
    # Issue 12.1: a restart between two requests (no call failed) used to go
    # unnoticed: the next answer came from the coordinator's default env and
    # the random policy, labelled with the learner's agent version.
    fleet.start_coordinator()  # its own env is CartPole
    fleet.start_worker()
    before = fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    acrobot = EnvConfig("Acrobot-v1", max_episode_length=20)
    sampler.update_env(acrobot)
    policy = MLPCategoricalPolicy(acrobot.env_spec(), hidden_sizes=[4], seed=3)
    sampler.update_agent(policy)
    first, second, third = local_episodes(acrobot, 2, 3, 2, seed=SEED, policy=policy)
    assert_same_batch(sampler.obtain_episodes(2), first, skip_infos=VERSION)

    fleet.kill(fleet.coordinator)
    fleet.start_coordinator()  # same port, fresh state: CartPole, random policy
    fleet.wait_for_workers(1, coordinator_id=before.coordinator_id)
    assert_same_batch(sampler.obtain_episodes(3), second, skip_infos=VERSION)
    assert sampler.env_spec.observation_space.shape == (6,)  # Acrobot's, not CartPole's

    # A params-only update right after another restart works too.
    status = fleet.status()
    fleet.kill(fleet.coordinator)
    fleet.start_coordinator()
    fleet.wait_for_workers(1, coordinator_id=status.coordinator_id)
    sampler.update_agent(policy.get_param_values())
    assert_same_batch(sampler.obtain_episodes(2), third, skip_infos=VERSION)


def test_agent_versions_go_on_across_a_coordinator_restart(fleet: ProcessFleet) -> None:
    # The sampler restores its agent on the new coordinator naming the version
    # it had: episodes keep saying that version, and the next update is the
    # one after it, never back to 1.
    fleet.start_coordinator()
    fleet.start_worker()
    before = fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    env = EnvConfig("CartPole-v1")
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=[4], seed=3)
    for _ in range(3):
        sampler.update_agent(policy)
    assert set(sampler.obtain_episodes(2).episode_infos["agent_version"].tolist()) == {3}

    fleet.kill(fleet.coordinator)
    fleet.start_coordinator()
    fleet.wait_for_workers(1, coordinator_id=before.coordinator_id)
    again = sampler.obtain_episodes(2)
    assert set(again.episode_infos["agent_version"].tolist()) == {3}
    assert fleet.status().agent_version == 3
    assert sampler.update_agent(policy.get_param_values()) == 4

    # Restored together with a new update: the version after the last one.
    status = fleet.status()
    fleet.kill(fleet.coordinator)
    fleet.start_coordinator()
    fleet.wait_for_workers(1, coordinator_id=status.coordinator_id)
    assert sampler.update_agent(policy.get_param_values()) == 5
