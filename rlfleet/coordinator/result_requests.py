"""Sample requests a learner sends on its results connection, answered wholly there.

A coordinator says in ``ResultChannelOpened.requests_on_data`` that it takes
them (learner.proto, "Requests on a learner's results connection"): the
learner sends its ``SampleRequest`` as a frame, and the header, every
result, the footer, or the failure that ends a request in its place, come
back as frames on the connection. No gRPC call is made per request: on
this path a request costs the coordinator no gRPC completion-queue,
event-engine or handler thread work (docs/performance.md, "Per request").

The data loop reads the frame and hands it over; it never runs a request
(a request blocks, for its turn and its results). Each connection has one
thread, started with its first request, that runs its requests in order
with the very generator the gRPC handler uses
(``LearnerRequests.sample``). What holds on the Sample call holds here:
the request's checks and turn are the same code, an error ends the answer
with its code, message and detail (the exceptions the learner raises are
the ones the gRPC status gave), and the learner going away (closing the
connection, which its deadline does) cancels the request and frees its
turn. A connection runs one request at a time: one that arrives while
another runs is refused (RESOURCE_EXHAUSTED) and the other goes on. A frame
that is no SampleRequest, or names no call, closes the connection.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from google.protobuf.message import DecodeError

from rlfleet.coordinator.calls import CallScope, Event, Finished, Forward
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.learner_messages import (
    failure_bytes,
    forwarded_parts,
    header_bytes,
    parse_connection_request,
)
from rlfleet.coordinator.leases.data_connections import LeaseConnection
from rlfleet.errors import WireFormatError
from rlfleet.protocol.learner_calls import CallHeader, SampleAsk

if TYPE_CHECKING:  # result_channels imports this module
    from rlfleet.coordinator.result_channels import ResultChannels, ResultSender

logger = logging.getLogger("rlfleet.coordinator")

#: A refused request's status: the connection serves one request at a time.
_BUSY = grpc.StatusCode.RESOURCE_EXHAUSTED


@dataclass(frozen=True)
class RequestRunner:
    """What serves the requests sent on results connections.

    Attributes:
        sample: The Sample requests' generator (``LearnerRequests.sample``).
        cancel: Wakes what a request whose learner went away waits for
            (``LearnerRequests.cancel``).
        done: Records a request's outcome (``"ok"`` or ``"error"``) and its
            start (``time.monotonic()``), as the gRPC calls' metrics do.
    """

    sample: Callable[[SampleAsk, CallScope, ResultSender], Generator[Event, None, None]]
    cancel: Callable[[CallScope], None]
    done: Callable[[str, float], None]


class ConnectionRequests:
    """A results connection's inbound side: the Sample requests its learner sends.

    Args:
        channels: The coordinator's results connections (the call's sender).
        channel: This connection's id.
        connection: The connection.
        runner: Serves the requests.
    """

    def __init__(
        self,
        channels: ResultChannels,
        channel: int,
        connection: LeaseConnection,
        runner: RequestRunner,
    ) -> None:
        self._channels = channels
        self._channel = channel
        self._connection = connection
        self._runner = runner
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[bytes | memoryview | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # A request came whose answer's last frame is not on its way yet.
        self._running = False
        self._scope: CallScope | None = None  # the running request's
        self._closed = False

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        """Hands each request to the connection's thread (the loop thread: never
        runs one); a request while another runs is refused.

        Raises:
            WireFormatError: For a refused frame that is no SampleRequest.
        """
        for payload in payloads:
            with self._lock:
                if self._closed:
                    return
                refused = self._running
                if not refused:
                    self._running = True
                    if self._thread is None:
                        self._thread = threading.Thread(
                            target=self._run,
                            name=f"rlfleet-learner-requests-{self._channel % 10000:04d}",
                            daemon=True,
                        )
                        self._thread.start()
                    self._requests.put(payload)
            if refused:
                call, _ = _parsed(payload)
                self._refuse(
                    call,
                    "while another runs on it; a connection runs one request at a time: "
                    "send the next once the answer's footer or failure came",
                )

    def on_closed(self, reason: str) -> None:
        """The connection ended: the running request is cancelled, the thread ends."""
        self._channels.closed(self._channel, reason)
        with self._lock:
            self._closed = True
            scope = self._scope
        self._requests.put(None)
        if scope is not None:
            self._runner.cancel(scope)

    def _refuse(self, call: int, why: str) -> None:
        """Answers request ``call`` with a failure (RESOURCE_EXHAUSTED) saying it
        came on the connection ``why``; nothing is sent once the connection closed.

        Without blocking (the loop's thread calls it): a learner that does not
        read its connection is closed by the connection's own bound.
        """
        message = f"a Sample request (call {call}) came on a results connection {why}"
        self._connection.send(failure_bytes(CallError(_BUSY, message), call))

    def _run(self) -> None:
        while True:
            payload = self._requests.get()
            if payload is None:
                return
            try:
                self._serve(payload)
            except Exception:  # a bug must not leave the learner waiting for ever
                logger.exception("results connection %d: a request failed", self._channel)
                self._connection.close("coordinator error serving a request")
                return

    def _released(self) -> None:
        with self._lock:
            self._running = False
            self._scope = None

    def _serve(self, payload: bytes | memoryview) -> None:
        try:
            call, request = _parsed(payload)
        except WireFormatError as exc:
            self._connection.close(str(exc))
            return
        started = time.monotonic()
        sender = self._channels.take(self._channel, call, footer_on_data=True, header_first=True)
        if sender is None:  # closed, or taken by a Sample call that names it
            self._released()
            self._refuse(call, "a Sample call uses; a connection runs one request at a time")
            self._runner.done("error", started)
            return
        sender.released = self._released
        scope = CallScope()
        with self._lock:
            scope.cancelled = self._closed
            self._scope = scope
        outcome = "error"
        try:
            if isinstance(request, CallError):
                raise request
            outcome = self._answer(self._runner.sample(request, scope, sender), sender)
        except CallError as exc:
            sender.end(failure=exc)
        finally:
            scope.served = True
            sender.end(failure=CallError(grpc.StatusCode.INTERNAL, "the request ended early"))
            self._runner.done(outcome, started)

    def _answer(self, events: Generator[Event, None, None], sender: ResultSender) -> str:
        """Sends a request's events as frames; ``"ok"`` once its footer went.

        Raises:
            CallError: The request's failure (its last frame is the sender's).
        """
        try:
            for event in events:
                if isinstance(event, Forward):
                    sender.send(forwarded_parts(event, sender.tail))
                elif isinstance(event, CallHeader):
                    sender.send_header(
                        header_bytes(event, results_on_data=True, footer_on_data=True)
                    )
                elif isinstance(event, Finished):
                    sender.end(event.footer)
                    return "ok"
                else:
                    raise event
        finally:
            # Close now, not at garbage collection: it holds the request's turn.
            events.close()
        raise CallError(grpc.StatusCode.INTERNAL, "the request ended without its footer")


def _parsed(payload: bytes | memoryview) -> tuple[int, SampleAsk | CallError]:
    """A request frame's call number and request.

    Raises:
        WireFormatError: If it is no SampleRequest, or names no call.
    """
    try:
        call, request = parse_connection_request(bytes(payload))
    except (DecodeError, WireFormatError, ValueError) as exc:
        raise WireFormatError(
            f"a frame on a results connection is no SampleRequest ({type(exc).__name__}: "
            f"{exc}); learner.proto, 'Requests on a learner's results connection'"
        ) from None
    if call <= 0:
        raise WireFormatError(
            "a SampleRequest on a results connection names no call (result_call 0); "
            "learner.proto, 'Requests on a learner's results connection'"
        )
    return call, request
