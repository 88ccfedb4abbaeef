"""Two coordinators on two "hosts" (network namespaces), one learner over both.

Each shard is a coordinator on its own hub namespace with a worker on a host
namespace of its own (``tests/netns_support.py``); the learner, in the root
namespace, reaches each coordinator over its own link. docs/sharding.md:
the batch is one coordinator's (LocalSampler's), and a coordinator killed
mid-request has its ranges re-run on the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from rlfleet.client import RemoteSampler
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.sampling.local import LocalSampler
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import SLOW_ENV, SLOW_ENV_TWIN, ProcessFleet, run_in_thread
from tests.netns_support import Network, leftover_namespaces, unavailable_reason
from tests.test_faults_network import start_hub, start_on

pytestmark = pytest.mark.timeout(300)

SEED = 19
VERSION = ("worker", "agent_version")


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[list[tuple[Network, ProcessFleet]]]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    with ExitStack() as stack:
        pairs = []
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            network = stack.enter_context(Network(tag=f"sh{name}"))
            pairs.append((network, stack.enter_context(ProcessFleet(directory))))
        yield pairs
    assert not leftover_namespaces(), "namespaces outlived the test"


@pytest.mark.netns
def test_two_coordinators_on_two_hosts_give_one_coordinators_batch_and_survive_a_kill(
    shards: list[tuple[Network, ProcessFleet]],
) -> None:
    for network, fleet in shards:
        start_hub(fleet, network, SLOW_ENV)
        start_on(fleet, network.add_host("w"))
    for _, fleet in shards:
        fleet.wait_for_workers(1)
    policy = MLPCategoricalPolicy(SLOW_ENV_TWIN.env_spec(), hidden_sizes=[4], seed=3)
    addresses = [fleet.address for _, fleet in shards]
    with (
        RemoteSampler(addresses, seed=SEED, timeout=120) as sampler,
        LocalSampler(SLOW_ENV_TWIN, policy, seed=SEED) as local,
    ):
        sampler.update_agent(policy)
        expected = [local.obtain_episodes(6), local.obtain_samples(1, 40)]
        expected.append(local.obtain_episodes(10))
        assert_same_batch(sampler.obtain_episodes(6), expected[0], skip_infos=VERSION)
        assert_same_batch(sampler.obtain_samples(1, 40), expected[1], skip_infos=VERSION)
        _, dead = shards[1]
        pending = run_in_thread(lambda: sampler.obtain_episodes(10))
        dead.wait_until(dead.busy, what="the second coordinator's range on its worker")
        dead.kill(dead.coordinator)
        assert_same_batch(pending(180), expected[2], skip_infos=VERSION)
