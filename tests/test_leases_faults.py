"""Env leases under faults, with real processes: killed workers, a killed learner,
hung envs, a fleet whose only worker cannot host leases (the Node worker), and
a coordinator that drains or stops.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.envs import EnvConfig
from rlfleet.errors import NoWorkersError, RlfleetTimeoutError, UnavailableError
from tests._coordinator_fakes import ROOT
from tests.fleet_processes import TEST_ENVS_MODULE, ProcessFleet, env_flags
from tests.node_support import NODE_WORKER, require_node

LOST = "rlfleet_env_lost"
COUNTER = EnvConfig("rlfleet/Counter-v0", {"length": 1000})
#: A Counter slow enough (2 ms a step) that workers step it on their thread pool.
SLOW = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 0.002, "length": 1000})

JS_ENV = "rlfleet/CartPoleJS-v0"  # the env the Node worker implements


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


@pytest.mark.parametrize("env", [COUNTER, SLOW], ids=["inline", "pooled"])
def test_a_dead_workers_envs_move_and_say_so_then_none_left_is_typed(
    fleet: ProcessFleet, env: EnvConfig
) -> None:
    fleet.start_coordinator()
    for _ in range(2):
        fleet.start_worker(envs=4, imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(2)
    with RemoteVectorEnv(fleet.address, env, 4, call_timeout=60) as venv:
        hosts = venv.env_workers
        assert sorted(set(hosts)) == ["w0", "w1"]
        venv.reset(seed=0)
        for _ in range(3):
            venv.step(np.zeros(4, np.int64))
        victim = next(p for p in fleet.workers if p.name == "w0")
        fleet.kill(victim)
        obs, rewards, terminated, truncated, infos = venv.step(np.zeros(4, np.int64))
        lost = [i for i, host in enumerate(hosts) if host == "w0"]
        kept = [i for i in range(4) if i not in lost]
        for i in lost:  # re-created on w1: cut, flagged, and a fresh episode's observation
            assert truncated[i] and not terminated[i] and rewards[i] == 0.0
            assert infos[i][LOST]
            assert obs[i, 0] == 0.0
        assert venv.env_workers == ["w1"] * 4  # the answer names the new host
        for i in kept:  # untouched: the 4th step of their episode
            assert not truncated[i] and LOST not in infos[i]
            assert obs[i, 0] == 4.0
        venv.reset(lost)
        obs, _, _, truncated, infos = venv.step(np.zeros(4, np.int64))
        assert not truncated.any() and not any(LOST in info for info in infos)
        assert obs[lost, 0].tolist() == [1.0] * len(lost)

        fleet.kill(next(p for p in fleet.workers if p.name == "w1"))
        with pytest.raises(NoWorkersError, match="no other worker has free slots"):
            venv.step(np.zeros(4, np.int64))


def test_a_killed_learner_releases_its_leases(fleet: ProcessFleet, tmp_path: Path) -> None:
    fleet.start_coordinator()
    fleet.start_worker(envs=2)
    fleet.wait_for_workers(1)
    script = textwrap.dedent(
        f"""
        import time
        from rlfleet.client import Fleet, RemoteVectorEnv
        venv = RemoteVectorEnv({fleet.address!r}, "CartPole-v1", 2)
        venv.reset(seed=0)
        print("leased", flush=True)
        time.sleep(600)
        """
    )
    learner = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    try:
        assert learner.stdout is not None
        assert learner.stdout.readline().strip() == b"leased"
        # Every slot is leased: another lease cannot open now.
        with pytest.raises(NoWorkersError):
            RemoteVectorEnv(fleet.address, "CartPole-v1", 1, open_timeout=0.5)
        assert (fleet.status().leases, fleet.status().leased_envs) == (1, 2)
        learner.kill()
        learner.wait(30)
        # The coordinator notices the broken stream and releases both envs.
        fleet.wait_until(lambda: fleet.status().leased_envs == 0, what="the lease released")
        with RemoteVectorEnv(fleet.address, "CartPole-v1", 2, open_timeout=30) as venv:
            venv.reset(seed=0)
            venv.step(np.zeros(2, np.int64))
    finally:
        learner.kill()
        learner.wait(30)


def test_a_hung_env_fails_its_call_at_the_deadline(fleet: ProcessFleet) -> None:
    fleet.start_coordinator()
    for _ in range(2):
        fleet.start_worker(envs=1, imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(2)
    hanging = EnvConfig("rlfleet/Hanging-v0", {"hang_at_step": 2})  # every episode's step 2
    with RemoteVectorEnv(fleet.address, hanging, 2, call_timeout=2.0) as venv:
        assert sorted(venv.env_workers) == ["w0", "w1"]
        venv.reset()
        venv.step([0, 0])
        with pytest.raises(RlfleetTimeoutError, match="within 2 seconds"):
            venv.step([0], id=[0])
        # The lease lives on: env 1, on the other worker, still answers...
        venv.reset(id=[1])
        obs, *_ = venv.step([0], id=[1])
        assert obs.tolist() == [[1.0]]
        # ...and env 0 may be called again (superseding the lost call); its
        # worker is still stuck in the hung step, so that fails at the deadline too.
        with pytest.raises(RlfleetTimeoutError):
            venv.reset(id=[0])


def test_no_leases_are_placed_on_a_worker_without_the_capability(fleet: ProcessFleet) -> None:
    node_executable = require_node()
    fleet.start_coordinator(*env_flags(EnvConfig(JS_ENV)))
    node = subprocess.Popen(
        [
            node_executable,
            str(NODE_WORKER),
            "--coordinator",
            fleet.address,
            "--envs",
            "4",
            "--name",
            "node-0",
            "--quiet",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        fleet.wait_for_workers(1)
        with pytest.raises(NoWorkersError, match=r"rlfleet\.leases"):
            RemoteVectorEnv(fleet.address, JS_ENV, 1, open_timeout=1.0)
        fleet.start_worker(envs=2, imports=["rlfleet.envs.cartpole_js"])
        fleet.wait_for_workers(2)
        with RemoteVectorEnv(fleet.address, JS_ENV, 2, open_timeout=30) as venv:
            assert venv.env_workers == ["w0", "w0"]  # never the Node worker
            venv.reset(seed=1)
            venv.step([0, 1])
    finally:
        node.kill()
        node.wait(30)


def test_a_draining_or_stopped_coordinator_ends_leases_with_unavailable() -> None:
    fleet = Fleet.local(workers=1, envs_per_worker=2)
    try:
        first = RemoteVectorEnv(fleet, "CartPole-v1", 1)
        second = RemoteVectorEnv(fleet, "CartPole-v1", 1)
        first.reset(seed=0)
        second.reset(seed=0)
        fleet.server.coordinator.drain()
        with pytest.raises(UnavailableError, match="draining"):
            first.step([0])
        with pytest.raises(UnavailableError, match="draining"):
            RemoteVectorEnv(fleet, "CartPole-v1", 1, open_timeout=5)
        fleet.server.stop()
        with pytest.raises(UnavailableError):
            second.step([0])
        first.close()
        second.close()
    finally:
        fleet.close()


def test_lease_slots_say_how_many_leased_envs_a_worker_hosts(fleet: ProcessFleet) -> None:
    fleet.start_coordinator()
    fleet.start_worker("--lease-slots", "0", envs=2)  # sampling only
    fleet.start_worker("--lease-slots", "3", envs=1)
    fleet.wait_for_workers(2)
    with RemoteVectorEnv(fleet.address, "CartPole-v1", 3) as venv:
        assert venv.env_workers == ["w1"] * 3
        with pytest.raises(NoWorkersError, match="0 free slots"):
            RemoteVectorEnv(fleet.address, "CartPole-v1", 1, open_timeout=0.5)
        venv.reset(seed=0)
        venv.step([0, 1, 0])
        # Sampling goes on beside the leases, on both workers.
        with fleet.sampler(timeout=60) as sampler:
            assert sampler.obtain_exact_episodes(1).lengths.shape == (2,)
