"""Network faults between hosts: latency, loss, a frozen host, a partition.

Guarantee 7 of docs/reliability.md. The coordinator runs in one network
namespace and each worker in its own, joined by veth pairs
(``tests/netns_support.py``); the test (the learner) reaches the
coordinator over a link of its own. Sampling must go on through every
fault, answers must stay exactly LocalSampler's, and a partitioned worker
must rejoin when its link returns.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.cli import build_parser
from rlfleet.envs import EnvConfig
from rlfleet.sampling.local import LocalSampler
from rlfleet.transport import rpc as _rpc
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    ProcessFleet,
    env_flags,
    run_in_thread,
)
from tests.netns_support import DelayRelay, Host, Network, leftover_namespaces, unavailable_reason

pytestmark = pytest.mark.timeout(240)

SEED = 144
CARTPOLE = EnvConfig("CartPole-v1")
#: Keepalive of these tests' processes: a dead link is noticed in about 2 s.
KEEPALIVE = ("--keepalive-interval", "1", "--keepalive-timeout", "1")


@pytest.fixture
def network() -> Iterator[Network]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with Network() as net:
        yield net
    assert not leftover_namespaces(), "namespaces outlived the test"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def start_hub(fleet: ProcessFleet, network: Network, env: EnvConfig = CARTPOLE) -> None:
    """The coordinator on the hub, listening on every link of it."""
    fleet.start_coordinator(
        *KEEPALIVE,
        *env_flags(env),
        listen_host="0.0.0.0",
        advertise_host=network.hub_root_address,
        prefix=network.hub_prefix,
    )


def start_on(fleet: ProcessFleet, host: Host, address: str | None = None) -> None:
    """A worker on ``host`` dialing the hub over its own link (or ``address``)."""
    fleet.start_worker(
        *KEEPALIVE,
        name=host.name,
        coordinator=address or f"{host.hub_address}:{fleet.port}",
        prefix=host.prefix,
        imports=[TEST_ENVS_MODULE],
    )


@pytest.mark.netns
def test_latency_and_loss_leave_the_answer_unchanged(
    network: Network, fleet: ProcessFleet, tmp_path: Path
) -> None:
    slow, lossy, plain = (network.add_host(name) for name in ("slow", "lossy", "plain"))
    start_hub(fleet, network)
    # 50 ms each way through a relay on the slow host; 5% of the lossy host's
    # packets dropped in both directions.
    relay = DelayRelay(slow, f"{slow.hub_address}:{fleet.port}", 0.05, tmp_path / "relay.log")
    try:
        network.drop_randomly(lossy, 5)
        start_on(fleet, slow, relay.address)
        start_on(fleet, lossy)
        start_on(fleet, plain)
        ids = {w.name: w.worker_id for w in fleet.wait_for_workers(3).workers}
        with fleet.sampler(seed=SEED, timeout=180) as sampler:
            steps = sampler.obtain_samples(0, 3000)
            episodes = sampler.obtain_episodes(30)
    finally:
        relay.close()
    with LocalSampler(CARTPOLE, seed=SEED) as local:
        assert_same_batch(steps, local.obtain_samples(0, 3000))
        assert_same_batch(episodes, local.obtain_episodes(30))
    # Every slot gets a unit before any worker gets a second: all three took part.
    assert set(steps.episode_infos["worker"].tolist()) == set(ids.values())


@pytest.mark.netns
def test_frozen_and_partitioned_workers_are_replaced_and_rejoin(
    network: Network, fleet: ProcessFleet
) -> None:
    frozen, cut, steady = (network.add_host(name) for name in ("frozen", "cut", "steady"))
    start_hub(fleet, network, SLOW_ENV)  # episodes last long enough to be cut mid-way
    for host in (frozen, cut, steady):
        start_on(fleet, host)
    fleet.wait_for_workers(3)
    proc = {p.name: p for p in fleet.workers}
    sampler = fleet.sampler(seed=SEED, timeout=180)
    local = LocalSampler(SLOW_ENV_TWIN, seed=SEED)
    try:
        # A frozen host: connected, silent; its units are re-run elsewhere.
        fleet.freeze(proc["frozen"])
        pending = run_in_thread(lambda: sampler.obtain_episodes(12))
        fleet.wait_until(lambda: fleet.units_on("frozen"), what="units on the frozen host")
        assert_same_batch(pending(120), local.obtain_episodes(12))
        fleet.thaw(proc["frozen"])

        # A partition longer than the heartbeat timeout, mid-request.
        pending = run_in_thread(lambda: sampler.obtain_episodes(12))
        fleet.wait_until(lambda: fleet.units_on("cut"), what="units on the cut host")
        network.partition(cut)
        assert_same_batch(pending(120), local.obtain_episodes(12))
        # Dropped by whichever notices first: its keepalive pings going
        # unanswered (the stream "broke") or its missing heartbeats.
        log = fleet.wait_for_log(fleet.coordinator, "worker 'cut' removed")
        assert re.search(r"worker 'cut' removed \([^)]*(stream broke|heartbeat timeout)", log)
        # Its own keepalive tells the cut worker the link is dead.
        fleet.wait_for_log(proc["cut"], "reconnecting in")
        network.heal(cut)
        fleet.wait_for_workers(3)  # the frozen one and the cut one are back
        assert_same_batch(sampler.obtain_episodes(12), local.obtain_episodes(12))
    finally:
        local.close()


def test_keepalive_is_set_on_both_ends_and_configurable() -> None:
    """gRPC alone never notices a frozen peer: keepalive and a ping timeout must be set."""
    for options in (
        _rpc.channel_options(keepalive_seconds=2, ping_timeout_seconds=1),
        _rpc.server_options(keepalive_seconds=2, ping_timeout_seconds=1),
    ):
        values = dict(options)
        assert values["grpc.keepalive_time_ms"] == 2000
        assert values["grpc.keepalive_timeout_ms"] == 1000
        assert values["grpc.http2.ping_timeout_ms"] == 1000
    # The server lets clients ping as often as the tests' 1 s keepalive.
    assert dict(_rpc.server_options())["grpc.http2.min_ping_interval_without_data_ms"] <= 1000
    parser = build_parser()
    for command, extra in (("coordinator", []), ("worker", ["--coordinator", "h:1"])):
        args = parser.parse_args([command, *extra, *KEEPALIVE])
        assert (args.keepalive_interval, args.keepalive_timeout) == (1.0, 1.0)
