"""Fragments over several coordinators (docs/sharding.md, "Fragments and subscriptions").

Real coordinator and worker processes on 127.0.0.1 (``Fleet.local(coordinators=2)``):
each coordinator runs its own streams under its own base seed, for its share
of the amount; the learner numbers them into one set, in LocalSampler's
order, and a coordinator lost during a call fails it with a typed error.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator
from functools import partial

import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.client.shard_fragments import fragment_shares, global_stream
from rlfleet.core import EpisodeBatch, StepType
from rlfleet.core.episode_order import sort_fragments
from rlfleet.core.seeding import shard_seed, stream_seeds
from rlfleet.envs import EnvConfig
from rlfleet.errors import UnavailableError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.sampling.local import LocalSampler
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import run_in_thread
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

SEED = 29
CARTPOLE = EnvConfig("CartPole-v1")
ENVS = 2  # per worker; one worker per coordinator
#: Worker ids and agent versions are per coordinator (LocalSampler's versions stay 0).
PER_COORDINATOR = ("worker", "agent_version")


def policy() -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=[8], seed=5)


def two_coordinators() -> Fleet:
    return Fleet.local(2, ENVS, CARTPOLE, seed=SEED, coordinators=2, policy=policy())


@pytest.fixture(scope="module")
def sharded() -> Iterator[Fleet]:
    fleet = two_coordinators()
    try:
        yield fleet
    finally:
        fleet.close()


#: (amount, fragment_length) of the calls each test makes, in order.
CALLS = ((4 * 8, 8), (4 * 30 - 5, 30), (3, 25))


def shard_zero_and_one_alone(calls: tuple[tuple[int, int], ...]) -> list[EpisodeBatch]:
    """What each coordinator's streams give alone (LocalSampler = one coordinator), numbered
    as the learner numbers them: coordinator s's stream i is stream ``2 * i + s``."""
    samplers = [
        LocalSampler(CARTPOLE, policy(), envs_per_worker=ENVS, seed=shard_seed(SEED, s))
        for s in range(2)
    ]
    expected = []
    try:
        for amount, length in calls:
            parts = []
            for s, share in enumerate(fragment_shares(amount, [ENVS, ENVS])):
                batch = samplers[s].obtain_fragments(share, length)
                infos = dict(batch.episode_infos)
                infos["stream"] = global_stream(infos["stream"], s, 2)
                parts.append(dataclasses.replace(batch, episode_infos=infos))
            expected.append(sort_fragments(EpisodeBatch.concatenate(*parts)))
    finally:
        for sampler in samplers:
            sampler.close()
    return expected


