"""The lease data channel in memory: a learner in the coordinator's own process.

``RemoteVectorEnv(Fleet.local(...))`` presents its lease's ticket to the
coordinator of its process instead of dialling its port
(``LeaseDataServer.attach_in_process``): the same frames, handed over in
memory, with the loop's rules for bad frames, closes and the stopped port.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteVectorEnv
from rlfleet.coordinator.leases.data_connections import (
    InProcessConnection,
    LeaseConnection,
    LeaseDataPeer,
)
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.coordinator.leases.translation import hello_ticket
from rlfleet.errors import ProtocolError, UnavailableError
from rlfleet.transport.in_process_link import InProcessLink
from rlfleet.wire.leases import data_hello
from tests.test_lease_data_channel import wait_until

pytestmark = pytest.mark.timeout(120)


class RecordingPeer:
    """A ticket's owner that records what its connection brings."""

    def __init__(self, fail_on: bytes = b"") -> None:
        self.frames: list[bytes | memoryview] = []
        self.closed: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.threads: list[str] = []
        self._fail_on = fail_on

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        for payload in payloads:
            self.threads.append(threading.current_thread().name)
            if payload == self._fail_on:
                raise ProtocolError("a frame this peer refuses")
            self.frames.append(payload)

    def on_closed(self, reason: str) -> None:
        self.closed.put(reason)


@pytest.fixture
def server() -> Iterator[LeaseDataServer]:
    outcomes: list[str] = []
    data = LeaseDataServer(
        "127.0.0.1:0",
        tls=None,
        max_frame_bytes=1024,
        handshake_timeout=5.0,
        parse_hello=hello_ticket,
        on_connection=outcomes.append,
    )
    data.outcomes = outcomes  # type: ignore[attr-defined]
    try:
        yield data
    finally:
        data.stop()


def attach(
    server: LeaseDataServer, peer: RecordingPeer
) -> tuple[InProcessLink, list[LeaseConnection]]:
    """Issues a ticket for ``peer`` and presents it in process."""
    made: list[LeaseConnection] = []

    def owner(connection: LeaseConnection) -> LeaseDataPeer:
        made.append(connection)
        return peer

    link = server.attach_in_process(data_hello(server.issue(owner)))
    return link, made


def test_frames_cross_in_memory_both_ways(server: LeaseDataServer) -> None:
    peer = RecordingPeer()
    link, (connection,) = attach(server, peer)
    assert isinstance(connection, InProcessConnection)
    assert server.outcomes == ["accepted"]  # type: ignore[attr-defined]
    link.send(b"call 1")
    link.send(b"call 2")
    # Handled on the sender's own thread, in order: no loop between them.
    assert peer.frames == [b"call 1", b"call 2"]
    assert peer.threads == [threading.current_thread().name] * 2
    assert not link.readable()
    with pytest.raises(TimeoutError):
        link.receive_within(0.01)
    connection.send(b"reply 1")
    connection.send(b"reply 2")
    assert link.readable()
    assert link.receive_within(1.0) == b"reply 1"
    assert link.receive() == b"reply 2"


def test_a_frame_the_coordinator_refuses_closes_the_connection(server: LeaseDataServer) -> None:
    peer = RecordingPeer(fail_on=b"bad")
    link, _ = attach(server, peer)
    link.send(b"bad")
    # As on TCP: the peer hears why (from the loop), the learner sees the end.
    assert "a frame this peer refuses" in peer.closed.get(timeout=10)
    assert link.receive_within(1.0) is None
    with pytest.raises(OSError, match="closed"):
        link.send(b"more")


def test_a_frame_above_the_limit_closes_the_connection(server: LeaseDataServer) -> None:
    peer = RecordingPeer()
    link, _ = attach(server, peer)
    link.send(b"x" * 1025)
    assert "above the limit of 1024" in peer.closed.get(timeout=10)
    assert peer.frames == []
    assert link.receive() is None


def test_closing_either_end_tells_the_other(server: LeaseDataServer) -> None:
    learner_peer = RecordingPeer()
    link, _ = attach(server, learner_peer)
    link.close()
    assert learner_peer.closed.get(timeout=10) == "closed by the peer"
    with pytest.raises(OSError):
        link.send(b"after close")

    coordinator_peer = RecordingPeer()
    link, (connection,) = attach(server, coordinator_peer)
    got: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    reader = threading.Thread(target=lambda: got.put(link.receive()))
    reader.start()  # blocked in receive until the coordinator closes
    connection.close("the lease ended")
    assert got.get(timeout=10) is None
    reader.join(10)
    assert coordinator_peer.closed.get(timeout=10) == "the lease ended"


def test_bad_tickets_and_a_stopped_port_are_refused(server: LeaseDataServer) -> None:
    with pytest.raises(UnavailableError, match="unknown, used or revoked ticket"):
        server.attach_in_process(data_hello(b"\0" * 32))
    ticket = server.issue(lambda connection: RecordingPeer())
    server.attach_in_process(data_hello(ticket))
    with pytest.raises(UnavailableError, match="unknown, used or revoked"):
        server.attach_in_process(data_hello(ticket))  # single use
    assert server.outcomes == ["refused", "accepted", "refused"]  # type: ignore[attr-defined]

    def gone(connection: LeaseConnection) -> LeaseDataPeer:
        raise UnavailableError("lease 7 ended before its data connection")

    with pytest.raises(UnavailableError, match="lease 7 ended"):
        server.attach_in_process(data_hello(server.issue(gone)))
    server.stop()
    with pytest.raises(UnavailableError, match="stopped"):
        server.attach_in_process(data_hello(server.issue(gone)))


def test_a_local_fleets_learner_leases_in_memory_and_an_ended_connection_ends_the_lease() -> None:
    fleet = Fleet.local(workers=1, envs_per_worker=2)
    try:
        server = fleet.server.coordinator.lease_data
        assert server is not None
        venv = RemoteVectorEnv(fleet, "CartPole-v1", 2)
        try:
            assert venv._stream.carrier == "in-process"
            venv.reset(seed=0)
            obs, *_ = venv.step(np.zeros(2, np.int64))
            assert obs.shape == (2, 4)
            (connection,) = [
                c for c in list(server._connections) if isinstance(c, InProcessConnection)
            ]
            connection.close("cut by the test")
            wait_until(lambda: fleet.sampler.status().leased_envs == 0, "the lease released")
            with pytest.raises(UnavailableError, match="data connection"):
                venv.step(np.zeros(2, np.int64))
        finally:
            venv.close()
        # The closed lease's connection is forgotten: the worker's is left.
        wait_until(
            lambda: not any(isinstance(c, InProcessConnection) for c in list(server._connections)),
            "the in-process connection forgotten",
        )
    finally:
        fleet.close()
