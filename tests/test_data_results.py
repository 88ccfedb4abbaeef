"""Workers' results on the lease data channel (leases.proto, "Results on the lease data channel").

A worker that hosts leases and agreed on ``rlfleet.data-results`` sends its
results as frames on its session's data connection; the coordinator books
them exactly as Join-stream results. Real coordinator and worker processes
on loopback: results arrive there (the coordinator's
``rlfleet_lease_data_frames{party="results"}``) and are booked once; a
worker killed mid-request loses and duplicates nothing; a leaving worker
whose last results are still on its data connection when its Join stream
ends keeps them. (The fallback to the Join stream when the data port is
closed, and TLS, are tests/test_lease_data_channel.py's.)
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.coordinator.leases.data_connections import InProcessConnection
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.coordinator.leases.result_lane import ResultLane
from rlfleet.envs import EnvConfig
from rlfleet.errors import RlfleetTimeoutError
from rlfleet.transport.lease_channel import LeaseDataLink
from rlfleet.v1 import batch_pb2, learner_pb2, worker_pb2
from rlfleet.wire.chunks import DATA_CHANNEL_CHUNK_BYTES
from tests._coordinator_fakes import (
    Answer,
    assert_same_batch,
    reference_episodes,
    sample,
)
from tests._data_worker import HeldResults, scripted_data_worker
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    ProcessFleet,
    env_flags,
    local_episodes,
    run_in_thread,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

SEED = 21
EPISODES = 2  # SAMPLE_MODE_EPISODES
#: What a worker logs when its session's results take the data channel.
ON_DATA = "this session's results go on the lease data channel"


def data_frames(fleet: Fleet, party: str) -> float:
    registry = fleet.server.coordinator.metrics.registry
    return registry.get_sample_value("rlfleet_lease_data_frames_total", {"party": party}) or 0.0


def accepted(fleet: Fleet) -> float:
    registry = fleet.server.coordinator.metrics.registry
    value = registry.get_sample_value(
        "rlfleet_lease_data_connections_total", {"outcome": "accepted"}
    )
    return value or 0.0


def forwarded_results(fleet: Fleet) -> float:
    registry = fleet.server.coordinator.metrics.registry
    return registry.get_sample_value("rlfleet_results_total") or 0.0


def test_a_result_of_megabytes_travels_as_one_frame_of_the_data_channel() -> None:
    # Episodes of 20 Atari-sized frames, 4 finishing together: results of
    # megabytes, above the Join stream's 1 MiB chunks. On the data channel it is one
    # chunk, so one frame (one read, parse and hand-off on the coordinator)
    # per result, and the learner gets the same batch as LocalSampler's.
    env = EnvConfig("rlfleet/Frames-v0", {"length": 20}, imports=(TEST_ENVS_MODULE,))
    fleet = Fleet.local(workers=1, envs_per_worker=4, env=env, seed=SEED)
    try:
        wait_until(lambda: accepted(fleet) == 1, "the worker's data connection")
        expected = local_episodes(env, 8, seed=SEED)[0]
        batch = fleet.sampler.obtain_episodes(8)
        assert_same_batch(batch, expected)
        assert batch.observations.nbytes > 4 * (1 << 20)
        results = forwarded_results(fleet)
        assert results >= 1
        assert data_frames(fleet, "results") == results  # not one frame per 1 MiB
    finally:
        fleet.close()


def test_results_of_megabytes_reach_a_remote_learner_intact(processes: ProcessFleet) -> None:
    # The same one-frame results over TCP on both hops (worker -> coordinator
    # -> the learner's own data connection), as separate processes.
    env = EnvConfig("rlfleet/Frames-v0", {"length": 20}, imports=(TEST_ENVS_MODULE,))
    processes.start_coordinator(*env_flags(env))
    processes.start_worker(envs=4, imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(1)
    with RemoteSampler(processes.address, seed=SEED, timeout=120) as sampler:
        batch = sampler.obtain_episodes(8)
    assert batch.observations.nbytes > 4 * (1 << 20)
    assert_same_batch(batch, local_episodes(env, 8, seed=SEED)[0])
    assert ON_DATA in processes.workers[0].log_text()


def test_a_learner_with_a_small_message_limit_gets_results_of_megabytes_intact(
    processes: ProcessFleet,
) -> None:
    # Results of about 5 MiB (4 episodes of 50 Atari-sized frames finishing
    # together) travel as one frame each and are forwarded as they came: a
    # learner whose own limit is 2 MiB still takes them, on its data
    # connection and on gRPC alike (FORWARDED_RESULT_BYTES).
    env = EnvConfig("rlfleet/Frames-v0", {"length": 50}, imports=(TEST_ENVS_MODULE,))
    processes.start_coordinator(*env_flags(env))
    processes.start_worker(envs=4, imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(1)
    expected = local_episodes(env, 4, 4, seed=SEED)
    with RemoteSampler(
        processes.address, seed=SEED, timeout=120, max_message_bytes=2 << 20
    ) as sampler:
        batch = sampler.obtain_episodes(4)
        assert sampler.result_route.carrier == "data"
        sampler.result_route.close()  # the next answer's results come on gRPC
        on_grpc = sampler.obtain_episodes(4)
        assert sampler.result_route.carrier == "grpc"
    assert batch.observations.nbytes > 5 * (1 << 20)
    assert_same_batch(batch, expected[0])
    assert_same_batch(on_grpc, expected[1])
    assert ON_DATA in processes.workers[0].log_text()


def test_results_travel_on_the_data_channel_and_are_booked_once() -> None:
    fleet = Fleet.local(workers=2, envs_per_worker=2, seed=SEED)
    try:
        wait_until(lambda: accepted(fleet) == 2, "the workers' data connections")
        expected = local_episodes(EnvConfig("CartPole-v1"), 12, 6, seed=SEED)
        batch = fleet.sampler.obtain_episodes(12)
        assert_same_batch(batch, expected[0])  # each episode once, none lost
        assert data_frames(fleet, "results") >= 2  # both workers' results came there
        # The fleet goes on: a second request is booked the same way.
        before = data_frames(fleet, "results")
        assert_same_batch(fleet.sampler.obtain_episodes(6), expected[1])
        assert data_frames(fleet, "results") > before
    finally:
        fleet.close()


def _two_requests_on_a_local_fleet() -> None:
    """Two requests (12 and 6 episodes) on a local fleet of 2 workers whose
    results take their data connections, each batch what a local sampler
    makes."""
    fleet = Fleet.local(workers=2, envs_per_worker=2, seed=SEED)
    try:
        wait_until(lambda: accepted(fleet) == 2, "the workers' data connections")
        expected = local_episodes(EnvConfig("CartPole-v1"), 12, 6, seed=SEED)
        assert_same_batch(fleet.sampler.obtain_episodes(12), expected[0])
        assert_same_batch(fleet.sampler.obtain_episodes(6), expected[1])
    finally:
        fleet.close()


def test_the_data_loop_books_and_sends_a_workers_results_without_waking_its_lane(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Once a worker's lane holds nothing (its first results may wait in it
    # for the results switch marker on the Join stream, a warm-up request
    # here), the data loop that read its results books them at the end of
    # its wake-up and writes them on the learner's results connection: no
    # hand-off to the lane's thread or the call's. The call's footer, in
    # place of the end marker, still follows every result of the call,
    # with their count.
    frames: list[tuple[str, learner_pb2.SampleResponse]] = []
    send_parts = InProcessConnection.send_parts
    lanes: list[ResultLane] = []
    given: list[str] = []
    make, give = ResultLane.__init__, ResultLane._give

    def recorded(
        self: InProcessConnection, parts: Sequence[bytes | memoryview], wait: float
    ) -> None:
        message = learner_pb2.SampleResponse.FromString(b"".join(parts))
        frames.append((threading.current_thread().name, message))
        send_parts(self, parts, wait)

    def made(self: ResultLane, *args: Any, **kwargs: Any) -> None:
        make(self, *args, **kwargs)
        lanes.append(self)

    def given_to_the_lane(self: ResultLane, item: Any) -> None:
        given.append(type(item).__name__)
        give(self, item)

    monkeypatch.setattr(ResultLane, "__init__", made)
    monkeypatch.setattr(ResultLane, "_give", given_to_the_lane)
    fleet = Fleet.local(workers=2, envs_per_worker=2, seed=SEED)
    try:
        wait_until(lambda: accepted(fleet) == 2, "the workers' data connections")
        expected = local_episodes(EnvConfig("CartPole-v1"), 8, 12, 6, seed=SEED)
        assert_same_batch(fleet.sampler.obtain_episodes(8), expected[0])
        wait_until(
            lambda: len(lanes) == 2 and all(lane._given == lane._taken for lane in lanes),
            "the lanes done with the warm-up",
        )
        given.clear()
        monkeypatch.setattr(InProcessConnection, "send_parts", recorded)
        assert_same_batch(fleet.sampler.obtain_episodes(12), expected[1])
        assert_same_batch(fleet.sampler.obtain_episodes(6), expected[2])
    finally:
        fleet.close()
    calls: dict[int, list[tuple[str, learner_pb2.SampleResponse]]] = {}
    for name, message in frames:
        calls.setdefault(message.result_call, []).append((name, message))
    assert len(calls) == 2
    for sent in calls.values():
        # The request went on the connection: its header comes there first.
        (_, header), *results, (_, end) = sent
        assert header.HasField("header") and header.header.results_on_data
        assert results and all(m.HasField("result") for _, m in results)
        assert all(name == "rlfleet-data-loop" for name, _ in results)
        assert end.HasField("footer") and end.footer.data_results == len(results)
    assert set(given) <= {"_Closed"}  # the connections' ends, at the fleet's close


def test_a_workers_result_frames_reach_its_lane_once_the_loops_wake_up_was_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The data loop queues a worker's result frames for its lane as it reads
    # them and wakes the lane's thread once it served that wake-up
    # (LeaseDataServer.after_wake_up, on the loop's thread); every result
    # is still booked once.
    asked: list[str] = []
    after_wake_up = LeaseDataServer.after_wake_up

    def recorded(self: LeaseDataServer, hand_over: Callable[[], None]) -> None:
        if isinstance(getattr(hand_over, "__self__", None), ResultLane):
            asked.append(threading.current_thread().name)
        after_wake_up(self, hand_over)

    monkeypatch.setattr(LeaseDataServer, "after_wake_up", recorded)
    _two_requests_on_a_local_fleet()
    assert len(asked) >= 2 and set(asked) == {"rlfleet-data-loop"}


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as fleet:
        yield fleet


def test_a_worker_killed_mid_request_loses_and_duplicates_nothing(
    processes: ProcessFleet,
) -> None:
    processes.start_coordinator(*env_flags(SLOW_ENV))
    for _ in range(3):
        processes.start_worker(imports=[TEST_ENVS_MODULE])
    processes.wait_for_workers(3)
    victim = processes.workers[0]
    answer = run_in_thread(
        lambda: sample(processes.address, mode=EPISODES, amount=24, seed=SEED, request_index=0)
    )
    # Killed once some of its results went on the data channel, with units still to run.
    processes.wait_for_log(victim, ON_DATA)
    processes.wait_until(lambda: processes.units_on(victim.name), what="units on the victim")
    processes.kill(victim)
    result: Answer = answer(120)

    assert_same_batch(result.batch, local_episodes(SLOW_ENV_TWIN, 24, seed=SEED)[0])
    assert result.footer.num_episodes == 24
    assert result.footer.reassigned_units >= 1
    for survivor in processes.workers[1:]:
        assert ON_DATA in survivor.log_text()


def test_a_leaving_workers_last_results_on_the_data_channel_are_kept(
    processes: ProcessFleet,
) -> None:
    # The worker's Join stream ends (Leaving, then its half-close) before its
    # last results arrive on its data connection: the coordinator waits for
    # them (and the end-of-results marker) before it books the worker's end,
    # so they are booked, not written off and re-run.
    coordinator = processes.start_coordinator("--env", "CartPole-v1")
    held = HeldResults()
    with scripted_data_worker(processes.address, held) as (worker, link):
        processes.wait_for_workers(1)
        answer = run_in_thread(
            lambda: sample(processes.address, mode=EPISODES, amount=2, seed=SEED, request_index=0)
        )
        wait_until(lambda: held.results >= 1, "the worker to run its task")
        leaving = worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason="scaled down"))
        worker.worker.send(leaving)
        worker.worker.finish()  # the Join stream's half-close
        processes.wait_for_log(coordinator, "waiting up to")
        link.send_frames(held.messages)
        link.send(leaving.SerializeToString())  # the end-of-results marker
        result: Answer = answer(60)
        log = processes.wait_for_log(coordinator, "removed (OK")  # it left
    expected = reference_episodes(range(2), seed=SEED, request_index=0)
    assert_same_batch(result.batch, expected)
    assert result.footer.reassigned_units == 0  # booked, not re-run
    assert "did not deliver its last results" not in log


def test_a_result_for_a_written_off_session_is_never_booked(processes: ProcessFleet) -> None:
    # A worker whose Join stream broke is written off and its units re-run
    # elsewhere; what it still sends on its data connection is not booked.
    coordinator = processes.start_coordinator("--env", "CartPole-v1")
    held = HeldResults()
    with scripted_data_worker(processes.address, held) as (worker, link):
        processes.wait_for_workers(1)
        answer = run_in_thread(
            lambda: sample(processes.address, mode=EPISODES, amount=4, seed=SEED, request_index=0)
        )
        wait_until(lambda: held.results >= 1, "the worker to run its task")
        worker.worker.close()  # its Join stream breaks, as a killed process's would
        processes.wait_for_log(coordinator, "stream broke")
        with contextlib.suppress(OSError):  # the coordinator may have closed it already
            link.send_frames(held.messages)
        processes.start_worker()  # runs the written-off units
        result: Answer = answer(120)
    assert_same_batch(result.batch, reference_episodes(range(4), seed=SEED, request_index=0))
    assert result.footer.num_episodes == 4
    assert result.footer.reassigned_units >= 1


def test_a_sampler_sees_data_channel_results_like_join_stream_results(
    processes: ProcessFleet,
) -> None:
    # One worker sends its results on the data channel, one (--lease-slots 0:
    # no data connection) on its Join stream: the same batch as LocalSampler's.
    processes.start_coordinator()
    processes.start_worker(envs=2)
    processes.start_worker("--lease-slots", "0", envs=2)
    processes.wait_for_workers(2)
    with RemoteSampler(processes.address, seed=SEED, timeout=120) as sampler:
        expected = local_episodes(EnvConfig("CartPole-v1"), 16, seed=SEED)[0]
        assert_same_batch(sampler.obtain_episodes(16), expected)
    first, second = processes.workers
    assert ON_DATA in first.log_text()
    assert "results go on" not in second.log_text()


def test_a_send_the_coordinator_does_not_take_fails_at_the_send_timeout() -> None:
    # The worker writes results from its stepping thread: a coordinator that
    # stops reading must not block it for ever.
    ours, theirs = socket.socketpair()
    try:
        link = LeaseDataLink(ours, 1 << 20)
        link.set_send_timeout(0.2)
        with pytest.raises(RlfleetTimeoutError, match=r"0\.2 seconds"):
            for _ in range(1000):  # far more than the socket buffers hold
                link.send_frames([bytes(1 << 20)])
    finally:
        ours.close()
        theirs.close()


def test_a_result_that_breaks_the_protocol_on_the_data_channel_drops_its_worker(
    processes: ProcessFleet,
) -> None:
    # Refused as on the Join stream: the worker is dropped with INVALID_ARGUMENT.
    coordinator = processes.start_coordinator("--env", "CartPole-v1")
    with scripted_data_worker(processes.address, HeldResults()) as (worker, link):
        processes.wait_for_workers(1)
        chunkless = worker_pb2.WorkerMessage(result=worker_pb2.EpisodeResult(task_id=12345))
        link.send_frames([chunkless.SerializeToString()])
        log = processes.wait_for_log(coordinator, f"worker '{worker.welcome.name}' removed")
    assert "INVALID_ARGUMENT" in log and "without its chunk" in log


def test_a_result_chunk_above_the_data_channels_bound_drops_its_worker(
    processes: ProcessFleet,
) -> None:
    # A chunk above 8 MiB would reach learners above what they accept: refused
    # (the worker dropped with INVALID_ARGUMENT) before it is joined or forwarded.
    coordinator = processes.start_coordinator("--env", "CartPole-v1")
    with scripted_data_worker(processes.address, HeldResults()) as (worker, link):
        processes.wait_for_workers(1)
        size = DATA_CHANNEL_CHUNK_BYTES + 1
        chunk = batch_pb2.BatchChunk(
            batch_id=0,
            index=0,
            count=1,
            total_bytes=size,
            kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
            data=bytes(size),
        )
        result = worker_pb2.EpisodeResult(task_id=12345, chunk=chunk)
        link.send_frames([worker_pb2.WorkerMessage(result=result).SerializeToString()])
        log = processes.wait_for_log(coordinator, f"worker '{worker.welcome.name}' removed")
    assert "INVALID_ARGUMENT" in log
    assert f"result chunk of {size} bytes" in log
    assert f"over the data channel's {DATA_CHANNEL_CHUNK_BYTES} bytes" in log
