"""What a worker's lease data connection means to the fleet.

A worker that hosts leases gets a ticket in its Welcome (worker_events.py),
one per Join session. Presenting it attaches the connection: the worker
first gets the switch marker on its Join stream, then every lease command on
the connection (``WorkerHandle.send_lease``), and, when it agreed on
``rlfleet.data-tasks``, every Task and Cancel (``WorkerHandle.send_work``);
its replies go to the same ``LeaseManager.on_reply`` as the Join stream's.
A worker that agreed on ``rlfleet.data-results`` sends its results there
too: the loop hands each
message to the session's :class:`ResultLane`, which joins and books them as
the Join stream's reader would, at the end of the loop's wake-up or on the
lane's own thread (result_lane.py says when), once its results switch
marker was read on its Join stream when it also agreed on
``rlfleet.results-switch`` (its results may move here mid-session); its
end-of-results marker (a Leaving) tells a graceful end of its Join stream
that nothing more comes. When the connection ends
while the worker is in the fleet, the worker is dropped as lost: its leased
envs are re-created elsewhere, and it rejoins with a new session; a worker
that said Leaving (or is drained) closes it on purpose, and its Join
stream's end decides. (A learner's lease data connection is face.py's.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import cast

import grpc

from rlfleet.coordinator.leases.data_connections import (
    DataConnection,
    LeaseConnection,
    LeaseDataPeer,
)
from rlfleet.coordinator.leases.manager import LeaseManager
from rlfleet.coordinator.leases.result_lane import ResultLane
from rlfleet.coordinator.leases.translation import (
    RelayReply,
    data_switch_command,
    relay_deserializer,
)
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.state import FleetState
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.coordinator.worker_messages import HEARTBEAT_TAG, parse_worker_message
from rlfleet.errors import (
    ProtocolError,
    ResourceExhaustedError,
    UnavailableError,
    WireFormatError,
)
from rlfleet.protocol.join import WorkerBeat
from rlfleet.transport import rpc as _rpc

logger = logging.getLogger("rlfleet.coordinator")


class WorkerDataPeer:
    """A worker session's data connection: its lease replies in, and its results
    when it agreed on ``rlfleet.data-results`` (``results``, else None)."""

    def __init__(
        self,
        state: FleetState,
        events: WorkerEvents,
        leases: LeaseManager,
        handle: WorkerHandle,
        count: Callable[[str, int], None],
        *,
        results: ResultLane | None,
    ) -> None:
        self._state = state
        self._count = count
        self._events = events
        self._leases = leases
        self._handle = handle
        self._results = results
        # Its heartbeats may come here (and are read on this thread: they
        # carry only figures, in no order with its results).
        self._beats = _rpc.DATA_HEARTBEATS_CAPABILITY in handle.hello.capabilities

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        handle = self._handle
        handle.touch()
        # The results of a wake-up's frames go to the lane together (one
        # put, one wake-up of its thread), in order with the replies between.
        results: list[bytes | memoryview] = []
        try:
            try:
                for payload in payloads:
                    item = _parse_frame(payload)
                    if isinstance(item, RelayReply):
                        if results:
                            queued, results = results, []
                            self._queue(queued)
                        self._count("worker", 1)
                        self._leases.on_reply(handle, item)
                    elif (
                        self._beats
                        and payload[:1] == HEARTBEAT_TAG
                        and isinstance(beat := parse_worker_message(payload), WorkerBeat)
                    ):
                        self._events.on_heartbeat(handle, beat)
                    elif self._results is None:
                        raise WireFormatError(
                            "a worker's lease data frame must be a WorkerMessage holding only "
                            "lease_reply, unless it agreed on rlfleet.data-results (leases.proto, "
                            "'The lease data channel')"
                        )
                    else:
                        results.append(payload)
            finally:
                # What came before a broken frame is queued as it would have been.
                if results:
                    queued, results = results, []
                    self._queue(queued)
        except ResourceExhaustedError as exc:
            self._events.drop(handle, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
            raise
        except (ProtocolError, WireFormatError) as exc:
            # Refused as on its Join stream (INVALID_ARGUMENT), not as a
            # broken connection; raising then closes the connection.
            self._events.drop(handle, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    def _queue(self, results: list[bytes | memoryview]) -> None:
        """Hands result frames to the lane: parsed and booked on the session's
        own thread, in order."""
        lane = cast(ResultLane, self._results)
        self._count("results", len(results))
        lane.put_many(results)

    def on_closed(self, reason: str) -> None:
        handle = self._handle
        if self._results is not None:
            self._results.close()  # nothing more can come on it
        if handle.leaving or self._state.draining:
            # A worker that leaves (or is drained) closes both its connections;
            # its Join stream's end removes it (OK), or its break (a warning).
            logger.info(
                "worker %r closed its lease data connection while leaving (%s)",
                handle.name,
                reason,
                extra={"worker": handle.name},
            )
            return
        self._events.drop(
            self._handle,
            grpc.StatusCode.UNAVAILABLE,
            # "stream broke", as for its Join stream: a killed worker's two
            # connections break together, and either may be noticed first.
            f"its lease data stream broke ({reason}: the worker died or lost its connection, "
            "or broke the protocol); rejoin",
        )


def worker_attach(
    state: FleetState, events: WorkerEvents, leases: LeaseManager, handle: WorkerHandle
) -> Callable[[LeaseConnection], LeaseDataPeer]:
    """The attach callback of a worker session's ticket."""

    def attach(connection: LeaseConnection) -> LeaseDataPeer:
        with state.lock:  # lease commands are sent under it: none falls between
            if not handle.alive:
                raise UnavailableError(f"worker {handle.name!r} left before its data connection")
            handle.send(data_switch_command())
            handle.lease_data = connection
            if _rpc.DATA_TASKS_CAPABILITY in handle.hello.capabilities:
                # Tasks and Cancels too, from now on: the marker went ahead of
                # them, and they are sent under the lock as well.
                handle.task_data = connection
                state.metrics.work_frames.session_agreed()
            results = None
            if _rpc.DATA_RESULTS_CAPABILITY in handle.hello.capabilities:
                done = handle.data_results_done = threading.Event()
                limit = state.config.limits.max_inflight_bytes_per_worker
                after = (
                    handle.join_results_over
                    if _rpc.RESULTS_SWITCH_CAPABILITY in handle.hello.capabilities
                    else None
                )
                # A socket's frames come on the data loop's thread: booked
                # once that wake-up of the loop was served (there, or by the
                # lane's thread).
                defer = connection.after_wake_up if isinstance(connection, DataConnection) else None
                results = ResultLane(
                    events, handle, done, limit, connection.close, after=after, defer=defer
                )
        count = state.metrics.lease_data_frame
        return WorkerDataPeer(state, events, leases, handle, count, results=results)

    return attach


def _as_is(data: bytes | memoryview) -> bytes | memoryview:
    """The frame itself (``bytes(data)`` would copy a view's bytes)."""
    return data


#: A lease reply, or the frame's bytes as they came (the result lane parses them).
_parse_frame: Callable[[bytes | memoryview], bytes | memoryview | RelayReply] = relay_deserializer(
    _as_is
)
