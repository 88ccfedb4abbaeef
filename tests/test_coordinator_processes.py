"""The coordinator as a process with real worker processes.

``python -m rlfleet coordinator`` and ``python -m rlfleet worker`` run in
their own process groups and are torn down in fixtures, so no test leaves a
process behind. Answers are compared bit for bit with LocalSampler's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from rlfleet.client import RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import PolicyError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.sampling.local import LocalSampler
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, updates_pb2
from rlfleet.wire import encode_tensor_map
from tests._coordinator_fakes import (
    PROCESS_ENV,
    Answer,
    assert_same_batch,
    expect_failure,
    rlfleet_process,
    sample,
    select,
    status,
    stop_process,
    unary,
    wait_for_file,
    wait_for_workers,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

SEED = 13
Spawn = Callable[..., None]


@pytest.fixture
def coordinator(tmp_path: Path) -> Iterator[str]:
    """A coordinator process; yields its address."""
    port_file = tmp_path / "port"
    process = rlfleet_process(
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--port-file",
        str(port_file),
        "--heartbeat-timeout",
        "5",
        "--wait-for-workers",
        "30",
        log=tmp_path / "coordinator.log",
    )
    try:
        port = int(wait_for_file(port_file, process))
        yield f"127.0.0.1:{port}"
    finally:
        code = stop_process(process)
        log = (tmp_path / "coordinator.log").read_text()
        assert code == 0, log
        assert f"coordinator listening on 127.0.0.1:{port}" in log


@pytest.fixture
def spawn(coordinator: str, tmp_path: Path) -> Iterator[Spawn]:
    """Starts worker processes joined to the coordinator; stops them after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(envs: int, count: int = 1) -> None:
        for _ in range(count):
            name = f"w{len(started)}"
            started.append(
                rlfleet_process(
                    "worker",
                    "--coordinator",
                    coordinator,
                    "--envs",
                    str(envs),
                    "--name",
                    name,
                    log=tmp_path / f"{name}.log",
                )
            )

    yield start
    for process in started:
        stop_process(process)


def stream_major(batch: EpisodeBatch) -> EpisodeBatch:
    """Fragments ordered by (stream, episode, fragment), whatever their order was."""
    keys = [batch.episode_infos[k] for k in ("fragment_index", "episode_index", "stream")]
    return select(batch, np.lexsort(keys))


@pytest.mark.parametrize(("workers", "envs"), [(1, 3), (3, 1)])
def test_every_mode_equals_local_sampler(
    coordinator: str, spawn: Spawn, workers: int, envs: int
) -> None:
    spawn(envs, workers)
    wait_for_workers(coordinator, workers)
    local = LocalSampler(
        EnvConfig("CartPole-v1"), n_workers=workers, envs_per_worker=envs, seed=SEED
    )
    try:
        steps = sample(coordinator, mode=1, amount=250, seed=SEED, request_index=0)
        assert_same_batch(steps.batch, local.obtain_samples(0, 250))
        episodes = sample(coordinator, mode=2, amount=5, seed=SEED, request_index=1)
        assert_same_batch(episodes.batch, local.obtain_episodes(5))
        for request_index, amount in ((2, 40), (3, 7)):  # streams go on across requests
            fragments = sample(
                coordinator,
                mode=3,
                amount=amount,
                fragment_length=6,
                seed=SEED,
                request_index=request_index,
            )
            expected = stream_major(local.obtain_fragments(amount, 6))
            assert_same_batch(fragments.batch, expected)
    finally:
        local.close()
    fleet = status(coordinator)
    assert sorted(w.name for w in fleet.workers) == [f"w{i}" for i in range(workers)]
    assert all(w.pid > 0 and w.implementation.startswith("rlfleet-python") for w in fleet.workers)


def test_the_client_library_gets_local_samplers_batches(coordinator: str, spawn: Spawn) -> None:
    spawn(2, 1)
    wait_for_workers(coordinator, 1)
    local = LocalSampler(EnvConfig("CartPole-v1"), envs_per_worker=2, seed=SEED)
    with RemoteSampler(coordinator, seed=SEED, timeout=60) as remote:
        assert_same_batch(remote.obtain_samples(0, 120), local.obtain_samples(0, 120))
        assert_same_batch(remote.obtain_exact_episodes(3), local.obtain_exact_episodes(3))
    local.close()


