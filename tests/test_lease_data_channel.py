"""The lease data channel (leases.proto, docs/protocol.md "The lease data channel").

Real coordinators and worker processes on loopback: lease calls and replies
travel on the framed TCP port (counted by the coordinator's metrics), a bad
ticket is refused, an mTLS fleet uses it with its certificates, a closed port
falls back to gRPC, and a broken data connection (cut with ``ss -K``, as a
network fault would) ends the learner's lease or writes the worker off with
its envs re-created elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import itertools
import logging
import select
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import gymnasium as gym
import numpy as np
import psutil
import pytest

from benchmarks.data_loop import CountedReads
from rlfleet.client import Fleet, RemoteSampler, RemoteVectorEnv
from rlfleet.client.fleet import spawn_worker, stop_processes
from rlfleet.client.leases.lease_stream import LeaseStream
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.coordinator.config import LEASE_DATA_OFF
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, RlfleetTimeoutError, UnavailableError
from rlfleet.security import ClientTLS, ServerSecurity, ServerTLS
from rlfleet.transport import lease_channel
from rlfleet.transport.data_address import coordinator_host
from rlfleet.transport.lease_channel import (
    FRAME_HEADER,
    LeaseDataLink,
    dial,
    frame,
)
from rlfleet.transport.rpc import LEASE_CAPABILITY
from rlfleet.v1 import worker_pb2
from rlfleet.wire.leases import data_hello
from rlfleet.worker.leases.data_link import WorkerLeaseChannel
from tests._coordinator_fakes import CAPABILITIES, join
from tests.fleet_processes import ProcessFleet, free_port
from tests.tls_fixtures import make_ca, make_cert
from tests.waiting import PATIENCE, wait_until

pytestmark = pytest.mark.timeout(180)

LOST = "rlfleet_env_lost"


def frames(fleet: Fleet, party: str) -> float:
    """Lease messages the coordinator received on the data channel from ``party``."""
    registry = fleet.server.coordinator.metrics.registry
    return registry.get_sample_value("rlfleet_lease_data_frames_total", {"party": party}) or 0.0


def worker_frames_reach(fleet: Fleet, target: float) -> bool:
    return frames(fleet, "worker") >= target


def connections(fleet: Fleet, outcome: str) -> float:
    registry = fleet.server.coordinator.metrics.registry
    value = registry.get_sample_value("rlfleet_lease_data_connections_total", {"outcome": outcome})
    return value or 0.0


def data_port(fleet: Fleet) -> int:
    server = fleet.server.coordinator.lease_data
    assert server is not None
    return server.port


def cut(pid: int, port: int) -> int:
    """Destroys the TCP connections process ``pid`` holds to ``port`` (``ss -K``)."""
    if shutil.which("ss") is None:
        pytest.skip("ss (iproute2) is not installed: cannot cut a connection")
    found = [
        c
        for c in psutil.Process(pid).net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]
    for c in found:
        result = subprocess.run(
            ["ss", "-K", "src", c.laddr.ip, "sport", "=", f":{c.laddr.port}",
             "dst", c.raddr.ip, "dport", "=", f":{port}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.skip(f"ss -K is not allowed here: {result.stderr.strip()}")
    return len(found)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    local = Fleet.local(workers=2, envs_per_worker=4)
    try:
        yield local
    finally:
        local.close()


@pytest.mark.parametrize("through", ["address", "fleet"])
def test_lease_calls_and_replies_travel_on_the_data_channel(fleet: Fleet, through: str) -> None:
    """Over TCP from a learner that dials, in memory from one in the coordinator's process."""
    # Both workers' sessions attached theirs when they joined.
    wait_until(lambda: connections(fleet, "accepted") == 2, "the workers' data connections")
    where = fleet.address if through == "address" else fleet
    with RemoteVectorEnv(where, "CartPole-v1", 4) as venv:
        assert venv._stream.carrier == ("data" if through == "address" else "in-process")
        assert connections(fleet, "accepted") == 3
        assert sorted(set(venv.env_workers)) == ["local-0", "local-1"]
        venv.reset(seed=[0, 1, 2, 3])
        learner, worker = frames(fleet, "learner"), frames(fleet, "worker")
        for _ in range(10):
            _, _, terminated, truncated, _ = venv.step(np.zeros(4, np.int64))
            done = np.flatnonzero(terminated | truncated).tolist()
            if done:
                venv.reset(done)
        # Each sync step is one call, answered by both hosting workers.
        assert frames(fleet, "learner") >= learner + 10
        assert frames(fleet, "worker") >= worker + 20
        # The latency metric is the same whichever carrier the call came on.
        histogram = fleet.server.coordinator.metrics.registry.get_sample_value(
            "rlfleet_lease_call_duration_seconds_count", {"op": "step"}
        )
        assert histogram is not None and histogram >= 10
    wait_until(lambda: fleet.sampler.status().leases == 0, "the lease released")


def test_a_bad_ticket_or_first_frame_is_refused_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="rlfleet.coordinator")
    with serve(CoordinatorConfig(listen="127.0.0.1:0")) as server:
        assert server.coordinator.lease_data is not None
        port = server.coordinator.lease_data.port
        assert port != server.port
        with pytest.raises(UnavailableError, match="closed the connection instead of accepting"):
            dial("127.0.0.1", port, data_hello(b"x" * 32), tls=None, timeout=10, max_frame_bytes=1)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(FRAME_HEADER.pack(1 << 30))  # not a LeaseDataHello: far too long
            assert sock.recv(1) == b""  # closed, nothing answered
        registry = server.coordinator.metrics.registry
        refused = registry.get_sample_value(
            "rlfleet_lease_data_connections_total", {"outcome": "refused"}
        )
        assert refused == 2
    refusals = [r.getMessage() for r in caplog.records if "refused a lease data" in r.getMessage()]
    # Rate-limited: a peer hammering the port gets one line per interval.
    assert len(refusals) == 1
    assert "unknown, used or revoked ticket" in refusals[0]


class _Quiet:
    """A data connection's peer that ignores its traffic."""

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        pass

    def on_closed(self, reason: str) -> None:
        pass


def test_tickets_are_single_use_and_revocable() -> None:
    with serve(CoordinatorConfig(listen="127.0.0.1:0")) as server:
        data = server.coordinator.lease_data
        assert data is not None
        ticket = data.issue(lambda connection: _Quiet())
        dial("127.0.0.1", data.port, data_hello(ticket), tls=None, timeout=10,
             max_frame_bytes=1).close()  # fmt: skip
        with pytest.raises(UnavailableError):
            dial("127.0.0.1", data.port, data_hello(ticket), tls=None, timeout=10,
                 max_frame_bytes=1)  # fmt: skip
        revoked = data.issue(lambda connection: _Quiet())
        data.revoke(revoked)
        with pytest.raises(UnavailableError):
            dial("127.0.0.1", data.port, data_hello(revoked), tls=None, timeout=10,
                 max_frame_bytes=1)  # fmt: skip


def test_the_data_channel_can_be_turned_off_or_moved() -> None:
    with serve(CoordinatorConfig(listen="127.0.0.1:0", lease_data_listen=LEASE_DATA_OFF)) as off:
        assert off.coordinator.lease_data is None
    # + 2: + 1 is the documented plaintext health port.
    assert CoordinatorConfig(listen="0.0.0.0:50051").lease_data_address == "0.0.0.0:50053"
    with pytest.raises(ConfigError, match="no port \\+ 2"):
        CoordinatorConfig(listen="127.0.0.1:65534")
    assert CoordinatorConfig(listen="127.0.0.1:0").lease_data_address == "127.0.0.1:0"
    with pytest.raises(ConfigError, match="--lease-data-listen"):
        CoordinatorConfig(lease_data_listen="50052")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError, match=r"lease data channel.*--lease-data-listen off"):
            serve(CoordinatorConfig(listen="127.0.0.1:0", lease_data_listen=busy))


