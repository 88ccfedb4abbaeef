"""Workers that beat but never finish their units, ask for too much, hold too
much in flight, or never say Hello.

Issue 12.4: a worker that sends heartbeats but never delivers its units (a
stuck C extension on a thread of its own, or a hostile worker) used to
stall every request; ``Hello.num_envs`` had no bound (2**32-1 was admitted
and handed nearly every unit). Issue 12.7: handshake-timeout refusals
flooded the coordinator's log. A real coordinator and a real worker
process; the stalling worker is scripted in this process, the only way to
make one that beats and never delivers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from rlfleet.coordinator.progress import (
    AUTO_FACTOR,
    AUTO_FLOOR_SECONDS,
    AUTO_INITIAL_SECONDS,
    ProgressWatch,
)
from rlfleet.envs import EnvConfig
from rlfleet.v1 import batch_pb2, worker_pb2
from tests._coordinator_fakes import ScriptedWorker, assert_same_batch, env_ready, join
from tests._data_worker import HeldResults, scripted_data_worker
from tests.fleet_processes import ProcessFleet, local_episodes

pytestmark = pytest.mark.timeout(240)

SEED = 7
CARTPOLE = EnvConfig("CartPole-v1")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


class Hoarder:
    """Joins, builds nothing, beats on time, takes every unit, delivers none."""

    def __init__(self, address: str, num_envs: int) -> None:
        self.stream, self.welcome = join(address, num_envs=num_envs, name="hoarder")
        env_ready(self.stream, self.stream.expect("env_update"))
        self.tasks = 0
        self._stop = threading.Event()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(self.welcome.heartbeat_interval_seconds / 2):
            self.stream.send(worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat()))

    def close(self) -> None:
        self._stop.set()
        self.stream.close()


def test_a_worker_that_beats_but_never_delivers_is_dropped_and_its_units_rerun(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator("--progress-deadline", "3")
    hoarder = Hoarder(fleet.address, num_envs=4)
    try:
        fleet.wait_for_workers(1)
        fleet.start_worker()
        fleet.wait_for_workers(2)
        sampler = fleet.sampler(seed=SEED, timeout=120)
        (expected,) = local_episodes(CARTPOLE, 12, seed=SEED)
        assert_same_batch(sampler.obtain_episodes(12), expected)
        failure = hoarder.stream.ended(timeout=30)
        assert failure is not None and failure.code is grpc.StatusCode.DEADLINE_EXCEEDED
        assert "delivered no result for 3 seconds" in failure.details, failure.details
        assert "--progress-deadline" in failure.details, failure.details
        assert [w.name for w in fleet.status().workers] == ["w0"]
    finally:
        hoarder.close()


def test_a_hello_with_too_many_env_slots_is_refused_naming_the_limit(
    fleet: ProcessFleet,
) -> None:
    fleet.start_coordinator("--max-envs-per-worker", "64")
    greedy = ScriptedWorker(fleet.address)
    try:
        greedy.hello(num_envs=2**32 - 1)
        failure = greedy.ended()
        assert failure is not None and failure.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "limit of 64 env slots per worker" in failure.details, failure.details
        assert "--max-envs-per-worker" in failure.details
    finally:
        greedy.close()
    # A real worker asking for too many exits with the reason instead of retrying.
    worker = fleet.start_worker(envs=65)
    assert worker.popen.wait(timeout=60) == 1
    assert "--max-envs-per-worker" in worker.log_text()


def test_the_auto_progress_deadline_follows_the_slowest_wait_for_a_result() -> None:
    watch = ProgressWatch()
    assert watch.deadline == AUTO_INITIAL_SECONDS  # nothing seen yet: generous
    assert watch.stalled([1], now=0.0) == []
    watch.delivered(1, now=2.0)  # a 2 s wait
    assert watch.deadline == AUTO_FLOOR_SECONDS
    assert watch.stalled([1], now=2.0 + AUTO_FLOOR_SECONDS + 1) == [1]
    watch.delivered(1, now=100.0)  # a much slower env: waits grow, so does the deadline
    assert watch.deadline == AUTO_FACTOR * 98.0
    assert watch.stalled([1], now=100.0 + AUTO_FACTOR * 98.0 - 1) == []
    assert watch.stalled([], now=5000.0) == []  # idle workers are not watched
    assert watch.stalled([1], now=5001.0) == []  # and start afresh when busy again
    assert ProgressWatch(3.0).deadline == 3.0


def test_handshake_timeout_refusals_are_rate_limited_in_the_log(fleet: ProcessFleet) -> None:
    coordinator = fleet.start_coordinator("--handshake-timeout", "1")
    silent = [ScriptedWorker(fleet.address) for _ in range(6)]  # never say Hello
    try:
        for stream in silent:
            failure = stream.ended(timeout=30)
            assert failure is not None and failure.code is grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        for stream in silent:
            stream.close()
    lines = [line for line in coordinator.log_text().splitlines() if "no Hello within" in line]
    assert len(lines) == 1, lines  # one line per 10 s, whatever the peer does


def test_a_worker_splitting_unfinished_results_over_both_carriers_is_held_to_one_limit(
    fleet: ProcessFleet,
) -> None:
    # max_inflight_bytes_per_worker bounds a worker session, not each carrier:
    # the first halves of two results, one on its Join stream and one on its
    # lease data connection, each within the limit alone, drop it together.
    limit = 1 << 20
    coordinator = fleet.start_coordinator("--env", "CartPole-v1", "--max-result-bytes", str(limit))

    def first_half(batch_id: int) -> worker_pb2.WorkerMessage:
        chunk = batch_pb2.BatchChunk(
            batch_id=batch_id,
            index=0,
            count=2,
            total_bytes=limit,
            kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
            data=bytes(limit * 6 // 10),
        )
        return worker_pb2.WorkerMessage(result=worker_pb2.EpisodeResult(chunk=chunk))

    with scripted_data_worker(fleet.address, HeldResults()) as (worker, link):
        fleet.wait_for_workers(1)
        worker.worker.send(first_half(1))
        link.send_frames([first_half(2).SerializeToString()])
        log = fleet.wait_for_log(coordinator, f"worker '{worker.welcome.name}' removed")
    assert "RESOURCE_EXHAUSTED" in log
    assert "in flight" in log
    assert f"over the limit of {limit} (max_inflight_bytes_per_worker)" in log