def test_a_worker_killed_mid_request_loses_nothing(coordinator: str, spawn: Spawn) -> None:
    spawn(1, 2)
    fleet = wait_for_workers(coordinator, 2)
    frozen = fleet.workers[0]
    # Frozen, it takes units and never answers; killed, its stream breaks.
    os.kill(frozen.pid, signal.SIGSTOP)
    answers: list[Answer] = []
    try:
        thread = threading.Thread(
            target=lambda: answers.append(
                sample(coordinator, mode=2, amount=8, seed=SEED, request_index=0, timeout=90)
            )
        )
        thread.start()
        wait_units(coordinator, frozen.worker_id)
    finally:
        os.kill(frozen.pid, signal.SIGKILL)
    thread.join(timeout=90)
    (answer,) = answers
    local = LocalSampler(EnvConfig("CartPole-v1"), seed=SEED)
    assert_same_batch(answer.batch, local.obtain_episodes(8))
    local.close()
    assert answer.footer.num_episodes == 8 and answer.footer.reassigned_units >= 1
    # No duplicates, none missing.
    assert answer.batch.episode_infos["episode_index"].tolist() == list(range(8))


def wait_units(address: str, worker_id: int, timeout: float = 30.0) -> int:
    """Waits until a worker holds units; returns how many."""

    def units() -> int:
        held = [w.units_in_flight for w in status(address).workers if w.worker_id == worker_id]
        return int(held[0]) if held else 0

    return wait_until(units, f"units on worker {worker_id}", timeout=timeout)


def test_refused_parameters_fail_the_update_and_the_fleet_keeps_sampling(
    coordinator: str, spawn: Spawn
) -> None:
    spawn(1, 2)
    wait_for_workers(coordinator, 2)
    spec = EnvConfig("CartPole-v1").env_spec()
    params = MLPCategoricalPolicy(spec, hidden_sizes=[4], seed=3).get_param_values()
    good = updates_pb2.AgentUpdate(params=encode_tensor_map(params))
    good.policy.name, good.policy.kwargs_json = "mlp-categorical", '{"hidden_sizes": [4]}'
    ack = unary(coordinator, _rpc.UPDATE_AGENT, good, learner_pb2.UpdateAck)
    assert (ack.agent_version, ack.workers_updated) == (1, 2)
    wrong = {name: np.zeros((2, 2), np.float32) for name in params}
    bad = updates_pb2.AgentUpdate(params=encode_tensor_map(wrong))
    failure = expect_failure(
        lambda: unary(coordinator, _rpc.UPDATE_AGENT, bad, learner_pb2.UpdateAck)
    )
    assert failure.code is grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(_rpc.error_from_rpc(failure.error, what="UpdateAgent"), PolicyError)
    wait_for_workers(coordinator, 2)
    answer = sample(coordinator, mode=2, amount=4, seed=SEED, request_index=0)
    assert set(answer.batch.episode_infos["agent_version"].tolist()) == {3}
    policy = MLPCategoricalPolicy(spec, hidden_sizes=[4])
    policy.set_param_values(params)
    local = LocalSampler(EnvConfig("CartPole-v1"), policy, seed=SEED)
    expected = local.obtain_episodes(4)
    local.close()
    assert_same_batch(answer.batch, expected, skip_infos=("worker", "agent_version"))


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--listen", "nohost"], 1, "must be HOST:PORT"),
        (["--env-kwargs", "[1]"], 2, "must be a JSON object"),
        (["--env", "mypkg.envs:Env-v0"], 1, "--import MODULE"),
    ],
)
def test_bad_flags_fail_with_a_message(args: list[str], code: int, message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=PROCESS_ENV,
    )
    assert result.returncode == code, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--lease-data-listen", "off"],
        ["--listen", "0.0.0.0:{port}"],  # the wildcard over a loopback listener
    ],
)
def test_a_second_coordinator_on_a_taken_port_names_that_port(
    coordinator: str, extra: list[str]
) -> None:
    # The gRPC port is checked first: the error names it (not the lease data
    # port beside it) in one line, with no raw gRPC log line.
    port = int(coordinator.rpartition(":")[2])
    args = ["--listen", coordinator, *(arg.format(port=port) for arg in extra)]
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=PROCESS_ENV,
    )
    assert result.returncode == 1, result.stderr
    assert f":{port}: Address already in use" in result.stderr, result.stderr
    assert "another coordinator" in result.stderr and "--listen" in result.stderr
    assert f":{port + 2}" not in result.stderr, result.stderr
    assert "add_port" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rlfleet: error: cannot listen on")


def test_a_taken_health_port_is_one_clear_line(coordinator: str) -> None:
    port = int(coordinator.rpartition(":")[2])
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "coordinator", "--listen", "127.0.0.1:0",
         "--health-listen", coordinator],
        check=False, capture_output=True, text=True, timeout=60, env=PROCESS_ENV,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert f"cannot serve health on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "add_port" not in result.stderr, result.stderr