def test_leases_stay_on_grpc_when_the_channel_is_off() -> None:
    with (
        Fleet.local(
            workers=1, envs_per_worker=2, coordinator_options={"lease_data_listen": LEASE_DATA_OFF}
        ) as sampler,
        RemoteVectorEnv(sampler, "CartPole-v1", 2) as venv,
    ):
        venv.reset(seed=0)
        obs, _, _, _, _ = venv.step(np.zeros(2, np.int64))
        assert obs.shape == (2, 4)


def test_leases_fall_back_to_grpc_when_the_data_port_is_closed(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rlfleet.transport.lease_channel")
    server = fleet.server.coordinator.lease_data
    assert server is not None
    port = server.port
    # Both workers' sessions attach theirs after they join: stopping the port
    # before that would leave them on gRPC without a broken connection.
    wait_until(lambda: connections(fleet, "accepted") == 2, "the workers' data connections")
    before = {w.worker_id for w in fleet.sampler.status().workers}
    server.stop()  # the port closes (as behind a proxy that passes gRPC only)
    # The workers' data connections broke: they rejoin, and stay on gRPC.
    wait_until(
        lambda: all(not cut_pid_has(w.process.pid, port) for w in fleet.workers),
        "the workers' data connections to close",
    )

    def rejoined() -> bool:
        now = {w.worker_id for w in fleet.sampler.status().workers}
        return len(now) == 2 and not now & before

    # New sessions (the old ones end up to JOIN_END_GRACE_SECONDS later).
    wait_until(rejoined, "the workers to rejoin")
    received = frames(fleet, "learner"), frames(fleet, "worker")
    with RemoteVectorEnv(fleet, "CartPole-v1", 4, open_timeout=60) as venv:
        venv.reset(seed=0)
        for _ in range(5):
            _, _, terminated, truncated, _ = venv.step(np.zeros(4, np.int64))
            done = np.flatnonzero(terminated | truncated).tolist()
            if done:
                venv.reset(done)
    assert (frames(fleet, "learner"), frames(fleet, "worker")) == received
    # Results stay on the Join stream too, and arrive whole.
    results = frames(fleet, "results")
    assert fleet.sampler.obtain_episodes(4).n_episodes == 4
    assert frames(fleet, "results") == results
    warnings = [r.getMessage() for r in caplog.records if "lease data channel" in r.getMessage()]
    assert len(warnings) == 1  # once per process and address, naming the port to open
    assert f"Open TCP port {port}" in warnings[0]


def cut_pid_has(pid: int, port: int) -> bool:
    return any(
        c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        for c in psutil.Process(pid).net_connections("tcp")
    )


def test_a_broken_learner_data_connection_ends_the_lease_and_releases_it(fleet: Fleet) -> None:
    venv = RemoteVectorEnv(fleet.sampler, "CartPole-v1", 4)  # a sampler dials: TCP
    try:
        assert venv._stream.carrier == "data"
        venv.reset(seed=0)
        assert fleet.sampler.status().leased_envs == 4
        assert cut(psutil.Process().pid, data_port(fleet)) == 1
        wait_until(lambda: fleet.sampler.status().leased_envs == 0, "the lease released")
        with pytest.raises(UnavailableError, match="data connection"):
            venv.step(np.zeros(4, np.int64))
    finally:
        venv.close()


def test_a_broken_worker_data_connection_is_a_lost_worker(fleet: Fleet) -> None:
    with RemoteVectorEnv(fleet, "CartPole-v1", 4, call_timeout=60) as venv:
        hosts = venv.env_workers
        venv.reset(seed=[0, 1, 2, 3])
        victim = next(w for w in fleet.workers if w.name == "local-0")
        assert cut(victim.process.pid, data_port(fleet)) == 1
        _, _, _, truncated, infos = venv.step(np.zeros(4, np.int64))
        lost = [i for i, host in enumerate(hosts) if host == "local-0"]
        assert lost
        for i in range(4):  # re-created on local-1: cut and flagged; the others untouched
            assert truncated[i] == (i in lost)
            assert (LOST in infos[i]) == (i in lost)
        venv.reset(lost)
        venv.step(np.zeros(4, np.int64))
    # The worker rejoined with a new session (and a new data connection).
    wait_until(lambda: len(fleet.sampler.status().workers) == 2, "local-0 to rejoin")
    wait_until(lambda: connections(fleet, "accepted") >= 4, "its new data connection")


def test_an_mtls_fleet_carries_leases_on_the_data_channel(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server_cert, server_key = make_cert(ca, "rlfleet-coordinator").write(tmp_path, "server")
    worker_cert, worker_key = make_cert(ca, "w", client=True).write(tmp_path, "worker")
    learner_cert, learner_key = make_cert(ca, "l", client=True).write(tmp_path, "learner")
    tls = ServerTLS.from_files(server_cert, server_key, client_ca=tmp_path / "ca.crt")
    with serve(CoordinatorConfig(listen="127.0.0.1:0", security=ServerSecurity(tls=tls))) as server:
        worker = spawn_worker(
            server.address,
            name="secure",
            envs=2,
            imports=(),
            seed=0,
            log_path=tmp_path / "worker.log",
            extra_args=(
                "--tls-ca",
                str(tmp_path / "ca.crt"),
                "--tls-cert",
                str(worker_cert),
                "--tls-key",
                str(worker_key),
            ),
        )
        try:
            with RemoteSampler(
                server.address,
                tls_ca=tmp_path / "ca.crt",
                tls_cert=learner_cert,
                tls_key=learner_key,
                timeout=60,
            ) as sampler:
                wait_until(lambda: len(sampler.status().workers) == 1, "the worker to join")
                # The worker dials the channel once joined (TLS takes a moment);
                # until then its lease traffic would rightly use the stream.
                registry = server.coordinator.metrics.registry
                wait_until(
                    lambda: registry.get_sample_value(
                        "rlfleet_lease_data_connections_total", {"outcome": "accepted"}
                    ),
                    "the worker's data connection",
                )
                with RemoteVectorEnv(sampler, "CartPole-v1", 2) as venv:
                    venv.reset(seed=0)
                    obs, _, _, _, _ = venv.step(np.zeros(2, np.int64))
                    assert obs.shape == (2, 4)
                # The worker's results take its data connection, over TLS too,
                # and the answer's results the sampler's own, with its certificate.
                assert sampler.obtain_episodes(2).n_episodes == 2
                link = sampler.result_route._link
                assert isinstance(link, LeaseDataLink)
                assert isinstance(link._sock, ssl.SSLSocket)
            for party in ("learner", "worker", "results"):
                assert registry.get_sample_value(
                    "rlfleet_lease_data_frames_total", {"party": party}
                ), party
            # Under mTLS a client without a certificate fails the handshake.
            assert server.coordinator.lease_data is not None
            port = server.coordinator.lease_data.port
            no_cert = ClientTLS.from_files(tmp_path / "ca.crt")
            with pytest.raises((OSError, UnavailableError)):
                dial("127.0.0.1", port, data_hello(b"t"), tls=no_cert, timeout=10,
                     max_frame_bytes=1)  # fmt: skip
        finally:
            stop_processes([worker.process], 10.0)


class _Recording:
    """A data connection's peer that records its frames and why its connection ended."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.frames: list[bytes | memoryview] = []
        self.batches: list[int] = []  # frames per hand-off

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        self.frames += payloads
        self.batches.append(len(payloads))

    def on_closed(self, reason: str) -> None:
        self.closed.append(reason)


@dataclasses.dataclass
class _Dialled:
    """A coordinator's data port and one connection dialled to it."""

    data: Any  # the coordinator's LeaseDataServer
    peer: _Recording  # what the coordinator received on it
    attached: list[Any]  # the coordinator's side of it, once accepted
    link: LeaseDataLink  # the dialling side

    def large_frame(self, fill: int) -> memoryview:
        """Sends a 600,000-byte frame of ``fill`` and returns it as received:
        a view of one of the loop's receive buffers."""
        self.link.send(bytes([fill]) * 600_000)
        wait_until(lambda: len(self.peer.frames) == 1, "the frame")
        got = self.peer.frames.pop()
        assert isinstance(got, memoryview) and got == bytes([fill]) * 600_000
        return got


@contextlib.contextmanager
def dialled(config: CoordinatorConfig, tls: ClientTLS | None = None) -> Iterator[_Dialled]:
    """A coordinator served with ``config``, with one data connection dialled to
    it whose frames a :class:`_Recording` peer takes (frames up to the config's
    message limit each way)."""
    with serve(config) as server:
        data = server.coordinator.lease_data
        assert data is not None
        peer = _Recording()
        attached: list[Any] = []

        def attach(connection: Any) -> _Recording:
            attached.append(connection)
            return peer

        ticket = data.issue(attach)
        link = dial("127.0.0.1", data.port, data_hello(ticket), tls=tls, timeout=10,
                    max_frame_bytes=config.max_message_bytes)  # fmt: skip
        try:
            yield _Dialled(data, peer, attached, link)
        finally:
            link.close()


def test_frames_cut_anywhere_by_the_network_reach_the_coordinator_whole_and_in_order() -> None:
    # The loop cuts frames straight from each read into its one buffer and
    # keeps a frame's start for the next read: split headers, split payloads,
    # several frames per read, and a frame larger than a read (64 KiB).
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        peer = channel.peer
        payloads = [bytes([k]) * size for k, size in enumerate([0, 1, 5, 300, 4096, 600_000, 7])]
        stream = b"".join(FRAME_HEADER.pack(len(p)) + p for p in payloads)
        raw = channel.link._sock  # the test writes the bytes in pieces of its choosing
        for piece in (stream[:2], stream[2:9], stream[9:400], stream[400:]):
            raw.sendall(piece)
            time.sleep(0.05)  # the behaviour under test: each piece its own read
        wait_until(lambda: len(peer.frames) == len(payloads), "every frame")
        assert peer.frames == payloads
        assert not peer.closed


def test_large_frames_are_read_into_reused_buffers_never_into_one_still_viewed() -> None:
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        data, received = channel.data, channel.large_frame
        # The connection's first large frame sizes the buffers later ones land in.
        assert received(9) == b"\x09" * 600_000
        first = received(1)
        made = data.buffers.made
        second = received(2)  # ``first`` is still viewed: a buffer of its own
        assert second.obj is not first.obj
        assert first == b"\x01" * 600_000
        buffer = id(first.obj)  # not the buffer itself: a reference keeps it out
        del first
        third = received(3)  # nothing views the first buffer now: taken again
        assert id(third.obj) == buffer
        assert data.buffers.made == made + 1
        assert second == b"\x02" * 600_000


def test_a_large_frame_takes_a_buffer_let_go_after_earlier_frames_still_held() -> None:
    # Frames are let go about in order, not quite: a lane behind another
    # still holds its older frames while later ones are let go. Each later
    # frame takes a buffer let go, no new memory.
    # Each later frame waits whole on the socket before the loop reads it: a
    # frame read in pieces also holds the landing buffer it began in, and
    # whether one is depends on how a busy machine schedules the sender.
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        data, peer, received = channel.data, channel.peer, channel.large_frame
        wait_until(lambda: channel.attached, "the connection attached")
        connection = channel.attached[0]
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        held = [received(1), received(2)]
        made = data.buffers.made
        for fill in range(3, 9):
            with _held_back(connection, FRAME_HEADER.size + 600_000):
                channel.link.send(bytes([fill]) * 600_000)
            wait_until(lambda: len(peer.frames) == 1, "the frame")
            assert peer.frames.pop()[-1] == fill  # let go at once
        assert data.buffers.made == made + 1
        assert held[0] == b"\x01" * 600_000 and held[1] == b"\x02" * 600_000


def _waiting_bytes(sock: socket.socket) -> int:
    """Bytes received on ``sock`` and not read yet."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]


@contextlib.contextmanager
def _held_back(connection: Any, size: int) -> Iterator[None]:
    """Keeps the loop from reading ``connection`` (it reads under the
    connection's lock) until ``size`` bytes wait on its socket."""
    with connection._lock:
        yield
        wait_until(lambda: _waiting_bytes(connection.sock) >= size, "the bytes on the socket")


def test_a_large_frame_found_whole_is_read_once_where_it_landed_and_kept_while_viewed() -> None:
    # Once a connection sent a large frame, its reads land in a kept buffer
    # that holds one more: a frame found whole is read with one read and
    # handed out as a view of that buffer (no copy), which no later frame
    # takes while the first is viewed.
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        data, peer, link = channel.data, channel.peer, channel.link
        wait_until(lambda: channel.attached, "the connection attached")
        connection = channel.attached[0]
        connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        assert channel.large_frame(9) == b"\x09" * 600_000  # the first sizes the landing
        counted = connection._sock = CountedReads(connection._sock)
        held: list[memoryview] = []
        for fill in (1, 2, 3):
            with _held_back(connection, FRAME_HEADER.size + 600_000):
                link.send(bytes([fill]) * 600_000)
                reads = counted.reads
            wait_until(lambda: len(peer.frames) == 1, "the frame")
            assert counted.reads == reads + 1
            got = peer.frames.pop()
            assert isinstance(got, memoryview)
            assert any(got.obj is kept for kept in data.buffers._buffers)
            held.append(got)
        assert len({id(frame.obj) for frame in held}) == 3  # none written while viewed
        assert [bytes(frame) for frame in held] == [bytes([k]) * 600_000 for k in (1, 2, 3)]


@pytest.mark.parametrize("cuts", [(2,), (300_000,), (599_990,), (600_010,), (600_040, 700_000)])
def test_frames_cut_anywhere_after_a_large_one_reach_the_peer_whole_and_in_order(
    cuts: tuple[int, ...],
) -> None:
    # Past a connection's first large frame its reads land in a buffer that
    # holds a frame like it: a large frame begun in one read is completed
    # where it landed, or moved to a buffer of its own when it does not fit
    # past the frames before it; small frames after it are cut as ever.
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        peer = channel.peer
        assert channel.large_frame(9) == b"\x09" * 600_000
        payloads = [bytes([k + 1]) * size for k, size in enumerate([600_000, 5, 590_000, 7])]
        stream = b"".join(FRAME_HEADER.pack(len(p)) + p for p in payloads)
        raw = channel.link._sock  # the test writes the bytes in pieces of its choosing
        bounds = [0, *cuts, len(stream)]
        for start, end in itertools.pairwise(bounds):
            raw.sendall(stream[start:end])
            time.sleep(0.05)  # the behaviour under test: each piece its own read
        wait_until(lambda: len(peer.frames) == len(payloads), "every frame")
        assert [bytes(f) for f in peer.frames] == payloads
        assert not peer.closed


def test_small_frames_of_one_read_reach_the_peer_in_order_in_one_hand_off() -> None:
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        peer, link = channel.peer, channel.link
        wait_until(lambda: channel.attached, "the connection attached")
        connection = channel.attached[0]
        payloads = [bytes([k]) * (k * 37 % 1_000) for k in range(40)]
        with _held_back(connection, sum(FRAME_HEADER.size + len(p) for p in payloads)):
            link.send_frames(payloads)
        wait_until(lambda: len(peer.frames) == len(payloads), "every frame")
        assert peer.frames == payloads
        assert peer.batches == [len(payloads)]


def test_a_hand_over_asked_on_the_loop_runs_there_once_its_wake_up_was_served() -> None:
    # A result lane's thread is woken by a hand-over the loop runs once it
    # served every ready connection (before it waits again), not while the
    # peer still handles the frames; asked on another thread, it runs at once.
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        wait_until(lambda: channel.attached, "the connection attached")
        connection = channel.attached[0]
        seen: list[tuple[str, bytes | memoryview, int]] = []

        def on_frames(payloads: list[bytes | memoryview]) -> None:
            payload = payloads[0]
            seen.append(("frames", payload, threading.get_ident()))
            connection.after_wake_up(
                lambda: seen.append(("handed over", payload, threading.get_ident()))
            )
            seen.append(("returned", payload, threading.get_ident()))

        channel.peer.on_frames = on_frames  # type: ignore[method-assign]
        for sent, payload in enumerate((b"one", b"two"), start=1):
            channel.link.send(payload)
            wait_until(partial(lambda count: len(seen) >= 3 * count, sent), "its hand-over")
        loop = channel.data._loop.ident
        assert seen == [
            (what, payload, loop)
            for payload in (b"one", b"two")
            for what in ("frames", "returned", "handed over")
        ]
        here: list[int] = []
        connection.after_wake_up(lambda: here.append(threading.get_ident()))
        assert here == [threading.get_ident()]


def test_large_frames_cross_a_tls_data_connection_whole_both_ways(tmp_path: Path) -> None:
    # Over TLS a large frame is read straight into its buffer too (the
    # socket's decrypted bytes drained), and a frame sent in pieces goes out
    # without its large pieces joined: both must stay whole and in order.
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    server_cert, server_key = make_cert(ca, "rlfleet-coordinator").write(tmp_path, "server")
    tls = ServerTLS.from_files(server_cert, server_key)
    config = CoordinatorConfig(
        listen="127.0.0.1:0", max_message_bytes=1 << 21, security=ServerSecurity(tls=tls)
    )
    client = ClientTLS.from_files(tmp_path / "ca.crt")
    with dialled(config, client) as channel:
        peer, link = channel.peer, channel.link
        assert isinstance(link._sock, ssl.SSLSocket)
        payloads = [bytes([k % 251]) * size for k, size in
                    enumerate([3, 900_000, 70_000, 5, 1_500_000, 65_536, 12])]  # fmt: skip
        link.send_frames(payloads)
        wait_until(lambda: len(peer.frames) == len(payloads), "every frame")
        assert [bytes(f) for f in peer.frames] == payloads
        assert not peer.closed
        (connection,) = channel.attached
        parts = [b"head", b"\x07" * 800_000, b"mid", b"\x09" * 100_000, b"tail"]
        for _ in range(3):
            connection.send_parts(parts, 10.0)
        for _ in range(3):
            received = link.receive_message(10.0)
            assert received is not None and bytes(received) == b"".join(parts)


def test_a_frame_the_socket_cannot_take_at_once_is_sent_whole_by_its_senders_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A learner's results: frames of megabytes, more than the kernel's buffers
    # take at once. The sender's thread sends the rest as the learner reads
    # and returns once the frame is in the kernel: the loop is never asked to
    # carry any of it (no hand-off, no wake-up of the loop per frame).
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 25)
    with dialled(config) as channel:
        wait_until(lambda: channel.attached, "the connection attached")
        (connection,) = channel.attached
        handed: list[object] = []
        monkeypatch.setattr(channel.data, "want_write", handed.append)
        parts = [b"head", b"\x07" * 12_000_000, b"mid", b"\x09" * 100_000, b"tail"]
        with ThreadPoolExecutor(1) as pool:
            got = pool.submit(lambda: [channel.link.receive_message(PATIENCE) for _ in range(3)])
            for _ in range(3):
                connection.send_parts(parts, PATIENCE)
                assert not connection._pending  # all of it is in the kernel
            received = got.result(timeout=PATIENCE)
        assert [None if r is None else bytes(r) for r in received] == [b"".join(parts)] * 3
        assert handed == []


def test_frames_sent_together_go_in_one_sendmsg_each_whole_and_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A result lane's batch: several frames handed over at once go to the
    # kernel in one sendmsg, up to _SEND_BATCH_PIECES pieces (a frame's never
    # split between two), and arrive whole and in order.
    writes: list[int] = []
    with dialled(CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 25)) as channel:
        wait_until(lambda: len(channel.attached) == 1, "the connection attached")
        connection = channel.attached[0]
        write = connection._write

        def recorded(pieces: Any) -> Any:
            writes.append(len(pieces))
            return write(pieces)

        monkeypatch.setattr(connection, "_write", recorded)
        big = [[b"head%d" % k, bytes([k]) * 700_000, b"tail"] for k in range(3)]
        small = [[b"h", bytes([k % 251]) * (k + 1), b"t%d" % k] for k in range(100)]

        def receive(count: int) -> list[Any]:
            return [channel.link.receive_message(PATIENCE) for _ in range(count)]

        for frames in (big, small):
            with ThreadPoolExecutor(1) as pool:
                got = pool.submit(receive, len(frames))
                connection.send_frames(frames, PATIENCE)
                received = got.result(timeout=PATIENCE)
            assert [None if r is None else bytes(r) for r in received] == [
                b"".join(parts) for parts in frames
            ]
        # 3 frames of 4 pieces each (with its header), then 100 in 64 + 36.
        assert writes == [12, 256, 144]


def test_a_sender_whose_peer_takes_nothing_times_out_naming_the_seconds() -> None:
    # A learner that stops reading holds the sender, for at most its wait;
    # the frame's rest stays queued in order, so the stream stays whole for
    # the loop to finish once the learner reads again.
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 25)
    with dialled(config) as channel:
        wait_until(lambda: channel.attached, "the connection attached")
        (connection,) = channel.attached
        big = b"\x05" * 20_000_000
        with pytest.raises(RlfleetTimeoutError, match=r"took no data for 0\.5 seconds"):
            connection.send_parts([big], 0.5)
        assert not connection.closed
        received = channel.link.receive_message(PATIENCE)
        assert received is not None and bytes(received) == big


