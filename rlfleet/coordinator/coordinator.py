"""Coordinator: the fleet behind both gRPC faces, assembled from its parts.

* :class:`~rlfleet.coordinator.state.FleetState`: everything known, under one lock;
* :class:`~rlfleet.coordinator.worker_events.WorkerEvents`: joins, messages, losses;
* :class:`~rlfleet.coordinator.requests.LearnerRequests`: Sample, Subscribe, updates;
* :class:`~rlfleet.coordinator.liveness.Liveness`: heartbeat timeouts, starved requests;
* :func:`~rlfleet.coordinator.status.fleet_status`: GetStatus.

The faces (``worker_face``, ``learner_face``) only translate between gRPC
and these parts; nothing here imports a servicer context.
"""

from __future__ import annotations

import grpc

from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.liveness import Liveness
from rlfleet.coordinator.requests import LearnerRequests
from rlfleet.coordinator.state import FleetState
from rlfleet.coordinator.status import fleet_status
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.v1 import learner_pb2, worker_pb2


class Coordinator:
    """The fleet's state and rules, independent of gRPC plumbing.

    Args:
        config: The coordinator's settings.

    Attributes:
        config: The settings.
        workers: What happens when workers join, speak and leave.
        learners: What learner calls do.
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self._state = FleetState(config)
        self.workers = WorkerEvents(self._state)
        self.learners = LearnerRequests(self._state)
        self._liveness = Liveness(self._state, self.workers)

    @property
    def coordinator_id(self) -> str:
        """Changes when the coordinator restarts (Welcome, FleetStatus)."""
        return self._state.coordinator_id

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` was called."""
        return self._state.draining

    def start(self) -> None:
        """Starts the liveness checks."""
        self._liveness.start()

    def status(self) -> learner_pb2.FleetStatus:
        """The fleet as it is now (GetStatus)."""
        return fleet_status(self._state)

    def drain(self, grace_seconds: float, reason: str = "the coordinator is draining") -> None:
        """Refuses new requests and workers, and tells workers to finish and leave.

        A first step toward graceful shutdown (a later issue completes it).
        """
        state = self._state
        message = worker_pb2.CoordinatorMessage(
            drain=worker_pb2.Drain(reason=reason, grace_seconds=grace_seconds)
        )
        with state.lock:
            state.draining = True
            for handle in state.registry:
                handle.send(message)
            state.changed.notify_all()

    def close(self, reason: str = "the coordinator is shutting down") -> None:
        """Ends every worker stream and learner call with UNAVAILABLE (idempotent)."""
        self._liveness.stop()
        state = self._state
        with state.lock:
            workers = list(state.registry)
            calls = list(state.calls)
        for handle in workers:
            self.workers.drop(handle, grpc.StatusCode.UNAVAILABLE, f"{reason}; reconnect")
        with state.lock:
            for request_id in calls:
                state.fail_call(request_id, CallError(grpc.StatusCode.UNAVAILABLE, reason))
