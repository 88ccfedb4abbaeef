"""Results move to the lease data channel when a session's data connection opens late.

A worker dials its data connection in the background after the Welcome; a
busy coordinator or a slow network can delay it past the session's first
result. With ``rlfleet.results-switch`` agreed, its results go on the Join
stream until the connection is open, then, after the results switch marker
on the stream, on the connection for the rest of the session; the
coordinator books the connection's results only once it has read the
marker (leases.proto, "Results on the lease data channel").

The late dial is real: the worker dials the coordinator as 127.0.0.2, where
the test's relays forward its gRPC connection at once and hold its data
connection until the test opens it (the data port "reachable only later").
Real coordinator and worker processes; every batch equals LocalSampler's.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.sampling import LocalSampler
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import leases_pb2, worker_pb2
from tests._coordinator_fakes import assert_same_batch
from tests._data_worker import DATA_CAPABILITIES, HeldResults, scripted_data_worker
from tests.fleet_processes import (
    SLOW_ENV,
    SLOW_ENV_TWIN,
    TEST_ENVS_MODULE,
    Proc,
    ProcessFleet,
    env_flags,
    local_episodes,
    run_in_thread,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

SEED = 23
#: The worker's address of the coordinator: its connections pass the test's relays.
RELAYED_HOST = "127.0.0.2"
#: What the worker logs at its first result, with no data connection yet.
ON_JOIN = "this session's results go on the Join stream (no data connection yet)"
#: What it logs when its results move to the data channel.
MOVED = "this session's results move to the lease data channel"
#: What it logs once its data connection is accepted.
DATA_OPEN = "lease traffic uses the data channel"


class Relay:
    """Forwards each TCP connection to ``RELAYED_HOST:port`` to ``127.0.0.1:port``;
    while closed, holds every connection it accepts (connected, nothing forwarded)."""

    def __init__(self, port: int, *, opened: bool) -> None:
        self._port = port
        self._open = threading.Event()
        if opened:
            self._open.set()
        self._server = socket.create_server((RELAYED_HOST, port))
        self._sockets: list[socket.socket] = [self._server]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def open(self) -> None:
        """Forwards held and later connections."""
        self._open.set()

    def close(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            self._keep(client)
            threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _forward(self, client: socket.socket) -> None:
        while not self._open.wait(0.5):
            if client.fileno() < 0:
                return
        try:
            upstream = socket.create_connection(("127.0.0.1", self._port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._keep(upstream)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copies ``source`` to ``target`` until either ends; then ends both."""
    try:
        while data := source.recv(1 << 16):
            target.sendall(data)
    except OSError:
        pass
    for sock in (source, target):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as fleet:
        yield fleet


@contextlib.contextmanager
def late_data_port(processes: ProcessFleet) -> Iterator[Relay]:
    """Relays for a worker that dials ``RELAYED_HOST``: gRPC at once, the data
    port (as the coordinator's log names it) once the test opens the returned relay."""
    log = processes.wait_for_log(processes.coordinator, "serving the lease data channel on ")
    found = re.search(r"serving the lease data channel on 127\.0\.0\.1:(\d+)", log)
    assert found is not None, log
    grpc_relay = Relay(processes.port, opened=True)
    data_relay = Relay(int(found.group(1)), opened=False)
    try:
        yield data_relay
    finally:
        data_relay.close()
        grpc_relay.close()


def start_late_worker(processes: ProcessFleet, envs: int = 2) -> Proc:
    return processes.start_worker(
        envs=envs,
        imports=[TEST_ENVS_MODULE],
        coordinator=f"{RELAYED_HOST}:{processes.port}",
    )


def test_results_move_to_a_data_connection_that_opens_after_the_first_result(
    processes: ProcessFleet,
) -> None:
    # The first results of the session go on the Join stream; once the data
    # connection is open, the rest go there, mid-request: every episode
    # once, the same batches as LocalSampler's.
    coordinator = processes.start_coordinator(*env_flags(SLOW_ENV))
    with late_data_port(processes) as data_port:
        sampler = processes.sampler(seed=SEED, timeout=120)
        answer = run_in_thread(lambda: sampler.obtain_episodes(24))
        worker = start_late_worker(processes)
        processes.wait_for_log(worker, ON_JOIN)
        data_port.open()
        first = answer(120)
        processes.wait_for_log(worker, DATA_OPEN)
        second = sampler.obtain_episodes(8)
        log = processes.wait_for_log(worker, MOVED)
        assert "removed" not in coordinator.log_text()  # one session throughout
    expected = local_episodes(SLOW_ENV_TWIN, 24, 8, seed=SEED)
    assert_same_batch(first, expected[0])
    assert_same_batch(second, expected[1])
    assert "they move to the data channel once it opens" in log
    assert "WARNING" not in log


def test_fragments_continue_across_the_move_as_local_samplers(processes: ProcessFleet) -> None:
    # Windows of one task straddle the move (the first ones on the Join
    # stream, the next ones on the data connection), and the streams go on
    # across requests: the same fragments as LocalSampler's.
    processes.start_coordinator(*env_flags(SLOW_ENV))
    with late_data_port(processes) as data_port:
        sampler = processes.sampler(seed=SEED, timeout=120)
        answer = run_in_thread(lambda: sampler.obtain_fragments(2 * 3 * 20, 3))
        worker = start_late_worker(processes)
        processes.wait_for_log(worker, ON_JOIN)
        data_port.open()
        first = answer(120)
        processes.wait_for_log(worker, DATA_OPEN)
        second = sampler.obtain_fragments(2 * 3 * 10, 3)
        processes.wait_for_log(worker, MOVED)
    with LocalSampler(SLOW_ENV_TWIN, n_workers=1, envs_per_worker=2, seed=SEED) as local:
        assert_same_batch(first, local.obtain_fragments(2 * 3 * 20, 3))
        assert_same_batch(second, local.obtain_fragments(2 * 3 * 10, 3))


