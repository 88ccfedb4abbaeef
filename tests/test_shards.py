"""One learner over several coordinators (docs/sharding.md).

Real coordinator and worker processes on 127.0.0.1, one ProcessFleet per
shard: a request cut over two coordinators returns LocalSampler's batch
(so one coordinator's), and a coordinator killed mid-request has its
episode ranges re-run on the other.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest

from rlfleet import load_batch
from rlfleet.cli import main
from rlfleet.client import RemoteSampler
from rlfleet.client import shards as shards_module
from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, InvalidArgumentError, UnavailableError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.protocol.learner_calls import SampleAsk
from rlfleet.protocol.modes import Mode
from rlfleet.sampling.local import LocalSampler
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    ProcessFleet,
    env_flags,
    run_in_thread,
)

pytestmark = pytest.mark.timeout(300)

SEED = 71
#: Agent versions count updates per coordinator; LocalSampler's stay 0.
VERSION = ("worker", "agent_version")


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[list[ProcessFleet]]:
    """Two coordinators (fleets), each started by the test."""
    with ExitStack() as stack:
        fleets = []
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            fleets.append(stack.enter_context(ProcessFleet(directory)))
        yield fleets


def start(fleet: ProcessFleet, env: EnvConfig | None, workers: int) -> None:
    fleet.start_coordinator(*(env_flags(env) if env else []))
    for _ in range(workers):
        fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(workers)


def stepped(fleet: ProcessFleet) -> bool:
    return fleet.status().steps_total > 0


def test_a_request_over_two_coordinators_is_the_batch_one_gives(
    shards: list[ProcessFleet],
) -> None:
    for fleet in shards:
        start(fleet, None, 1)
    env = EnvConfig("CartPole-v1")
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=[8], seed=5)
    with (
        RemoteSampler([f.address for f in shards], seed=SEED, timeout=120) as sharded,
        LocalSampler(env, policy, seed=SEED) as local,
    ):
        assert sharded.update_agent(policy) == 1
        assert_same_batch(sharded.obtain_episodes(9), local.obtain_episodes(9), skip_infos=VERSION)
        # STEPS: waves of ranges, cut to the smallest prefix of episodes that reaches the amount.
        for itr, amount in enumerate((300, 50, 1200)):
            expected = local.obtain_samples(itr, amount)
            assert_same_batch(sharded.obtain_samples(itr, amount), expected, skip_infos=VERSION)
        expected = local.obtain_episodes(2 * 3)  # 3 per worker, 2 workers over both shards
        assert_same_batch(sharded.obtain_exact_episodes(3), expected, skip_infos=VERSION)
        status = sharded.status()
        assert sharded.requests_made == 5
    # The command line takes the shards as one comma-separated address.
    addresses = ",".join(f.address for f in shards)
    out = shards[0].directory / "sharded.npz"
    code = main(
        ["sample", "--coordinator", addresses, "--mode", "episodes", "--episodes", "5",
         "--seed", str(SEED), "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    with LocalSampler(env, policy, seed=SEED) as fresh:
        assert_same_batch(load_batch(out), fresh.obtain_episodes(5), skip_infos=VERSION)
    # Both coordinators ran episodes (their step counts come with heartbeats).
    for fleet in shards:
        fleet.wait_until(functools.partial(stepped, fleet), what="steps on each shard")
    per_shard = [fleet.status() for fleet in shards]
    assert len(status.workers) == 2
    assert status.coordinator_id == ",".join(s.coordinator_id for s in per_shard)
    assert status.agent_version == 1


def test_one_coordinator_answers_a_range_with_its_global_indices(
    shards: list[ProcessFleet],
) -> None:
    fleet = shards[0]
    start(fleet, None, 1)
    with (
        fleet.sampler(seed=SEED, timeout=120) as sampler,
        LocalSampler(EnvConfig("CartPole-v1"), seed=SEED) as local,
    ):
        ask = SampleAsk(Mode.EPISODES, 3, seed=SEED, first_episode=4)
        answer = sampler._coordinator.sample(ask, None)
        indices = sorted(i for r in answer.results for i in r.batch.episode_infos["episode_index"])
        assert indices == [4, 5, 6]
        expected = local.obtain_episodes(7).take_episodes([4, 5, 6])
        got = EpisodeBatch.concatenate(*(r.batch for r in answer.results))
        assert_same_batch(got, expected, skip_infos=VERSION)
        # The field is for EPISODES requests only, and the coordinator says so.
        wrong = SampleAsk(Mode.STEPS, 30, seed=SEED, first_episode=4)
        with pytest.raises(
            InvalidArgumentError, match="first_episode is for SAMPLE_MODE_EPISODES only"
        ):
            sampler._coordinator.sample(wrong, None)


def test_a_killed_coordinators_ranges_are_rerun_on_the_other(
    shards: list[ProcessFleet],
) -> None:
    for fleet in shards:
        start(fleet, SLOW_ENV, 1)
    policy = MLPCategoricalPolicy(SLOW_ENV_TWIN.env_spec(), hidden_sizes=[4], seed=3)
    with (
        RemoteSampler([f.address for f in shards], seed=SEED, timeout=120) as sharded,
        LocalSampler(SLOW_ENV_TWIN, policy, seed=SEED) as local,
    ):
        sharded.update_agent(policy)
        expected = [local.obtain_episodes(n) for n in (12, 4)]
        dead, alive = shards[1], shards[0]
        pending = run_in_thread(lambda: sharded.obtain_episodes(12))
        dead.wait_until(dead.busy, what="the second coordinator's range on its worker")
        dead.kill(dead.coordinator)
        # Same seeds, same agent on the other shard: the same batch.
        assert_same_batch(pending(180), expected[0], skip_infos=VERSION)
        # The lost coordinator is left out of the next calls.
        assert_same_batch(sharded.obtain_episodes(4), expected[1], skip_infos=VERSION)
        assert sharded.requests_made == 2
        alive.kill(alive.coordinator)
        with pytest.raises(UnavailableError) as failure:
            sharded.obtain_episodes(4)
        message = str(failure.value)
        for fleet in shards:
            assert fleet.address in message, message
        assert "retry" in message
        assert sharded.requests_made == 2  # a retry gets the same seeds


def test_a_coordinator_that_missed_an_update_gets_it_before_it_samples_again(
    shards: list[ProcessFleet], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shards_module, "RETRY_LOST_SECONDS", 0.0)  # try it again at once
    for fleet in shards:
        start(fleet, None, 1)
    env = EnvConfig("CartPole-v1")
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=[8], seed=9)
    with (
        RemoteSampler([f.address for f in shards], seed=SEED, timeout=120) as sharded,
        LocalSampler(env, policy, seed=SEED) as local,
    ):
        sharded.obtain_episodes(4)  # both shards known, nothing pushed yet
        local.obtain_episodes(4)
        down = shards[1]
        before = down.status().coordinator_id
        down.kill(down.coordinator)
        # The update reaches the live shard; the dead one is left behind.
        assert sharded.update_agent(policy) == 1
        down.start_coordinator()  # same port, fresh state: the default policy
        down.wait_for_workers(1, coordinator_id=before)
        # The learner's channel to it may still sit in gRPC's reconnect
        # backoff (up to 5 s); until it reconnects, a try finds it lost again.
        assert sharded._shards is not None
        channel = sharded._shards.shards[1].coordinator._channel
        grpc.channel_ready_future(channel).result(timeout=60)
        # Its range is sampled with the learner's agent, pushed to it first.
        assert_same_batch(sharded.obtain_episodes(8), local.obtain_episodes(8), skip_infos=VERSION)
        assert down.status().agent_version == 1


@pytest.mark.parametrize(
    ("address", "complaint"),
    [
        ([], "names no coordinator"),
        (["127.0.0.1:1", "127.0.0.1:1"], "given twice"),
        (["127.0.0.1:1", ""], "non-empty"),
        ([b"127.0.0.1:1"], "non-empty"),
    ],
)
def test_bad_address_lists_are_config_errors(address: list[str], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        RemoteSampler(address)


def test_what_needs_one_coordinator_says_so() -> None:
    with RemoteSampler("127.0.0.1:1,127.0.0.1:2", seed=1) as sampler:
        assert sampler.addresses == ("127.0.0.1:1", "127.0.0.1:2")
        with pytest.raises(ConfigError, match="one coordinator"):
            sampler.open_channel()


def test_one_address_keeps_its_channel() -> None:
    with RemoteSampler("127.0.0.1:1") as sampler:
        assert sampler.addresses == ("127.0.0.1:1",)
        assert isinstance(sampler.open_channel(), grpc.Channel)