def test_fragments_over_two_coordinators_are_each_ones_streams_numbered_together(
    sharded: Fleet,
) -> None:
    got = [sharded.sampler.obtain_fragments(amount, length) for amount, length in CALLS]
    # Each coordinator runs the streams a fleet of its own would, with its seed.
    for actual, wanted in zip(got, shard_zero_and_one_alone(CALLS), strict=True):
        assert_same_batch(actual, wanted, skip_infos=PER_COORDINATOR)
    slots = 2 * ENVS
    for (amount, length), batch in zip(CALLS, got, strict=True):
        # Whole windows of every stream: the rounds one coordinator with all slots plans.
        rounds = -(-amount // (slots * length))
        assert batch.total_steps == rounds * slots * length
        assert batch.lengths.max() <= length
        infos = batch.episode_infos
        assert sorted(set(infos["stream"].tolist())) == list(range(slots))
        # Ordered by (stream, episode, fragment), as on one coordinator.
        columns = (infos[k].tolist() for k in ("stream", "episode_index", "fragment_index"))
        keys = list(zip(*columns, strict=True))
        assert keys == sorted(keys)
    # Streams continue across calls: each stream's first piece of a call follows its last one.
    for before, after in itertools.pairwise(got):
        for stream in range(slots):
            last = np.flatnonzero(before.episode_infos["stream"] == stream)[-1]
            first = np.flatnonzero(after.episode_infos["stream"] == stream)[0]
            episode = int(before.episode_infos["episode_index"][last])
            fragment = int(before.episode_infos["fragment_index"][last])
            end = int(np.cumsum(before.lengths)[last]) - 1
            ended = before.step_types[end] in (StepType.TERMINAL, StepType.TIMEOUT)
            want = (episode + 1, 0) if ended else (episode, fragment + 1)
            index = after.episode_infos
            assert (int(index["episode_index"][first]), int(index["fragment_index"][first])) == want
    # No two coordinators run the same stream seeds: each its own base seed.
    batch = got[0]
    for row, stream in enumerate(batch.episode_infos["stream"].tolist()):
        local, shard = divmod(stream, 2)
        episode = int(batch.episode_infos["episode_index"][row])
        seeds = stream_seeds(shard_seed(SEED, shard), local, episode)
        assert seeds == (
            int(batch.episode_infos["env_seed"][row]),
            int(batch.episode_infos["policy_seed"][row]),
        )
    assert shard_seed(SEED, 0) == SEED != shard_seed(SEED, 1)


def test_the_same_seed_and_layout_give_the_same_fragments_again(sharded: Fleet) -> None:
    with two_coordinators() as again:
        first = [again.obtain_fragments(amount, length) for amount, length in CALLS]
    for batch, wanted in zip(first, shard_zero_and_one_alone(CALLS), strict=True):
        assert_same_batch(batch, wanted, skip_infos=PER_COORDINATOR)


def subscribed(address: str, count: int) -> bool:
    """Whether the coordinator at ``address`` has ``count`` open subscriptions."""
    with RemoteSampler(address, timeout=30) as one:
        return one.status().subscribers == count


def test_a_subscription_over_two_coordinators_merges_both(sharded: Fleet) -> None:
    length, seen = 10, set[int]()
    with sharded.sampler.stream("fragments", fragment_length=length) as stream:
        # One subscription on each coordinator, read as one.
        for address in sharded.addresses:
            wait_until(partial(subscribed, address, 1), f"a subscription on {address}")
        for batch, _ in stream:
            assert batch.total_steps == ENVS * length  # one window of one worker
            streams = batch.episode_infos["stream"].tolist()
            (shard,) = {stream % 2 for stream in streams}  # one coordinator's streams
            for row, stream_number in enumerate(streams):
                episode = int(batch.episode_infos["episode_index"][row])
                assert stream_seeds(shard_seed(SEED, shard), stream_number // 2, episode) == (
                    int(batch.episode_infos["env_seed"][row]),
                    int(batch.episode_infos["policy_seed"][row]),
                )
            seen.add(shard)
            if seen == {0, 1}:
                break
    # Closing it ended both.
    for address in sharded.addresses:
        wait_until(partial(subscribed, address, 0), f"the subscription on {address} ending")


def test_a_lost_coordinator_fails_fragments_and_subscriptions_with_a_typed_error() -> None:
    fleet = Fleet.local(2, ENVS, CARTPOLE, seed=SEED, coordinators=2, grace=2.0)
    try:
        sampler = fleet.sampler
        sampler.obtain_fragments(4 * 5, 5)
        dead = fleet.coordinators[1]
        with sampler.stream("episodes") as stream:
            next(stream)
            dead.process.kill()
            dead.process.wait(60)
            # The dead one's failure ends the merged stream, and the other's subscription.
            with pytest.raises(UnavailableError, match=re.escape(dead.address)):
                for count, _ in enumerate(stream):
                    assert count < 100_000, "the dead coordinator's failure never came"
        wait_until(partial(subscribed, fleet.addresses[0], 0), "the live subscription ending")
        # Its streams cannot go on elsewhere: the call fails, retryable, naming it.
        with pytest.raises(UnavailableError, match=re.escape(dead.address)) as failure:
            sampler.obtain_fragments(4 * 5, 5)
        assert "retry" in str(failure.value).lower()
        # The retry samples on the coordinator left: its streams only, all the amount.
        batch = sampler.obtain_fragments(4 * 5, 5)
        assert set(batch.episode_infos["stream"].tolist()) == {0, 2}
        assert batch.total_steps == 4 * 5  # two windows of its 2 streams
    finally:
        fleet.close()


#: 20 ms a step, 50-step episodes: a 100-step window is two whole episodes
#: of about 2 seconds, long enough for a coordinator to die during it.
SLOW = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 0.02, "length": 50})


def busy(address: str) -> bool:
    with RemoteSampler(address, timeout=30) as one:
        return any(worker.state == "busy" for worker in one.status().workers)


def test_a_coordinator_lost_mid_call_fails_it_and_the_others_fragments_are_dropped() -> None:
    fleet = Fleet.local(
        2, 1, SLOW, seed=SEED, coordinators=2, imports=("rlfleet.envs.testing",), grace=2.0
    )
    try:
        sampler = fleet.sampler
        dead = fleet.coordinators[1]
        pending = run_in_thread(lambda: sampler.obtain_fragments(2 * 100, 100))
        wait_until(lambda: busy(dead.address), "the second coordinator's window on its worker")
        dead.process.kill()
        dead.process.wait(60)
        with pytest.raises(UnavailableError, match=re.escape(dead.address)) as failure:
            pending(120)
        assert "dropped" in str(failure.value)
        # The survivor's stream went on through the failed call (its window
        # of episodes 0 and 1 was dropped); the retry runs on it alone.
        batch = sampler.obtain_fragments(100, 100)
        assert batch.episode_infos["stream"].tolist() == [0, 0]
        assert batch.episode_infos["episode_index"].tolist() == [2, 3]
    finally:
        fleet.close()