class _CountingSocket(socket.socket):
    """A socket that counts the reads made of it."""

    reads = 0

    def recv_into(self, *args: Any) -> int:
        self.reads += 1
        return super().recv_into(*args)

    def recvmsg_into(self, *args: Any) -> tuple[int, list[Any], int, Any]:
        self.reads += 1
        return super().recvmsg_into(*args)


def _socket_pair() -> tuple[_CountingSocket, socket.socket]:
    ours, theirs = socket.socketpair()
    return _CountingSocket(fileno=ours.detach()), theirs


@pytest.mark.parametrize("deadline", [None, 10.0], ids=["no-deadline", "deadline"])
def test_frames_already_sent_are_read_with_one_read_in_all(deadline: float | None) -> None:
    # A reader behind its sender (a learner reading an answer's results)
    # takes every frame the socket holds with one read, up to a landing's length.
    sock, theirs = _socket_pair()
    link = LeaseDataLink(sock, 1 << 20)
    try:
        small = [b"a" * 10, b"b" * 20, b"c" * 3000]
        theirs.sendall(b"".join(frame(p) for p in small))
        got = [link.receive_message(deadline) for _ in small]
        assert [None if g is None else bytes(g) for g in got] == small
        assert sock.reads == 1
        theirs.close()
        assert link.receive_message(deadline) is None  # the end, between frames
    finally:
        link.close()


