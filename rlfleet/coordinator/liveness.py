"""Liveness: workers that fell silent or stalled, and requests left without workers.

gRPC keepalive notices a vanished peer; heartbeats notice a worker whose
process is alive but stuck; progress deadlines (coordinator/progress.py) a
worker that beats but never finishes its units. A background thread checks
them a few times per heartbeat interval.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc

from rlfleet.coordinator.state import FleetState
from rlfleet.coordinator.worker_events import WorkerEvents

logger = logging.getLogger("rlfleet.coordinator")


class Liveness:
    """The thread that declares silent workers dead and fails starved requests.

    Args:
        state: The fleet state.
        workers: Removes dead workers (re-queueing their units).
    """

    def __init__(self, state: FleetState, workers: WorkerEvents) -> None:
        self._state = state
        self._workers = workers
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="rlfleet-coordinator-liveness", daemon=True
        )

    def start(self) -> None:
        """Starts the checks."""
        self._thread.start()

    def stop(self) -> None:
        """Stops the checks (idempotent)."""
        self._stopped.set()

    def _run(self) -> None:
        config = self._state.config
        period = min(config.heartbeat_interval_seconds, 1.0) / 2
        while not self._stopped.wait(period):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """One round of checks at ``now`` (``time.monotonic()``)."""
        state = self._state
        timeout = state.config.heartbeat_timeout_seconds
        with state.lock:
            silent = state.registry.silent(now, timeout)
        for handle in silent:
            self._workers.drop(
                handle,
                grpc.StatusCode.UNAVAILABLE,
                f"no message from worker {handle.name!r} for {timeout:g} seconds "
                "(heartbeat timeout); it is declared dead, reconnect to join again",
            )
        with state.lock:
            busy = [h for h in state.registry if state.scheduler.units_in_flight(h.worker_id)]
            stalled = set(state.progress.stalled((h.worker_id for h in busy), now))
            deadline = state.progress.deadline
        for handle in busy:
            if handle.worker_id in stalled:
                self._workers.drop(
                    handle,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"worker {handle.name!r} holds units but delivered no result for "
                    f"{deadline:g} seconds (progress deadline, --progress-deadline); its units "
                    "run elsewhere. Check its envs for a step that never returns",
                )
        with state.lock:
            self._fail_starved(now)

    def _fail_starved(self, now: float) -> None:
        """Fails Sample requests that have had no ready worker for their wait (lock held).

        Subscriptions wait as long as it takes: a learner streaming through a
        fleet restart should get results again when workers come back.
        """
        state = self._state
        starving = state.scheduler.eligible_workers == 0
        for request_id, call in list(state.calls.items()):
            if call.outbox.subscription or not starving:
                call.starved_since = None
            elif call.starved_since is None:
                call.starved_since = now
            elif now - call.starved_since > call.wait_for_workers:
                failure = state.no_workers(call.wait_for_workers)
                logger.warning("request %d failed: %s", request_id, failure.message)
                state.fail_call(request_id, failure)
