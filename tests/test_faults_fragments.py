"""Fragments under faults: long windows, bounded windows.

Issue 12.3 (a worker stepping a long fragment window used to send no
heartbeats, and fragment_length had no bound). Real coordinator and worker
processes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, InvalidArgumentError
from rlfleet.local_sampler import LocalSampler
from tests._coordinator_fakes import assert_same_batch
from tests.fleet_processes import TEST_ENVS_MODULE, ProcessFleet, env_flags, run_in_thread

pytestmark = pytest.mark.timeout(240)

SEED = 61
#: 10 ms per step: a 400-step window lasts 4 s, past the tests' 3 s heartbeat timeout.
SLOW = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 0.01, "length": 150})
SLOW_TWIN = EnvConfig("rlfleet/Counter-v0", {"length": 150}, imports=(TEST_ENVS_MODULE,))
WINDOW = 400
VERSION = ("worker", "agent_version")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def test_a_worker_heartbeats_while_it_steps_a_window_longer_than_the_timeout(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator(*env_flags(SLOW))  # heartbeat timeout 3 s
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    before = fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=60)
    with LocalSampler(SLOW_TWIN, seed=SEED) as local:
        expected = [local.obtain_fragments(WINDOW, WINDOW) for _ in range(2)]
    for want in expected:
        assert_same_batch(sampler.obtain_fragments(WINDOW, WINDOW), want, skip_infos=VERSION)
    after = fleet.status()
    # Never declared dead: the same worker answered both windows.
    assert [w.worker_id for w in after.workers] == [w.worker_id for w in before.workers]


def test_fragment_length_is_bounded_with_an_error_naming_the_limit(fleet: ProcessFleet) -> None:
    fleet.start_coordinator("--max-fragment-length", "1000")
    fleet.start_worker()
    fleet.wait_for_workers(1)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    with pytest.raises(InvalidArgumentError) as refused:
        sampler.obtain_fragments(10**6, 10**6)
    message = str(refused.value)
    assert "fragment_length 1000000" in message, message
    assert "1000" in message and "--max-fragment-length" in message, message
    # The client refuses what the protocol cannot carry before sending it.
    with pytest.raises(ConfigError, match="fragment_length"):
        sampler.obtain_fragments(100, 2**32)
    assert sampler.obtain_fragments(20, 10).total_steps == 20  # the fleet goes on


def stream_pieces(batch: EpisodeBatch, stream: int) -> EpisodeBatch:
    """The pieces of one stream, in the batch's order."""
    return batch.take_episodes(np.flatnonzero(batch.episode_infos["stream"] == stream))


def test_a_worker_killed_mid_fragments_request_costs_other_streams_pieces_not_data(
    fleet: ProcessFleet,
) -> None:
    """What holds today when a worker dies mid fragments request (issue 12.6 is open).

    Every piece the answer holds is its stream's undisturbed piece, in order,
    none lost, none twice; the dead stream's missing windows are made up by
    the survivor's stream, so the answer is not the undisturbed one. A
    replacement worker gets a new stream, which starts at its first episode.
    """
    length, amount = 50, 200  # 0.5 s windows; undisturbed: two rounds of both streams
    fleet.start_coordinator(*env_flags(SLOW))
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.start_worker(imports=[TEST_ENVS_MODULE])
    fleet.wait_for_workers(2)
    victim = fleet.workers[0]
    with LocalSampler(SLOW_TWIN, seed=SEED, n_workers=2) as local:
        undisturbed = local.obtain_fragments(amount, length)
    # Streams 0-2 (the replacement's is 2), long enough for a longer disturbed run.
    with LocalSampler(SLOW_TWIN, seed=SEED, n_workers=3) as local:
        reference = local.obtain_fragments(8 * amount, length)
    sampler = fleet.sampler(seed=SEED, timeout=120)
    answer = run_in_thread(lambda: sampler.obtain_fragments(amount, length))
    fleet.wait_until(lambda: fleet.units_on(victim.name), what="windows on the victim")
    fleet.kill(victim)
    result = answer(120)

    assert result.total_steps >= amount and result.total_steps % length == 0
    assert int(result.lengths.max()) <= length
    keys = list(
        zip(
            *(
                result.episode_infos[k].tolist()
                for k in ("stream", "episode_index", "fragment_index")
            ),
            strict=True,
        )
    )
    assert keys == sorted(set(keys)), "pieces repeated or out of order"
    streams = sorted(set(result.episode_infos["stream"].tolist()))
    assert set(streams) <= {0, 1}, streams  # the victim's stream only if it sent a window
    for stream in streams:
        got = stream_pieces(result, stream)
        want = stream_pieces(reference, stream).take_episodes(np.arange(got.n_episodes))
        assert_same_batch(got, want, skip_infos=VERSION)
    # The defect issue 12.6 is about: other streams' pieces stand in for the dead one's.
    assert result.total_steps != undisturbed.total_steps or not np.array_equal(
        result.episode_infos["stream"], undisturbed.episode_infos["stream"]
    )

    fleet.start_worker(imports=[TEST_ENVS_MODULE])  # the replacement
    fleet.wait_for_workers(2)
    survivor = max(streams, key=lambda s: stream_pieces(result, s).total_steps)
    after = sampler.obtain_fragments(2 * length, length)
    assert sorted(set(after.episode_infos["stream"].tolist())) == [survivor, 2]
    fresh = stream_pieces(after, 2)
    assert_same_batch(
        fresh,
        stream_pieces(reference, 2).take_episodes(np.arange(fresh.n_episodes)),
        skip_infos=VERSION,
    )