@pytest.mark.parametrize("deadline", [None, 10.0], ids=["no-deadline", "deadline"])
def test_a_frame_that_came_with_the_last_read_is_handed_out_with_no_call_past_one(
    deadline: float | None,
) -> None:
    # A learner behind its coordinator pays this per result frame: a frame
    # the last read took whole is cut from the landing, no read, no
    # context manager, no other call.
    sock, theirs = _socket_pair()
    link = LeaseDataLink(sock, 1 << 20)
    try:
        theirs.sendall(frame(b"a" * 10) + frame(b"b" * 3000))
        link.receive_message(deadline)
        called: list[str] = []

        def profile(frame: Any, event: str, arg: object) -> None:
            if event == "call":
                called.append(frame.f_code.co_name)

        sys.setprofile(profile)
        try:
            got = link.receive_message(deadline)
        finally:
            sys.setprofile(None)
        assert got is not None and bytes(got) == b"b" * 3000
        assert called == ["receive_message", "_receive_landed"]
    finally:
        link.close()


def _tcp_pair(
    kind: type[_CountingSocket] = _CountingSocket,
) -> tuple[_CountingSocket, socket.socket]:
    """A loopback TCP connection (poll honours SO_RCVLOWAT over TCP, not Unix sockets)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        theirs = socket.create_connection(server.getsockname())
        ours, _ = server.accept()
    return kind(fileno=ours.detach()), theirs


def _gathered_one_by_one(
    link: LeaseDataLink,
    theirs: socket.socket,
    payloads: list[bytes],
    pause: float,
    deadline: float | None,
) -> list[bytes | None]:
    """``payloads`` sent as frames one by one, ``pause`` seconds apart, as ``link``
    reads them gathering."""
    with ThreadPoolExecutor(1) as pool:

        def send_one_by_one() -> None:
            for payload in payloads:
                theirs.sendall(frame(payload))
                time.sleep(pause)

        sent = pool.submit(send_one_by_one)
        # Each wait asks for what is still to come, as a sampler asks for
        # what its answer still misses: asking for more than will come
        # would hold the last frames' wait to its (here long) bound.
        got = []
        for k in range(len(payloads)):
            left = sum(len(payload) + FRAME_HEADER.size for payload in payloads[k:])
            read = link.receive_message(deadline, gather=min(lease_channel.GATHER_BYTES, left))
            got.append(None if read is None else bytes(read))
        sent.result(timeout=PATIENCE)
    return got


@pytest.mark.parametrize("deadline", [None, 10.0], ids=["no-deadline", "deadline"])
def test_a_gathering_reader_ahead_of_its_sender_reads_several_frames_per_wait(
    deadline: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A learner ahead of its coordinator finds each next frame not yet sent:
    # gathering, its wait ends once the bytes it asked for are there (the
    # bound on the wait made long here), so frames sent one by one are read
    # after one wait, each with one read; a read that does not gather then
    # takes a lone frame at once (the low mark left set does not hold it).
    monkeypatch.setattr(lease_channel, "GATHER_SECONDS", PATIENCE)
    sock, theirs = _tcp_pair()
    link = LeaseDataLink(sock, 1 << 20)
    size = lease_channel.GATHER_BYTES // 8 - FRAME_HEADER.size
    payloads = [bytes([k]) * size for k in range(8)]  # GATHER_BYTES with their headers
    try:
        got = _gathered_one_by_one(link, theirs, payloads, 0.005, deadline)
        assert got == payloads
        # The first header's read that found nothing, its read after the
        # wait, then one read per payload (with the next header); the kernel
        # may end a wait early (its receive memory's pressure), a read more.
        # Waiting for each frame takes three reads a frame.
        assert sock.reads < 2 * len(payloads)
        theirs.sendall(frame(b"lone"))
        lone = link.receive_message(deadline)
        assert lone is not None and bytes(lone) == b"lone"
    finally:
        link.close()
        theirs.close()


def test_a_gathering_wait_asks_for_up_to_a_landings_worth_of_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A learner whose answer still misses a landing's worth of results
    # waits for them all at once: twenty 12 kB frames (about 400-step
    # CartPole results), sent one by one, are read after one wait (its bound
    # made long here) with one read. A wait that asked for less would end
    # after a few of them, and each later one cost a read that found
    # nothing, a wait and a read.
    monkeypatch.setattr(lease_channel, "GATHER_SECONDS", PATIENCE)
    sock, theirs = _tcp_pair()
    link = LeaseDataLink(sock, 1 << 20)
    step = 12_000 + FRAME_HEADER.size
    payloads = [bytes([k]) * (step - FRAME_HEADER.size) for k in range(20)]
    assert len(payloads) * step <= min(lease_channel.LANDING_BYTES, lease_channel.GATHER_BYTES)
    try:
        assert _gathered_one_by_one(link, theirs, payloads, 0.001, None) == payloads
        # The first header's read that found nothing and the read after the
        # wait; the kernel may end the wait up to a segment early (the
        # window it offers shrinks to the mark), the last frames then a
        # second wait: two reads more. Waits for 64 KiB each take eight or more.
        assert sock.reads <= 5
    finally:
        link.close()
        theirs.close()


@pytest.mark.timeout(60)
def test_a_gathering_reader_takes_a_lone_frame_after_the_bounded_wait() -> None:
    # Fewer bytes than GATHER_BYTES: the frame is read once GATHER_SECONDS
    # pass (no deadline: an unbounded wait would hang the test), and the
    # connection's end is seen as before.
    sock, theirs = _tcp_pair()
    link = LeaseDataLink(sock, 1 << 20)
    try:
        with ThreadPoolExecutor(1) as pool:

            def send_later() -> None:
                time.sleep(0.05)  # the reader waits first
                theirs.sendall(frame(b"lone"))

            later = pool.submit(send_later)
            got = link.receive_message(None, gather=lease_channel.GATHER_BYTES)
            later.result(timeout=PATIENCE)
        assert got is not None and bytes(got) == b"lone"
        # The wait for any byte past the bounded one put the low mark back.
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
        theirs.close()
        assert link.receive_message(None, gather=lease_channel.GATHER_BYTES) is None
    finally:
        link.close()


def _send_after_a_wait(theirs: socket.socket, data: bytes) -> None:
    """Sends ``data`` once the reader is waiting (bytes already there are read without a wait)."""
    time.sleep(0.05)
    theirs.sendall(data)


class _MarkCountingSocket(_CountingSocket):
    """A socket that counts the SO_RCVLOWAT settings made of it."""

    marks = 0

    def setsockopt(self, level: int, option: int, value: Any, *rest: Any) -> None:
        if option == socket.SO_RCVLOWAT:
            self.marks += 1
        super().setsockopt(level, option, value, *rest)


def test_gathering_waits_for_the_same_bytes_set_the_low_mark_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A learner ahead of its coordinator waits for each next result asking
    # for the same bytes (GATHER_BYTES, the most asked): the first wait sets
    # the low mark and the next ones find it set. Bursts of GATHER_BYTES
    # end each wait (its bound made long here) and are read whole.
    monkeypatch.setattr(lease_channel, "GATHER_SECONDS", PATIENCE)
    sock, theirs = _tcp_pair(_MarkCountingSocket)
    link = LeaseDataLink(sock, 1 << 20)
    size = lease_channel.GATHER_BYTES // 8 - FRAME_HEADER.size
    payloads = [bytes([k]) * size for k in range(8)]  # GATHER_BYTES with their headers
    burst = b"".join(frame(payload) for payload in payloads)
    try:
        with ThreadPoolExecutor(1) as pool:
            for _ in range(3):
                sent = pool.submit(_send_after_a_wait, theirs, burst)
                got = [
                    link.receive_message(PATIENCE, gather=lease_channel.GATHER_BYTES)
                    for _ in payloads
                ]
                sent.result(timeout=PATIENCE)
                assert [None if g is None else bytes(g) for g in got] == payloads
        assert isinstance(sock, _MarkCountingSocket) and sock.marks == 1
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == lease_channel.GATHER_BYTES
    finally:
        link.close()
        theirs.close()


@pytest.mark.parametrize("how", ["blocking", "deadline", "receive", "readable"])
@pytest.mark.timeout(120)
def test_a_read_that_does_not_gather_is_not_held_by_a_gathering_waits_low_mark(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The low mark a gathering wait leaves set is put back to 1 before any
    # other wait, blocking read or readability probe: a lone frame is read
    # (or seen) at once; with the mark, each would hold out for GATHER_BYTES.
    monkeypatch.setattr(lease_channel, "GATHER_SECONDS", PATIENCE)
    sock, theirs = _tcp_pair()
    link = LeaseDataLink(sock, 1 << 20)
    size = lease_channel.GATHER_BYTES - FRAME_HEADER.size  # one frame of GATHER_BYTES
    try:
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(_send_after_a_wait, theirs, frame(b"x" * size))
            got = link.receive_message(PATIENCE, gather=lease_channel.GATHER_BYTES)
            sent.result(timeout=PATIENCE)
        assert got is not None and len(got) == size
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) > 1
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(_send_after_a_wait, theirs, frame(b"lone"))
            if how == "readable":
                wait_until(link.readable, "the lone frame seen", timeout=5.0)
            if how == "receive":
                lone: bytes | memoryview | None = link.receive_within(PATIENCE)
            else:
                lone = link.receive_message(None if how == "blocking" else PATIENCE)
            sent.result(timeout=PATIENCE)
        assert lone is not None and bytes(lone) == b"lone"
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT) == 1
    finally:
        link.close()
        theirs.close()


class _NoLowMarkSocket(_CountingSocket):
    """A socket of a system that does not take SO_RCVLOWAT."""

    def setsockopt(self, level: int, option: int, value: Any, *rest: Any) -> None:
        if option == socket.SO_RCVLOWAT:
            raise OSError(errno.ENOPROTOOPT, "Protocol not available")
        super().setsockopt(level, option, value, *rest)


def test_a_gathering_reader_on_a_system_without_a_low_mark_waits_as_before() -> None:
    # The gathering wait is an economy: where the socket does not take it,
    # the frame is waited for as it was, the connection kept.
    sock, theirs = _tcp_pair(_NoLowMarkSocket)
    link = LeaseDataLink(sock, 1 << 20)
    try:
        with ThreadPoolExecutor(1) as pool:

            def send_later() -> None:
                time.sleep(0.05)  # the reader waits first
                theirs.sendall(frame(b"one") + frame(b"two"))

            later = pool.submit(send_later)
            got = [link.receive_message(10.0, gather=lease_channel.GATHER_BYTES) for _ in "ab"]
            later.result(timeout=PATIENCE)
        assert [None if g is None else bytes(g) for g in got] == [b"one", b"two"]
    finally:
        link.close()
        theirs.close()


def test_frames_larger_than_the_socket_buffer_arrive_whole_and_in_order() -> None:
    sock, theirs = _socket_pair()
    link = LeaseDataLink(sock, 1 << 21)
    sender = LeaseDataLink(theirs, 1 << 21)
    try:
        payloads = [bytes([k]) * size for k, size in enumerate([5, 70_000, 0, 300, 1_200_000, 9])]
        with ThreadPoolExecutor(1) as pool:  # the socket's buffer holds less than them all
            sent = pool.submit(sender.send_frames, payloads)
            got = [link.receive_message(10.0) for _ in payloads]
            sent.result(timeout=PATIENCE)
        assert [None if g is None else bytes(g) for g in got] == payloads
        sender.close()
        assert link.receive_message(10.0) is None
    finally:
        link.close()


def test_a_frame_longer_than_the_limit_closes_the_connection_naming_the_limit() -> None:
    # A hostile length must not make the coordinator allocate what it says.
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 20)
    with dialled(config) as channel:
        peer = channel.peer
        channel.link._sock.sendall(frame(b"ok") + FRAME_HEADER.pack(0xFFFF_FFFF) + b"x" * 100)
        wait_until(lambda: peer.closed, "the connection's end")
        assert peer.frames == [b"ok"]
        assert "4294967295 bytes" in peer.closed[0]
        assert "limit" in peer.closed[0]


def test_a_peer_that_does_not_read_is_cut_off_not_buffered_without_bound() -> None:
    config = CoordinatorConfig(listen="127.0.0.1:0", max_message_bytes=1 << 16)
    with dialled(config) as channel:
        attached = channel.attached
        wait_until(lambda: attached, "the connection attached")  # just after the accept
        (connection,) = attached
        chunk = b"x" * (1 << 15)
        for _ in range(4096):  # 128 MiB at most; the kernel's buffers hold a few MiB
            connection.send(chunk)
            if connection.closed:
                break
        assert connection.closed
        wait_until(lambda: channel.peer.closed, "the connection's end")
        assert "does not read" in channel.peer.closed[0]


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("127.0.0.1:50051", "127.0.0.1"),
        (
            "rlfleet-coordinator.rlfleet.svc.cluster.local:50051",
            "rlfleet-coordinator.rlfleet.svc.cluster.local",
        ),
        ("[::1]:50051", "::1"),
        ("dns:///coordinator.example:50051", "coordinator.example"),
        ("ipv4:10.0.0.5:50051", "10.0.0.5"),
    ],
)
def test_the_data_channel_is_channelon_the_grpc_host(address: str, host: str) -> None:
    assert coordinator_host(address) == host


def test_connections_that_never_say_hello_hold_a_bounded_number_of_threads() -> None:
    # The handshake timeout is far beyond the waits below, so a refusal can
    # only be the bound's, never a timed-out handshake.
    config = CoordinatorConfig(listen="127.0.0.1:0", handshake_timeout_seconds=300.0)
    with serve(config) as server:
        data = server.coordinator.lease_data
        assert data is not None
        idle = [
            socket.create_connection(("127.0.0.1", data.port), timeout=PATIENCE) for _ in range(64)
        ]
        try:
            registry = server.coordinator.metrics.registry
            with socket.create_connection(("127.0.0.1", data.port), timeout=PATIENCE) as extra:
                # Refused as soon as the acceptor reaches it (it accepts in
                # order, so after the 64 that hold every handshake slot).
                assert extra.recv(1) == b""
            refused = registry.get_sample_value(
                "rlfleet_lease_data_connections_total", {"outcome": "refused"}
            )
            assert refused == 1
        finally:
            for sock in idle:
                sock.close()
        # Their threads end with them: a real ticket is accepted again.
        ticket = data.issue(lambda connection: _Quiet())
        wait_until(lambda: _accepts(data.port, ticket), "a free handshake slot")


def _accepts(port: int, ticket: bytes) -> bool:
    try:
        dial("127.0.0.1", port, data_hello(ticket), tls=None, timeout=10, max_frame_bytes=1).close()
    except UnavailableError:
        return False
    return True


@contextlib.contextmanager
def worker_data_channel(
    on_command: Callable[[bytes], None],
    on_broken: Callable[[str], None],
    join_ended: Callable[[float], bool],
) -> Iterator[tuple[WorkerLeaseChannel, Any]]:
    """A worker session's data channel connected to a real coordinator's data
    port, and the coordinator's side of its connection."""
    with serve(CoordinatorConfig(listen="127.0.0.1:0")) as server:
        data = server.coordinator.lease_data
        assert data is not None
        attached: list[Any] = []

        def attach(connection: Any) -> _Quiet:
            attached.append(connection)
            return _Quiet()

        ticket = data.issue(attach)
        channel = WorkerLeaseChannel(
            "127.0.0.1",
            data.port,
            data_hello(ticket),
            tls=None,
            max_frame_bytes=1 << 16,
            on_command=on_command,
            on_broken=on_broken,
            join_ended=join_ended,
        )
        channel.start()
        try:
            wait_until(lambda: attached and channel.connected, "the worker's data connection")
            (connection,) = attached
            yield channel, connection
        finally:
            channel.close()


