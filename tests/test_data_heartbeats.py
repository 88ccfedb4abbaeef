"""Heartbeats on the lease data channel (``rlfleet.data-heartbeats``).

A worker that agreed sends its heartbeats on its data connection while it is
open: on the coordinator each is one read of the data loop, where on the
Join stream it woke gRPC's threads (docs/performance.md, "gRPC's threads per
second"). Liveness is unchanged: a frame on either connection is a sign of
life, and a worker silent on both is dropped after the heartbeat timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from rlfleet.client import Fleet
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.protocol.join import WorkerBeat
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from tests._coordinator_fakes import status
from tests._data_worker import DATA_CAPABILITIES, HeldResults, scripted_data_worker
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def beats(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, WorkerBeat]]]:
    """Each heartbeat the coordinator books: the booking thread's name and the beat."""
    booked: list[tuple[str, WorkerBeat]] = []
    book = WorkerEvents.on_heartbeat

    def on_heartbeat(self: WorkerEvents, handle: WorkerHandle, heartbeat: WorkerBeat) -> None:
        booked.append((threading.current_thread().name, heartbeat))
        book(self, handle, heartbeat)

    monkeypatch.setattr(WorkerEvents, "on_heartbeat", on_heartbeat)
    yield booked


def test_a_workers_heartbeats_take_its_data_connection(
    beats: list[tuple[str, WorkerBeat]],
) -> None:
    with Fleet.local(workers=1, envs_per_worker=3) as sampler:
        sampler.obtain_episodes(2)  # its session and data connection are up
        start = len(beats)
        wait_until(lambda: len(beats) >= start + 3, "three heartbeats")
        threads = {name for name, _ in beats[start:]}
        assert threads == {"rlfleet-data-loop"}, threads
        assert beats[-1][1].steps_total > 0  # its figures, as on the stream


def test_a_heartbeat_on_the_data_connection_is_booked_only_when_agreed(
    beats: list[tuple[str, WorkerBeat]],
) -> None:
    beat = worker_pb2.WorkerMessage(heartbeat=worker_pb2.Heartbeat(steps_total=777))
    agreed = (*DATA_CAPABILITIES, _rpc.DATA_HEARTBEATS_CAPABILITY)
    with serve(CoordinatorConfig(listen="127.0.0.1:0")) as server:
        with scripted_data_worker(server.address, HeldResults(), agreed) as (worker, link):
            assert _rpc.DATA_HEARTBEATS_CAPABILITY in worker.welcome.capabilities
            link.send_frames([beat.SerializeToString()])
            wait_until(
                lambda: any(b.steps_total == 777 for _, b in beats), "the data channel's beat"
            )
        # One that did not agree breaks the protocol there, as before: dropped.
        with scripted_data_worker(server.address, HeldResults()) as (worker, link):
            assert _rpc.DATA_HEARTBEATS_CAPABILITY not in worker.welcome.capabilities
            link.send_frames([beat.SerializeToString()])
            wait_until(lambda: not status(server.address).workers, "the worker dropped")
        assert [b.steps_total for _, b in beats].count(777) == 1