@contextlib.contextmanager
def moved_mid_request(
    processes: ProcessFleet, episodes: int
) -> Iterator[tuple[Proc, Callable[[float], EpisodeBatch]]]:
    """A worker whose data connection opened after its first result and whose
    results moved there, beside a worker of the usual kind, while it still
    holds units of a request for ``episodes`` episodes: yields it and the
    request's answer."""
    processes.start_coordinator(*env_flags(SLOW_ENV))
    with late_data_port(processes) as data_port:
        sampler = processes.sampler(seed=SEED, timeout=120)
        answer = run_in_thread(lambda: sampler.obtain_episodes(episodes))
        worker = start_late_worker(processes)
        processes.wait_for_log(worker, ON_JOIN)
        processes.start_worker(envs=2, imports=[TEST_ENVS_MODULE])
        data_port.open()
        processes.wait_for_log(worker, MOVED)  # some results on each carrier by now
        processes.wait_until(lambda: processes.units_on(worker.name), what="units on it")
        yield worker, answer


def test_a_worker_killed_after_its_results_moved_loses_and_duplicates_nothing(
    processes: ProcessFleet,
) -> None:
    with moved_mid_request(processes, 40) as (victim, answer):
        processes.kill(victim)
        batch = answer(120)
    assert_same_batch(batch, local_episodes(SLOW_ENV_TWIN, 40, seed=SEED)[0])


def test_a_worker_leaving_after_its_results_moved_keeps_its_last_results(
    processes: ProcessFleet,
) -> None:
    # SIGTERM once the results moved: the worker sends its last results on
    # the data connection, then the end-of-results marker, and leaves; the
    # coordinator books its end only after them, and nothing is lost or
    # repeated.
    with moved_mid_request(processes, 40) as (leaver, answer):
        assert processes.terminate(leaver) == 0
        batch = answer(120)
        log = processes.wait_for_log(processes.coordinator, f"'{leaver.name}' removed (OK")
    assert_same_batch(batch, local_episodes(SLOW_ENV_TWIN, 40, seed=SEED)[0])
    assert "did not deliver its last results" not in log


SWITCH_CAPABILITIES = (*DATA_CAPABILITIES, _rpc.RESULTS_SWITCH_CAPABILITY)


def results_switch() -> worker_pb2.WorkerMessage:
    return worker_pb2.WorkerMessage(results_switch=leases_pb2.LeaseDataSwitch())


def test_data_results_wait_for_the_results_switch_marker_on_the_join_stream(
    processes: ProcessFleet,
) -> None:
    # A scripted worker sends its results on the data connection before its
    # marker: the coordinator books them once the marker is read, not before
    # (the request is answered only then), and every episode once.
    processes.start_coordinator("--env", "CartPole-v1")
    held = HeldResults()
    with scripted_data_worker(processes.address, held, SWITCH_CAPABILITIES) as (worker, link):
        assert _rpc.RESULTS_SWITCH_CAPABILITY in worker.welcome.capabilities
        processes.wait_for_workers(1)
        answer = run_in_thread(lambda: processes.sampler(seed=SEED).obtain_episodes(2))
        wait_until(lambda: held.results >= 1, "the worker to run its task")
        link.send_frames(held.messages)
        with pytest.raises(AssertionError, match="hung"):
            answer(2)  # held on the coordinator: nothing booked before the marker
        worker.worker.send(results_switch())
        batch = answer(60)
    assert batch.n_episodes == 2


def test_a_result_on_the_join_stream_after_the_marker_drops_the_worker(
    processes: ProcessFleet,
) -> None:
    coordinator = processes.start_coordinator("--env", "CartPole-v1")
    held = HeldResults()
    with scripted_data_worker(processes.address, held, SWITCH_CAPABILITIES) as (worker, _):
        processes.wait_for_workers(1)
        run_in_thread(lambda: processes.sampler(seed=SEED, timeout=30).obtain_episodes(2))
        wait_until(lambda: held.results >= 1, "the worker to run its task")
        worker.worker.send(results_switch())
        worker.worker.send(worker_pb2.WorkerMessage.FromString(held.messages[0]))
        log = processes.wait_for_log(coordinator, f"worker '{worker.welcome.name}' removed")
    assert "INVALID_ARGUMENT" in log and "after its results switch marker" in log


def test_a_marker_without_the_capability_drops_the_worker(processes: ProcessFleet) -> None:
    # A worker that did not agree on rlfleet.results-switch keeps one carrier
    # per session; a marker from it breaks the protocol.
    coordinator = processes.start_coordinator("--env", "CartPole-v1")
    with scripted_data_worker(processes.address, HeldResults()) as (worker, _):
        processes.wait_for_workers(1)
        worker.worker.send(results_switch())
        log = processes.wait_for_log(coordinator, f"worker '{worker.welcome.name}' removed")
    assert "INVALID_ARGUMENT" in log and "without agreeing on rlfleet.results-switch" in log