def test_a_worker_holds_data_commands_until_the_switch_marker() -> None:
    # The ordering guarantee: commands that come on the data connection wait
    # until the worker has read the marker that closes the Join stream's part.
    got: list[bytes] = []
    broken: list[str] = []
    with worker_data_channel(got.append, broken.append, lambda seconds: False) as (
        channel,
        connection,
    ):
        connection.send(b"first")
        connection.send(b"second")
        wait_until(lambda: len(channel._held) == 2, "both commands held back")  # they arrive
        assert got == []  # and wait
        channel.switch()
        assert got == [b"first", b"second"]
        connection.send(b"third")
        wait_until(lambda: len(got) == 3, "a command after the marker")
        assert got[2] == b"third"
        assert broken == []


@pytest.mark.parametrize("join_ended", [True, False])
def test_a_data_connection_that_ends_with_the_join_stream_leaves_the_session_to_it(
    join_ended: bool,
) -> None:
    # A stopping coordinator closes the data port a moment before it ends the
    # Join streams. The session's end must be the Join stream's: a data
    # connection that closed cleanly as the Join stream ended tells the
    # session nothing (it would race the Join stream's end and name itself in
    # the worker's reconnect WARNING); one that closed while the Join stream
    # lives is a fault the session hears about.
    broken: list[str] = []
    asked: list[float] = []

    def ended(seconds: float) -> bool:
        asked.append(seconds)
        return join_ended

    with worker_data_channel(lambda payload: None, broken.append, ended) as (_, connection):
        connection.close("the coordinator stops")
        wait_until(lambda: asked, "the worker to see the connection end")
        if join_ended:
            time.sleep(0.2)  # an absence: a late call would come within this
            assert broken == []
        else:
            wait_until(lambda: broken, "the session told of the fault")
            assert broken == ["the coordinator closed it"]


