"""Subscriptions over real worker processes: versions, fragments, backpressure."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from rlfleet.client import Fleet, FleetStatus, RemoteSampler, SampleStream, StreamedBatch
from rlfleet.core import StepType
from rlfleet.envs import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

ENVS_PER_WORKER = 2
CARTPOLE = EnvConfig("CartPole-v1")


@pytest.fixture(scope="module")
def sampler() -> Iterator[RemoteSampler]:
    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(8,), seed=0)
    with Fleet.local(2, ENVS_PER_WORKER, CARTPOLE, policy=policy, seed=5) as remote:
        yield remote


def read_until(
    stream: SampleStream, done: Callable[[StreamedBatch], bool], limit: int = 5000
) -> list[StreamedBatch]:
    seen = []
    for item in stream:
        seen.append(item)
        if done(item):
            return seen
        assert len(seen) < limit, "the awaited batch never came"
    raise AssertionError("the stream ended")


def test_batches_are_tagged_with_versions_and_follow_updates(sampler: RemoteSampler) -> None:
    version = sampler.status().agent_version
    policy = MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(8,), seed=9)
    with sampler.stream(mode="episodes") as stream:
        before = read_until(stream, lambda _: True)
        new_version = sampler.update_agent(policy.get_param_values())
        assert new_version == version + 1
        after = read_until(stream, lambda item: item.agent_version == new_version)
    items = before + after
    assert before[0].agent_version == version
    last_by_worker: dict[int, int] = collections.defaultdict(int)
    for batch, tag in items:
        versions = batch.episode_infos["agent_version"]
        assert versions.tolist() == [tag] * batch.n_episodes  # one version per result
        assert tag in (version, new_version)
        # Whole episodes only: an update re-runs interrupted ones with the new agent.
        starts = np.cumsum(batch.lengths) - batch.lengths
        assert set(batch.step_types[starts].tolist()) <= {StepType.FIRST, StepType.TERMINAL}
        ends = batch.step_types[np.cumsum(batch.lengths) - 1]
        assert set(ends.tolist()) <= {StepType.TERMINAL, StepType.TIMEOUT}
        # A worker's versions never go back.
        (worker,) = set(batch.episode_infos["worker"].tolist())
        assert tag >= last_by_worker[worker]
        last_by_worker[worker] = tag


def test_fragment_stream_sends_whole_windows(sampler: RemoteSampler) -> None:
    with sampler.stream(mode="fragments", fragment_length=10) as stream:
        items = [next(stream) for _ in range(6)]
    for batch, _ in items:
        assert batch.total_steps == ENVS_PER_WORKER * 10  # one window of one worker
        assert batch.lengths.max() <= 10
        assert {"stream", "fragment_index"} <= batch.episode_infos.keys()
        assert len(set(batch.episode_infos["stream"].tolist())) == ENVS_PER_WORKER


def fleet_steps(status: FleetStatus) -> int:
    return sum(w.steps_total for w in status.workers)


def still_steps(sampler: RemoteSampler, what: str) -> int:
    """Waits for idle workers and no step for 2.5 heartbeats; returns the fleet's steps.

    Steps come with heartbeats, so a reading taken while the workers run
    (or within a heartbeat of their last step) lags behind their work.
    """
    readings: list[tuple[float, int]] = []

    def still() -> bool:
        status, now = sampler.status(), time.monotonic()
        readings.append((now, fleet_steps(status)))
        idle = all(w.units_in_flight == 0 for w in status.workers)
        earlier = [steps for when, steps in readings if when <= now - 2.5]
        return idle and bool(earlier) and earlier[-1] == readings[-1][1]

    wait_until(still, what)
    return readings[-1][1]


def test_a_reader_that_stops_stops_the_workers(sampler: RemoteSampler) -> None:
    # From a still fleet: an earlier test's last second of steps is not counted yet.
    start = still_steps(sampler, "the fleet going still before the test")
    with sampler.stream(mode="episodes", max_buffered_steps=100) as stream:
        next(stream)
        stopped = still_steps(sampler, "the workers stopping for a reader that does not read")
        held = stopped - start
        # The coordinator buffer (100 steps), the subscription's 256 KiB
        # transport window and the units in flight; unbounded it runs on.
        assert held < 30_000

        def resumed() -> bool:  # reading again frees room: the workers go on
            for _ in range(20):
                next(stream)
            return fleet_steps(sampler.status()) > stopped

        wait_until(resumed, "the workers resuming")
    wait_until(lambda: sampler.status().subscribers == 0, "the subscription ending")


def test_sample_requests_take_priority_over_a_subscription(sampler: RemoteSampler) -> None:
    with sampler.stream(mode="episodes") as stream:
        next(stream)
        batch = sampler.obtain_episodes(6)
        assert batch.episode_infos["episode_index"].tolist() == list(range(6))
        more = next(stream)  # and the subscription goes on afterwards
        assert more.batch.n_episodes >= 1
