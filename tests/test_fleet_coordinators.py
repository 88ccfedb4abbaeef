"""Fleet.local over several coordinators (``coordinators=N``; docs/sharding.md).

Real coordinator and worker processes on 127.0.0.1: the batch is the one
coordinator's for the same seed, workers are dealt round-robin, every
coordinator takes the fleet's tokens, and nothing the fleet started is left
once it closes or fails to start. Dying with the learner is in
``tests/test_fleet_parent_death.py``.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import psutil
import pytest

from rlfleet.bench import BenchConfig
from rlfleet.bench.samplers import fleet_sampler
from rlfleet.cli import parse_args
from rlfleet.client import Fleet, RemoteSampler, RemoteVectorEnv
from rlfleet.coordinator import CoordinatorConfig
from rlfleet.coordinator.config import SETTING_NAMES
from rlfleet.envs import EnvConfig
from rlfleet.errors import AuthenticationError, ConfigError, UnavailableError, WorkerError
from rlfleet.policies import MLPCategoricalPolicy
from tests._coordinator_fakes import assert_same_batch

pytestmark = pytest.mark.timeout(300)

SEED = 23
CARTPOLE = EnvConfig("CartPole-v1")
#: Worker ids and agent versions are per coordinator.
PER_COORDINATOR = ("worker", "agent_version")


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def policy() -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=[8], seed=5)


@pytest.fixture(scope="module")
def sharded() -> Iterator[Fleet]:
    """Three workers over two coordinator processes, with tokens."""
    fleet = Fleet.local(
        3, 2, CARTPOLE, seed=SEED, coordinators=2, authenticate=True, policy=policy()
    )
    try:
        yield fleet
    finally:
        fleet.close()


def batches(sampler: RemoteSampler) -> list[Any]:
    return [
        sampler.obtain_episodes(7),
        sampler.obtain_samples(0, 400),
        sampler.obtain_samples(1, 90),
        sampler.obtain_exact_episodes(2),
    ]


def test_two_coordinators_give_the_batch_one_gives(sharded: Fleet) -> None:
    got = batches(sharded.sampler)
    with Fleet.local(3, 2, CARTPOLE, seed=SEED, policy=policy()) as single:
        expected = batches(single)
    for actual, wanted in zip(got, expected, strict=True):
        assert_same_batch(actual, wanted, skip_infos=PER_COORDINATOR)


def test_workers_are_dealt_round_robin_and_every_coordinator_takes_the_fleets_tokens(
    sharded: Fleet,
) -> None:
    assert len(sharded.coordinators) == 2
    assert sharded.address == ",".join(sharded.addresses)
    assert sharded.addresses == tuple(c.address for c in sharded.coordinators)
    expected = [["local-0", "local-2"], ["local-1"]]
    token = sharded.learner_token
    assert token is not None
    secret = token.reveal()
    for coordinator, names in zip(sharded.coordinators, expected, strict=True):
        with RemoteSampler(coordinator.address, token=token) as one:
            assert sorted(w.name for w in one.status().workers) == names
        with RemoteSampler(coordinator.address) as stranger, pytest.raises(AuthenticationError):
            stranger.status()
        # Tokens travel in the environment, never on a command line.
        assert not any(secret in arg for arg in psutil.Process(coordinator.process.pid).cmdline())
    assert sharded.sampler.status().ready_workers == 3


def test_what_needs_one_coordinator_says_so(sharded: Fleet) -> None:
    with pytest.raises(ConfigError, match=r"2 coordinator processes.*coordinators=1"):
        _ = sharded.server
    # An env id leases over both (tests/test_remote_vector_env_shards.py); code does not.
    with pytest.raises(ConfigError, match="one coordinator"):
        RemoteVectorEnv([lambda: gym.make("CartPole-v1")] * 2, on=sharded)


def test_close_leaves_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # A coordinator process takes every setting from its flags: a learner token
    # in the learner's environment (half a token pair, which a coordinator
    # refuses to start with) must not reach it.
    monkeypatch.setenv("RLFLEET_LEARNER_TOKEN", secrets.token_hex(32))
    before = children()
    fleet = Fleet.local(2, 1, CARTPOLE, coordinators=2)
    started = {c.process.pid for c in fleet.coordinators} | {w.process.pid for w in fleet.workers}
    assert started <= children() - before
    fleet.sampler.obtain_episodes(2)
    fleet.close()
    assert not children() - before
    assert not any(psutil.pid_exists(pid) for pid in started)


def test_a_worker_that_cannot_start_leaves_no_coordinator() -> None:
    before = children()
    with pytest.raises(
        WorkerError, match=r"(?s)local-\d \(pid \d+, 127\.0\.0\.1:\d+\).*no_such_xyz"
    ):
        Fleet.local(2, 1, CARTPOLE, coordinators=2, imports=("no_such_xyz",), join_timeout=60)
    assert not children() - before


def test_a_coordinator_that_cannot_start_is_named_with_its_log() -> None:
    # Both coordinators are told the same lease data port: one of them cannot bind it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = children()
    with pytest.raises(
        UnavailableError, match=r"(?s)coordinator-[01] exited before listening.*already in use"
    ):
        Fleet.local(
            2,
            1,
            CARTPOLE,
            coordinators=2,
            coordinator_options={"lease_data_listen": f"127.0.0.1:{port}"},
        )
    assert not children() - before


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"coordinators": 0}, "coordinators must be an int >= 1"),
        ({"coordinators": -2}, "coordinators must be an int >= 1"),
        ({"coordinators": 1.5}, "coordinators must be an int >= 1"),
        ({"coordinators": True}, "coordinators must be an int >= 1"),
        ({"coordinators": "2"}, "coordinators must be an int >= 1"),
        ({"coordinators": 3, "workers": 2}, r"workers >= coordinators"),
    ],
)
def test_bad_coordinators_values_are_config_errors(options: dict[str, Any], complaint: str) -> None:
    before = children()
    with pytest.raises(ConfigError, match=complaint):
        Fleet.local(**options)
    assert not children() - before


def test_a_config_survives_the_trip_through_coordinator_flags() -> None:
    plain = {f.name for f in dataclasses.fields(CoordinatorConfig)}
    assert set(SETTING_NAMES) == plain - {"listen", "env", "seed", "tail_moves", "security"}
    config = CoordinatorConfig(
        listen="127.0.0.1:0",
        env=EnvConfig("CartPole-v1", {"sutton_barto_reward": True}, 50, vectorization="subprocess"),
        seed=9,
        heartbeat_interval_seconds=0.25,
        heartbeat_timeout_seconds=2.5,
        progress_deadline_seconds=7.5,
        max_message_bytes=1 << 20,
        lease_data_listen="off",
        capacity_steps=0,
        tail_moves=False,
    )
    args = parse_args(["coordinator", *config.command_flags()])
    assert (args.listen, args.seed, args.tail_moves) == (config.listen, config.seed, "off")
    rebuilt = EnvConfig(
        args.env, args.env_kwargs, args.max_episode_length, vectorization=args.env_vectorization
    )
    assert rebuilt == config.env
    for name, setting in SETTING_NAMES.items():
        assert getattr(args, setting) == getattr(config, name), name


def test_the_bench_fleet_runs_over_coordinator_processes_and_reports_their_cpu() -> None:
    config = BenchConfig(
        workers=2, envs_per_worker=2, steps=1500, request_steps=500, coordinators=2
    )
    assert config.fleet_suffix == ", 2 coordinators"
    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=config.hidden_sizes, seed=0)
    before = children()
    with fleet_sampler(config, CARTPOLE, policy.get_param_values()) as sample:
        timed = sample(config.steps)
    assert not children() - before
    assert timed.steps >= config.steps
    for role in (
        "workers (each, per step it takes)",
        "coordinators (each, per step it passes)",
        "learner (main thread)",
    ):
        assert timed.cpu_us[role] > 0, role
    with pytest.raises(ConfigError, match=r"coordinators \(3\) must not exceed workers \(2\)"):
        BenchConfig(workers=2, coordinators=3)