def test_a_frame_cut_by_a_timed_out_wait_is_kept_whole_for_the_next() -> None:
    """The learner reads replies on its own thread with a deadline
    (LeaseDataLink.receive_within): a wait that ends mid-frame loses no byte."""
    ours, theirs = socket.socketpair()
    link = LeaseDataLink(ours, max_frame_bytes=1 << 20)
    try:
        payload = bytes(range(256)) * 40
        framed = FRAME_HEADER.pack(len(payload)) + payload
        theirs.sendall(framed[:3])  # not even the whole header
        with pytest.raises(TimeoutError):
            link.receive_within(0.05)
        theirs.sendall(framed[3:5000])
        with pytest.raises(TimeoutError):
            link.receive_within(0.05)
        theirs.sendall(framed[5000:] + framed)  # the rest, then a second frame at once
        assert link.receive_within(5.0) == payload
        assert link.receive_within(5.0) == payload
        theirs.close()
        assert link.receive_within(5.0) is None  # the peer closed the connection
    finally:
        link.close()
        theirs.close()


@contextlib.contextmanager
def data_lease(port: int, env: EnvConfig, num_envs: int) -> Iterator[LeaseStream]:
    """A lease of ``num_envs`` envs on the coordinator at ``port``, over its data channel."""
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    stream = LeaseStream(
        channel,
        env,
        num_envs,
        open_timeout=30.0,
        call_timeout=30.0,
        data_host=coordinator_host(address),
    )
    try:
        assert stream.carrier == "data"
        yield stream
    finally:
        stream.close()
        channel.close()


