"""Coordinator: the fleet behind both gRPC faces, assembled from its parts.

* :class:`~rlfleet.coordinator.state.FleetState`: everything known, under one lock;
* :class:`~rlfleet.coordinator.worker_events.WorkerEvents`: joins, messages, losses;
* :class:`~rlfleet.coordinator.requests.LearnerRequests`: Sample, Subscribe, updates;
* :class:`~rlfleet.coordinator.liveness.Liveness`: heartbeat timeouts, starved requests;
* :func:`~rlfleet.coordinator.status.fleet_status`: GetStatus.

The faces (``worker_face``, ``learner_face``) only plumb gRPC, and their
messages are read and written in ``worker_messages`` and ``learner_messages``:
these parts hold rlfleet's own types, and nothing here imports a servicer
context.
"""

from __future__ import annotations

import logging

import grpc

from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.leases.data_peers import worker_attach
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.coordinator.leases.manager import LeaseManager
from rlfleet.coordinator.leases.translation import hello_ticket
from rlfleet.coordinator.liveness import Liveness
from rlfleet.coordinator.metrics import CoordinatorMetrics
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.requests import LearnerRequests
from rlfleet.coordinator.state import FleetState
from rlfleet.coordinator.status import FleetSnapshot, fleet_status
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.errors import ConfigError
from rlfleet.protocol.join import DrainOrder

logger = logging.getLogger("rlfleet.coordinator")


class Coordinator:
    """The fleet's state and rules, independent of gRPC plumbing.

    Args:
        config: The coordinator's settings.

    Attributes:
        config: The settings.
        workers: What happens when workers join, speak and leave.
        learners: What learner calls do.
        leases: Step-level env leases.
        lease_data: The lease data channel, once :meth:`serve_lease_data`
            started it (None: off, lease traffic stays on gRPC).
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self._state = FleetState(config)
        self.workers = WorkerEvents(self._state)
        self.learners = LearnerRequests(self._state)
        self._liveness = Liveness(self._state, self.workers)
        self.leases = LeaseManager(self._state)
        self.workers.lost_listeners.append(self.leases.on_worker_lost)
        self._state.metrics.watch(self._state, self.status)
        self.lease_data: LeaseDataServer | None = None

    def serve_lease_data(self) -> None:
        """Starts the lease data channel where the config says (no-op when off).

        Raises:
            ConfigError: If its address cannot be bound.
        """
        listen = self.config.lease_data_address
        if listen is None:
            return
        try:
            server = LeaseDataServer(
                listen,
                tls=self.config.security.tls,
                max_frame_bytes=self.config.max_message_bytes,
                handshake_timeout=self.config.handshake_timeout_seconds,
                parse_hello=hello_ticket,
                on_connection=self.metrics.lease_data_connection,
            )
        except (OSError, OverflowError) as exc:
            raise ConfigError(
                f"cannot listen on {listen} for the lease data channel ({exc}); give "
                "--lease-data-listen another HOST:PORT, or --lease-data-listen off to keep "
                "lease traffic on gRPC"
            ) from None
        self.lease_data = server
        state, events, leases = self._state, self.workers, self.leases

        def ticket(handle: WorkerHandle) -> tuple[int, bytes]:
            return server.port, server.issue(worker_attach(state, events, leases, handle))

        def forget(handle: WorkerHandle) -> None:
            server.revoke(handle.lease_ticket)
            if handle.lease_data is not None:
                handle.lease_data.close(f"worker {handle.name!r} left the fleet")

        events.lease_data_ticket = ticket
        events.lost_listeners.append(forget)

    @property
    def coordinator_id(self) -> str:
        """Changes when the coordinator restarts (Welcome, FleetStatus)."""
        return self._state.coordinator_id

    @property
    def metrics(self) -> CoordinatorMetrics:
        """The Prometheus metrics (serve ``metrics.registry`` to expose them)."""
        return self._state.metrics

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` was called."""
        return self._state.draining

    def start(self) -> None:
        """Starts the liveness checks."""
        self._liveness.start()

    def status(self) -> FleetSnapshot:
        """The fleet as it is now (GetStatus)."""
        status = fleet_status(self._state)
        status.leases, status.leased_envs, by_worker = self.leases.counts()
        for worker in status.workers:
            worker.leased_envs = by_worker.get(worker.worker_id, 0)
        return status

    def drain(self, reason: str = "the coordinator is draining") -> None:
        """Starts a graceful shutdown: no new requests, workers or subscriptions.

        Requests already running (or queued for their turn) go on: wait for
        them with :meth:`wait_idle`, then send the workers Drain with
        :meth:`release_workers`. Open subscriptions end now with UNAVAILABLE,
        as they would never finish by themselves. Idempotent.
        """
        state = self._state
        with state.lock:
            if not state.draining:
                logger.info("%s: new requests and workers are refused", reason)
            state.draining = True
            for request_id, call in list(state.calls.items()):
                if call.outbox.subscription:
                    failure = CallError(
                        grpc.StatusCode.UNAVAILABLE, f"{reason}; subscribe to its replacement"
                    )
                    state.fail_call(request_id, failure)
            state.changed.notify_all()
        self.leases.fail_all(
            CallError(grpc.StatusCode.UNAVAILABLE, f"{reason}; lease envs from its replacement")
        )

    def wait_idle(self, timeout: float) -> bool:
        """Waits until no Sample or update request runs or waits for its turn.

        Returns:
            False if some still run after ``timeout`` seconds.
        """
        state = self._state
        with state.lock:
            return state.changed.wait_for(lambda: not state.gate.waiting, timeout)

    def release_workers(
        self, grace_seconds: float, reason: str = "the coordinator is shutting down"
    ) -> None:
        """Sends every worker Drain: finish the episodes in flight, send them, close."""
        state = self._state
        message = DrainOrder(reason, grace_seconds)
        with state.lock:
            for handle in state.registry:
                handle.send(message)

    def wait_workers_gone(self, timeout: float) -> bool:
        """Waits until every worker closed its stream; False after ``timeout`` seconds."""
        state = self._state
        with state.lock:
            return state.changed.wait_for(lambda: not len(state.registry), timeout)

    def close(self, reason: str = "the coordinator is shutting down") -> None:
        """Ends every worker stream and learner call with UNAVAILABLE (idempotent)."""
        self._liveness.stop()
        if self.lease_data is not None:
            self.lease_data.stop()
        # First, so that dropping the workers below does not move leased envs.
        self.leases.fail_all(CallError(grpc.StatusCode.UNAVAILABLE, reason))
        state = self._state
        with state.lock:
            workers = list(state.registry)
            calls = list(state.calls)
        for handle in workers:
            self.workers.drop(handle, grpc.StatusCode.UNAVAILABLE, f"{reason}; reconnect")
        with state.lock:
            for request_id in calls:
                state.fail_call(request_id, CallError(grpc.StatusCode.UNAVAILABLE, reason))
