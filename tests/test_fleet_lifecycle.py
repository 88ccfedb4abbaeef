"""Fleet.local's life and the client's errors, with real worker processes."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator

import numpy as np
import psutil
import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.envs import EnvConfig
from rlfleet.errors import (
    ConfigError,
    EnvError,
    NoWorkersError,
    PolicyError,
    RlfleetTimeoutError,
    UnavailableError,
    WorkerError,
)
from rlfleet.policies import MLPCategoricalPolicy
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

CARTPOLE = EnvConfig("CartPole-v1")
TESTING = ("rlfleet.envs.testing",)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    fleet = Fleet.local(2, 3, CARTPOLE, seed=4)
    try:
        yield fleet
    finally:
        fleet.close()


def test_status_describes_every_worker(fleet: Fleet) -> None:
    status = fleet.sampler.status()
    pids = {w.process.pid for w in fleet.workers}
    assert sorted(w.name for w in status.workers) == ["local-0", "local-1"]
    assert {w.pid for w in status.workers} == pids
    for worker in status.workers:
        assert (worker.host, worker.envs) == (socket.gethostname(), 3)
        assert worker.state == "idle" and worker.ready
        assert worker.implementation.startswith("rlfleet-python/")
        assert worker.seconds_since_heartbeat < 10
    assert (status.ready_workers, status.total_envs) == (2, 6)
    assert status.env == CARTPOLE and status.env_spec == CARTPOLE.env_spec()
    assert not status.draining


def test_steps_show_up_in_status_after_sampling(fleet: Fleet) -> None:
    batch = fleet.sampler.obtain_samples(0, 600)
    # Counts come with heartbeats (every second).
    wait_until(
        lambda: fleet.sampler.status().steps_total >= batch.total_steps, "the steps in the status"
    )


def test_a_refused_agent_update_leaves_the_fleet_on_its_agent(fleet: Fleet) -> None:
    sampler = fleet.sampler
    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(8,), seed=3)
    version = sampler.update_agent(policy)
    with RemoteSampler(fleet.address, seed=1) as probe:
        before = probe.obtain_episodes(3)
    bad = {"layers.0.weight": np.zeros((5, 5), np.float32)}
    with pytest.raises(PolicyError, match=r"layers\.0\.weight") as caught:
        sampler.update_agent(bad)
    assert "worker 'local-" in str(caught.value)  # names who refused it
    status = sampler.status()
    assert status.agent_version == version + 2  # restored as a new version
    with RemoteSampler(fleet.address, seed=1) as probe:
        after = probe.obtain_episodes(3)
    assert after.episode_infos["agent_version"].tolist() == [version + 2] * 3
    np.testing.assert_array_equal(after.actions, before.actions)  # the same agent acts


def test_no_process_is_left_after_the_block() -> None:
    before = children()
    with Fleet.local(2, 1, CARTPOLE) as sampler:
        pids = {w.pid for w in sampler.status().workers}
        assert pids <= children() - before
    assert not children() - before
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_no_process_is_left_after_an_exception_in_the_block() -> None:
    before = children()
    with pytest.raises(RuntimeError, match="boom"), Fleet.local(1, 1, CARTPOLE):
        raise RuntimeError("boom")
    assert not children() - before


def test_a_dropped_fleet_is_closed_by_the_garbage_collector() -> None:
    before = children()
    fleet = Fleet.local(1, 1, CARTPOLE)
    assert children() - before
    del fleet
    gc.collect()
    assert not children() - before


def test_a_worker_that_cannot_start_is_reported_with_its_log() -> None:
    before = children()
    with pytest.raises(WorkerError, match=r"(?s)exited before joining.*no_such_module_xyz"):
        Fleet.local(1, 1, CARTPOLE, imports=("no_such_module_xyz",), join_timeout=30)
    assert not children() - before


def test_a_crashing_env_is_an_env_error_naming_worker_env_and_step() -> None:
    crashing = EnvConfig("rlfleet/Crashing-v0", {"crash_at_step": 3, "length": 5}, imports=TESTING)
    with Fleet.local(1, 2, crashing) as sampler, pytest.raises(EnvError) as caught:
        sampler.obtain_episodes(30)
    error = caught.value
    assert error.worker == "local-0"
    assert error.env_index in (0, 1)
    assert error.step == 3
    assert error.remote_traceback is not None and "crashed on purpose" in error.remote_traceback
    assert "not restarted" in str(error)
    # Issue 12.7: the location once, the episode named and set, no task id called a request.
    message = str(error).split("\n--- remote traceback ---")[0]
    assert error.episode_index is not None
    assert message.count("(worker 'local-0'") == 1, message
    assert message.endswith(f"step 3, episode {error.episode_index})"), message
    assert "request" not in message, message


def test_a_call_past_its_timeout_names_the_seconds() -> None:
    hanging = EnvConfig("rlfleet/Hanging-v0", {"hang_at_step": 1}, imports=TESTING)
    with (
        Fleet.local(1, 1, hanging, timeout=1.0, grace=1.0) as sampler,
        pytest.raises(RlfleetTimeoutError, match="no answer within 1 seconds"),
    ):
        sampler.obtain_episodes(1)


def test_no_workers_is_a_typed_error_that_says_what_to_do() -> None:
    what_to_do = r"no worker joined within 0\.5 seconds; start workers with `rlfleet worker"
    with (
        serve(CoordinatorConfig(listen="127.0.0.1:0")) as server,
        RemoteSampler(server.address, wait_for_workers=0.5) as sampler,
    ):
        with pytest.raises(NoWorkersError, match=what_to_do):
            sampler.obtain_samples(0, 10)
        with pytest.raises(NoWorkersError, match=what_to_do):
            sampler.obtain_exact_episodes(1)


def test_an_absent_coordinator_is_unavailable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        RemoteSampler(f"127.0.0.1:{port}", timeout=5) as sampler,
        pytest.raises(UnavailableError, match=f"GetStatus on coordinator 127.0.0.1:{port}"),
    ):
        sampler.status()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers must be an int >= 1, got 0"),
        ({"envs_per_worker": True}, "envs_per_worker must be an int >= 1, got True"),
        ({"coordinator_options": {"seed": 3}}, r"sets \['seed'\] of the coordinator itself"),
        ({"env": 42}, "env must be an EnvConfig or a gymnasium id, got 42"),
    ],
)
def test_bad_fleet_arguments_start_nothing(kwargs: dict[str, object], message: str) -> None:
    before = children()
    with pytest.raises(ConfigError, match=message):
        Fleet.local(**kwargs)  # type: ignore[arg-type]
    assert not children() - before


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.obtain_episodes(2**63), "amount to sample must be an int <= 2**63-1"),
        (lambda s: s.obtain_samples(0, 2**63), "amount to sample must be an int <= 2**63-1"),
        (lambda s: s.obtain_samples(2**63, 10), "itr must be an int <= 2**63-1"),
        (lambda s: s.obtain_exact_episodes(2**63), "n_eps_per_worker must be an int <= 2**63-1"),
        (lambda s: s.obtain_fragments(10, 2.5), "fragment_length must be an int >= 1, got 2.5"),
        (lambda s: s.obtain_fragments(10, 2**32), "fragment_length must be an int <= 2**32-1"),
        (lambda s: s.stream("fragments", fragment_length=0), "fragment_length must be an int"),
        (lambda s: RemoteSampler(s.address, seed=2**64), "seed must be an int <= 2**64-1"),
        (lambda s: RemoteSampler(s.address, seed=-1), "seed must be an int >= 0"),
        (lambda s: RemoteSampler(s.address, timeout="1"), "timeout must be > 0 seconds"),  # type: ignore[arg-type]
    ],
)
def test_out_of_range_client_arguments_are_config_errors(
    fleet: Fleet, call: object, message: str
) -> None:
    # Issue 12.7: protobuf would raise ValueError or TypeError for these.
    for power, digits in (("2**63-1", 2**63 - 1), ("2**64-1", 2**64 - 1), ("2**32-1", 2**32 - 1)):
        message = message.replace(power, str(digits))
    with pytest.raises(ConfigError, match=message):
        call(fleet.sampler)  # type: ignore[operator]
    assert fleet.sampler.obtain_episodes(1).n_episodes == 1  # nothing was sent, nothing broke