def unread_frames(stream: LeaseStream) -> int:
    """Whole frames that reached the learner's data connection and are not read yet."""
    link = stream._link
    assert isinstance(link, LeaseDataLink)
    data = bytes(link._buffer)
    if select.select([link._sock], [], [], 0)[0]:
        data += link._sock.recv(1 << 20, socket.MSG_PEEK)
    count = offset = 0
    while offset + FRAME_HEADER.size <= len(data):
        (length,) = FRAME_HEADER.unpack_from(data, offset)
        offset += FRAME_HEADER.size + length
        count += offset <= len(data)
    return count


def test_two_threads_waiting_on_one_lease_each_get_their_own_answers(fleet: Fleet) -> None:
    """One waiting thread reads the data channel; the other is woken by it."""
    with data_lease(fleet.server.port, EnvConfig("CartPole-v1"), 4) as stream:
        got: dict[int, Any] = {}
        for round_ in range(20):
            stream.send("reset", [0, 1], [{"seed": round_}, {"seed": round_ + 1}])
            stream.send("reset", [2, 3], [{"seed": round_ + 2}, {"seed": round_ + 3}])
            with ThreadPoolExecutor(2) as pool:
                firsts = pool.submit(stream.receive, [0, 1], 2, 30.0)
                seconds = pool.submit(stream.receive, [2, 3], 2, 30.0)
                got = {**firsts.result(), **seconds.result()}
            assert sorted(got) == [0, 1, 2, 3]
            for env_id, (obs, _) in got.items():
                expected, _ = gym.make("CartPole-v1").reset(seed=round_ + env_id)
                np.testing.assert_array_equal(obs, expected)


def test_a_wait_for_some_envs_also_takes_the_replies_already_there(fleet: Fleet) -> None:
    """Both workers' replies have come: a wait for one env returns all of them.

    An async step (wait_num) whose envs have all answered then returns them
    all, and the caller answers them in one call, not one per worker.
    """
    with data_lease(fleet.server.port, EnvConfig("CartPole-v1"), 8) as stream:
        assert len(set(stream.env_workers)) == 2  # two replies per call
        ids = list(range(8))
        stream.send("reset", ids, [{"seed": i} for i in ids])
        assert sorted(stream.receive(ids, 8, 30.0)) == ids
        for round_ in range(3):
            target = frames(fleet, "worker") + 2
            stream.send("step", ids, [round_ % 2] * 8)
            wait_until(partial(worker_frames_reach, fleet, target), "both workers' replies")
            # The coordinator relays each reply as it comes.
            wait_until(lambda: unread_frames(stream) >= 2, "both replies at the learner")
            got = stream.receive(ids, 1, 30.0)
            assert sorted(got) == ids, f"round {round_}: only {sorted(got)} of {ids}"


