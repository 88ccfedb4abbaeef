"""serve(): the coordinator's gRPC server (both faces, standard health and reflection).

Threads, not grpc.aio, chosen by measurement. The coordinator mostly
routes chunks that are already serialized, so a message's cost is in
gRPC's C core either way, and threads keep the scheduler a plain
lock-and-condition state machine that the Join reader threads and learner
calls share with no event-loop hop. Measured on this project's 2-core VM
(server-streaming calls of 20 000 pre-serialized messages, identity
(de)serializers, client in a separate process; median of 5 runs, msg/s;
the VM was shared and loaded, so runs varied by up to 3x):

    message  calls   sync (ThreadPoolExecutor)   grpc.aio
    1 KiB      1          11 100                   8 000
    1 KiB      4           8 700                   7 900
    64 KiB     1           5 500                   5 800
    64 KiB     4           8 400                   7 300

aio is not faster, so it would not pay for a second concurrency model. The
lease relay's round trips (two bidirectional streams, every message
forwarded) measured the same: 0.54-0.77 ms sync, 0.55-0.65 ms aio, ~70-100
us of relay CPU per message either way (benchmarks/relay_floor.py). A
Join stream holds a pool thread for its lifetime, so the pool is sized for
max_workers streams plus the learner calls
(:attr:`CoordinatorConfig.thread_pool_size`).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.coordinator import Coordinator
from rlfleet.coordinator.learner_face import LearnerFace
from rlfleet.coordinator.worker_face import WorkerFace
from rlfleet.errors import ConfigError
from rlfleet.security.listen import bind_problem
from rlfleet.transport import rpc as _rpc

logger = logging.getLogger("rlfleet.coordinator")

#: Services the health servicer reports on ("" is the server as a whole).
HEALTH_SERVICES = ("", _rpc.WORKER_SERVICE, _rpc.LEARNER_SERVICE)
#: Least time drained workers get to send what they run and close.
RELEASE_SECONDS = 1.0


class CoordinatorServer:
    """A running coordinator: its gRPC server, health and fleet state.

    Made by :func:`serve`. Usable as a context manager (stops on exit).

    Attributes:
        coordinator: The fleet state.
        host: The host it listens on.
        port: The bound port (the real one when 0 was asked for).
    """

    def __init__(
        self,
        server: grpc.Server,
        coordinator: Coordinator,
        health_servicer: health.HealthServicer,
        host: str,
        port: int,
    ) -> None:
        self.coordinator = coordinator
        self.host = host
        self.port = port
        self._server = server
        self._health = health_servicer
        self._stopped = threading.Event()

    @property
    def health_servicer(self) -> health.HealthServicer:
        """The grpc.health.v1 servicer of the main port.

        Registering it on another server (``--health-listen``, a plaintext
        port for Kubernetes probes) reports the same statuses there.
        """
        return self._health

    @property
    def address(self) -> str:
        """``HOST:PORT`` to give workers and learners (wildcards become loopback)."""
        host = self.host
        if host in ("0.0.0.0", "[::]", "::", ""):
            host = "127.0.0.1"
        return f"{host}:{self.port}"

    def stop(
        self, grace: float | None = None, reason: str = "the coordinator is shutting down"
    ) -> None:
        """Stops serving: ends worker streams and calls, then the server.

        Args:
            grace: Seconds given to calls in progress; None ends them now.
            reason: Why, in the UNAVAILABLE status of the calls it ends.
        """
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._report(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.coordinator.close(reason)
        self._server.stop(grace).wait()
        logger.info("coordinator on %s stopped", self.address)

    def drain(self, grace: float) -> bool:
        """Winds down gracefully without stopping (SIGTERM, Kubernetes preemption).

        At once: health NOT_SERVING, new requests and workers refused with
        UNAVAILABLE, subscriptions ended. Then the requests in flight get up
        to ``grace`` seconds to finish; then the workers are sent Drain and
        get the rest of the grace (at least :data:`RELEASE_SECONDS`) to send
        what they run and close their streams. Call :meth:`stop` after it.

        Returns:
            True if every request in flight finished within the grace.
        """
        deadline = time.monotonic() + grace
        self._report(health_pb2.HealthCheckResponse.NOT_SERVING)
        coordinator = self.coordinator
        coordinator.drain()
        finished = coordinator.wait_idle(grace)
        if not finished:
            logger.warning(
                "requests still running after the drain grace of %g seconds; ending them", grace
            )
        release = max(deadline - time.monotonic(), RELEASE_SECONDS)
        coordinator.release_workers(release)
        if not coordinator.wait_workers_gone(release):
            logger.warning("workers still connected %g seconds after Drain", release)
        return finished

    def _report(self, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        for service in HEALTH_SERVICES:
            self._health.set(service, status)

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        """Blocks until the server stops; returns False if ``timeout`` ran out."""
        return not self._server.wait_for_termination(timeout)

    def __enter__(self) -> CoordinatorServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(config: CoordinatorConfig | None = None) -> CoordinatorServer:
    """Starts a coordinator.

    Args:
        config: Its settings (defaults: 127.0.0.1:50051, CartPole-v1).

    Returns:
        The running server; its ``port`` is the bound port.

    Raises:
        ConfigError: If the address cannot be bound.
    """
    config = config or CoordinatorConfig()
    # The gRPC port first: a second coordinator on a taken port must hear
    # about that port, not about the lease data port beside it.
    taken = bind_problem(config.listen)
    if taken is not None:
        raise ConfigError(
            f"cannot listen on {config.listen}: {taken}; is another coordinator running "
            "there? Stop it, or give --listen another HOST:PORT"
        )
    coordinator = Coordinator(config)
    coordinator.serve_lease_data()  # before the faces, which hand out its tickets
    server = grpc.server(
        ThreadPoolExecutor(
            max_workers=config.thread_pool_size, thread_name_prefix="rlfleet-coordinator"
        ),
        options=_rpc.server_options(
            max_message_bytes=config.max_message_bytes,
            keepalive_seconds=config.keepalive_seconds,
            ping_timeout_seconds=config.keepalive_timeout_seconds,
        ),
        maximum_concurrent_rpcs=config.thread_pool_size,
        interceptors=config.security.interceptors(
            on_refused=lambda code: coordinator.metrics.error(f"auth_{code}")
        ),
    )
    server.add_generic_rpc_handlers(
        (WorkerFace(coordinator).handler(), LearnerFace(coordinator).handler())
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in HEALTH_SERVICES:
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    _rpc.enable_reflection(server, _rpc.WORKER_SERVICE, _rpc.LEARNER_SERVICE, health.SERVICE_NAME)
    host, _, _ = config.listen.rpartition(":")
    try:
        port = config.security.add_port(server, config.listen)
    except RuntimeError as exc:
        coordinator.close()
        raise ConfigError(f"cannot listen on {config.listen}: {exc}") from exc
    if port == 0:
        coordinator.close()
        raise ConfigError(f"cannot listen on {config.listen}: the address is in use or invalid")
    server.start()
    coordinator.start()
    result = CoordinatorServer(server, coordinator, health_servicer, host, port)
    logger.info("coordinator listening on %s:%d", host, port)
    return result
