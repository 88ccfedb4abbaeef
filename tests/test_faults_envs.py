"""Envs that raise: recreated within a restart budget, then a precise error.

Guarantee 5 of docs/reliability.md, against real coordinator and worker
processes (the budget is set on the worker's command line).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from rlfleet.envs import EnvConfig
from rlfleet.errors import EnvError
from rlfleet.sampling.local import LocalSampler
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

SEED = 55
EPISODES = 2  # SAMPLE_MODE_EPISODES


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def test_an_env_that_crashes_now_and_then_is_recreated_and_its_episode_rerun(
    fleet: ProcessFleet,
) -> None:
    # Each env instance raises in the reset after its 7th step: with 3-step
    # episodes, in the reset of every 4th episode it runs, then again after
    # 3 more. 8 episodes on one env: crashes in the resets of episodes 3 and 6.
    crashing = EnvConfig(
        "rlfleet/Crashing-v0", {"crash_in": "reset", "crash_at_step": 7, "length": 3}
    )
    fleet.start_coordinator(*env_flags(crashing))
    worker = fleet.start_worker(
        "--env-restarts", "5", "--env-restart-window", "60", imports=[TEST_ENVS_MODULE]
    )
    fleet.wait_for_workers(1)
    with fleet.sampler(seed=SEED, timeout=120) as sampler:
        batch = sampler.obtain_episodes(8)
    twin = EnvConfig("rlfleet/Counter-v0", {"length": 3}, imports=(TEST_ENVS_MODULE,))
    with LocalSampler(twin, seed=SEED) as local:
        assert_same_batch(batch, local.obtain_episodes(8))
    log = worker.log_text()
    assert log.count("rebuilding it and re-running") == 2, log


@pytest.mark.parametrize(
    ("call", "kwargs", "step"),
    [
        ("step", {"crash_in": "step", "crash_at_step": 2, "length": 4}, 2),
        ("reset", {"crash_in": "reset", "crash_at_step": 0}, 0),
    ],
)
def test_past_its_restart_budget_the_learner_gets_where_and_why(
    fleet: ProcessFleet, call: str, kwargs: dict[str, object], step: int
) -> None:
    crashing = EnvConfig("rlfleet/Crashing-v0", kwargs)
    fleet.start_coordinator(*env_flags(crashing))
    fleet.start_worker(
        "--env-restarts", "2", "--env-restart-window", "60", imports=[TEST_ENVS_MODULE]
    )
    fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    with pytest.raises(EnvError) as failure:
        sampler.obtain_episodes(3)
    error = failure.value
    assert (error.worker, error.env_index, error.step) == ("w0", 0, step)
    assert error.remote_traceback is not None
    assert f"RuntimeError: rlfleet/Crashing-v0 crashed on purpose in {call}" in (
        error.remote_traceback
    )
    assert "restart budget spent" in str(error)
    assert "2 of 2 per 60s" in str(error)  # the budget from the command line

    # The worker is still there and takes the next env at once.
    counter = EnvConfig("rlfleet/Counter-v0", {"length": 4}, imports=(TEST_ENVS_MODULE,))
    sampler.update_env(counter)
    batch = sampler.obtain_episodes(3)
    with LocalSampler(counter, seed=SEED) as local:
        assert_same_batch(batch, local.obtain_episodes(3))


def test_the_lifetime_limit_holds_however_slow_the_crashes(fleet: ProcessFleet) -> None:
    # Rate limit generous, lifetime limit 1: the second crash is one too many.
    crashing = EnvConfig(
        "rlfleet/Crashing-v0", {"crash_in": "reset", "crash_at_step": 3, "length": 3}
    )
    fleet.start_coordinator(*env_flags(crashing))
    fleet.start_worker(
        "--env-restarts",
        "100",
        "--env-restart-window",
        "1",
        "--env-restarts-total",
        "1",
        imports=[TEST_ENVS_MODULE],
    )
    fleet.wait_for_workers(1)
    with fleet.sampler(seed=SEED, timeout=120) as sampler, pytest.raises(EnvError) as failure:
        sampler.obtain_episodes(4)
    assert "1 of 1 in total" in str(failure.value)


def env_children(pid: int) -> list[int]:
    """The env child processes (``spawn`` children) of a worker process."""
    children = psutil.Process(pid).children()
    return [child.pid for child in children if "spawn_main" in " ".join(child.cmdline())]


def test_an_env_child_killed_in_a_worker_process_is_rebuilt_and_nothing_is_lost(
    fleet: ProcessFleet,
) -> None:
    """``--env-vectorization subprocess``: SIGKILL one env's child mid-request."""
    fleet.start_coordinator(*env_flags(SLOW_ENV), "--env-vectorization", "subprocess")
    worker = fleet.start_worker(envs=2, imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(1)
    fleet.wait_until(lambda: len(env_children(worker.pid)) == 2, what="two env children")
    victim = env_children(worker.pid)[0]
    answer = run_in_thread(
        lambda: sample(fleet.address, mode=EPISODES, amount=8, seed=SEED, request_index=0)
    )
    fleet.wait_until(lambda: fleet.units_on(worker.name), what="units on the worker")
    os.kill(victim, signal.SIGKILL)
    result: Answer = answer(120)
    # The same episodes as in-process envs give: none lost, none twice.
    assert_same_batch(result.batch, local_episodes(SLOW_ENV_TWIN, 8, seed=SEED)[0])
    assert victim not in env_children(worker.pid) and len(env_children(worker.pid)) == 2
    log = worker.log_text()
    assert log.count("rebuilding it and re-running") == 1 and "killed by SIGKILL" in log, log