def test_replies_already_there_that_do_not_complete_the_wait_stay_for_the_next() -> None:
    """Extra replies are taken only when every env answered: wait_num keeps envs in flight."""
    slow = EnvConfig("rlfleet/Slow-v0", {"step_seconds": 1.5, "length": 10})
    with (
        contextlib.closing(
            Fleet.local(workers=2, envs_per_worker=4, imports=("rlfleet.envs.testing",))
        ) as local,
        data_lease(local.server.port, slow, 8) as stream,
    ):
        ids = list(range(8))
        stream.send("reset", ids, [{"seed": i} for i in ids])
        stream.receive(ids, 8, 30.0)
        by_worker: dict[str, list[int]] = {}
        for env_id, worker in enumerate(stream.env_workers):
            by_worker.setdefault(worker, []).append(env_id)
        (a, b) = by_worker.values()
        assert len(a) >= 2
        target = frames(local, "worker") + 2
        stream.send("step", b, [0] * len(b))  # 1.5 s per env on its worker: in flight below
        stream.send("reset", a[:1], [{}])  # two quick replies of the other worker
        stream.send("reset", a[1:], [{} for _ in a[1:]])
        wait_until(partial(worker_frames_reach, local, target), "both resets' replies")
        # The coordinator relays each reply as it comes.
        wait_until(lambda: unread_frames(stream) >= 2, "both replies at the learner")
        # The worker runs leased calls concurrently, so either reset may answer
        # first; the wait takes that one reply, not both (b is still in flight).
        first = sorted(stream.receive(ids, 1, 30.0))
        assert first in (a[:1], a[1:]), f"{first} is not one reset's reply ({a[:1]}, {a[1:]})"
        rest = [env for env in a if env not in first]
        assert sorted(stream.receive([*rest, *b], 1, 30.0)) == rest
        assert sorted(stream.receive(b, len(b), 30.0)) == b


DATA_ENDED = "the lease data connection ended"
USES_DATA = "lease traffic uses the data channel"


def warnings_about_data(log: str) -> list[str]:
    return [line for line in log.splitlines() if DATA_ENDED in line and "WARNING" in line]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopping_coordinator_ends_the_data_connection_without_a_warning(
    tmp_path: Path, stop: signal.Signals
) -> None:
    # The data connection ends with the Join stream: the worker's Join line
    # reports the stop, the data line is INFO (docs/reliability.md).
    with ProcessFleet(tmp_path) as processes:
        coordinator = processes.start_coordinator()
        worker = processes.start_worker(envs=2)
        processes.wait_for_log(worker, USES_DATA)
        processes.signal(coordinator, stop)
        coordinator.popen.wait(timeout=60)
        log = processes.wait_for_log(worker, "reconnecting in")
        # An absence cannot be awaited: a late data line would come within this.
        time.sleep(1.0)
        log = worker.log_text()
        assert warnings_about_data(log) == [], log
        assert f"{DATA_ENDED} with the Join stream" in log or DATA_ENDED not in log, log


def test_a_cut_data_connection_still_warns_on_the_worker(tmp_path: Path) -> None:
    port = free_port()
    with ProcessFleet(tmp_path) as processes:
        processes.start_coordinator("--lease-data-listen", f"127.0.0.1:{port}")
        worker = processes.start_worker(envs=2)
        processes.wait_for_log(worker, USES_DATA)
        assert cut(worker.pid, port) == 1
        log = processes.wait_for_log(worker, "reconnecting in")
        # The worker's own line, or (when the coordinator's write-off ends the
        # Join stream first) the Join stream's line naming the data stream.
        warned = [
            line
            for line in log.splitlines()
            if "WARNING" in line and (DATA_ENDED in line or "lease data stream broke" in line)
        ]
        assert warned, log


def test_a_worker_that_stops_ends_its_data_connection_without_a_warning(tmp_path: Path) -> None:
    with ProcessFleet(tmp_path) as processes:
        processes.start_coordinator()
        worker = processes.start_worker(envs=2)
        processes.wait_for_log(worker, USES_DATA)
        assert processes.terminate(worker) == 0
        log = worker.log_text()
        assert "left" in log, log
        assert warnings_about_data(log) == [], log


class _Trickle:
    """Connections that send one byte at a time, never a whole hello."""

    def __init__(self, port: int, count: int, payload: bytes) -> None:
        self.sockets = [
            socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)
        ]
        self._payload = payload
        self._sent = 0

    def step(self) -> None:
        """One more byte on every connection still open (wraps around the payload)."""
        byte = self._payload[self._sent % len(self._payload) : self._sent % len(self._payload) + 1]
        self._sent += 1
        for sock in self.sockets:
            with contextlib.suppress(OSError):  # closed by the coordinator
                sock.send(byte)

    def closed_by_the_coordinator(self) -> int:
        """How many the coordinator closed (a read returns end of stream)."""
        closed = 0
        for sock in self.sockets:
            ready = select.select([sock], [], [], 0)[0]
            if ready:
                try:
                    closed += sock.recv(1) == b""
                except OSError:
                    closed += 1
        return closed

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def test_a_hello_trickled_a_byte_at_a_time_is_refused_at_the_handshake_timeout() -> None:
    # One deadline for the whole handshake: a per-read timeout let a peer
    # that sends a byte a second hold its handshake slot forever.
    config = CoordinatorConfig(listen="127.0.0.1:0", handshake_timeout_seconds=1.5)
    with serve(config) as server:
        data = server.coordinator.lease_data
        assert data is not None
        ticket = data.issue(lambda connection: _Quiet())
        hello = frame(data_hello(ticket))
        trickle = _Trickle(data.port, 1, hello)
        try:
            # The whole hello takes about 8 s at 0.2 s a byte, past the timeout.
            for _ in hello:
                trickle.step()
                if trickle.closed_by_the_coordinator():
                    break
                time.sleep(0.2)
            assert _was_refused(trickle.sockets[0])
        finally:
            trickle.close()


def _was_refused(sock: socket.socket) -> bool:
    """True when the coordinator closed ``sock`` without its LeaseDataAccepted."""
    sock.settimeout(10)
    try:
        return sock.recv(FRAME_HEADER.size) == b""
    except OSError:
        return True


def test_trickling_connections_free_their_handshake_slots_at_the_timeout() -> None:
    # 64 connections with no credentials trickle bytes: every slot is taken,
    # then freed at the handshake timeout, and a real ticket gets in while
    # they still trickle.
    config = CoordinatorConfig(listen="127.0.0.1:0", handshake_timeout_seconds=2.0)
    with serve(config) as server:
        data = server.coordinator.lease_data
        assert data is not None
        registry = server.coordinator.metrics.registry
        trickle = _Trickle(data.port, 64, FRAME_HEADER.pack(1000) + b"x" * 1000)
        try:
            deadline = time.monotonic() + 60.0
            while trickle.closed_by_the_coordinator() < 64:
                assert time.monotonic() < deadline, "trickling connections kept their slots"
                trickle.step()
                time.sleep(0.2)
            refused = registry.get_sample_value(
                "rlfleet_lease_data_connections_total", {"outcome": "refused"}
            )
            assert refused == 64
            ticket = data.issue(lambda connection: _Quiet())
            trickle.step()
            assert _accepts(data.port, ticket)
        finally:
            trickle.close()


def test_a_leaving_worker_closing_its_data_connection_is_no_warning(tmp_path: Path) -> None:
    # A worker that said Leaving closes its data connection, maybe before its
    # Join stream: the coordinator says so at INFO and the Join stream's end
    # removes it (OK), never "its lease data stream broke".
    with ProcessFleet(tmp_path) as processes:
        coordinator = processes.start_coordinator()
        worker, welcome = join(
            processes.address, name="leaver", capabilities=(*CAPABILITIES, LEASE_CAPABILITY)
        )
        try:
            link = dial(
                "127.0.0.1",
                welcome.lease_data.port,
                data_hello(welcome.lease_data.ticket),
                tls=None,
                timeout=10,
                max_frame_bytes=1 << 20,
            )
            worker.send(worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason="stopping")))
            processes.wait_for_log(coordinator, "worker 'leaver' is leaving")
            link.close()
            log = processes.wait_for_log(coordinator, "closed its lease data connection")
            worker.finish()
            assert worker.ended(timeout=30) is None  # OK: removed as a worker that left
        finally:
            worker.close()
        log = processes.wait_for_log(coordinator, "worker 'leaver' removed (OK")
        assert "lease data stream broke" not in log, log
