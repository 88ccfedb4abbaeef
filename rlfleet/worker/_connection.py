"""One Join stream of a worker: an outbox it writes to, an inbox it polls.

gRPC's streaming API is blocking on both sides, but the worker's main
thread must never block on the network between env steps. So the request
side is a generator fed by a queue (gRPC's own thread pulls from it and
applies HTTP/2 flow control), and a receiver thread moves every incoming
message into an inbox the main loop polls without blocking. Both sides speak
rlfleet types: the call's (de)serializers translate (``_join_messages``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

import grpc

from rlfleet.errors import UnavailableError
from rlfleet.protocol.join import WorkerHello, WorkerWelcome
from rlfleet.security import ClientSecurity
from rlfleet.transport import rpc as _rpc
from rlfleet.worker._join_messages import (
    CoordinatorEvent,
    LeaseCommandIn,
    LeaseDataSwitch,
    Outgoing,
    body_name,
    parse_coordinator_message,
    serialize_outgoing,
)

logger = logging.getLogger("rlfleet.worker")


@dataclass(frozen=True)
class StreamEnded:
    """Put in the inbox when the coordinator's side of the stream ends.

    Attributes:
        error: The call's error, or None if the coordinator ended it with OK.
    """

    error: grpc.RpcError | None

    @property
    def code(self) -> grpc.StatusCode:
        """The call's status code (OK when it ended cleanly)."""
        if self.error is None:
            return grpc.StatusCode.OK
        code = self.error.code() if hasattr(self.error, "code") else None
        return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN

    def describe(self) -> str:
        """``CODE: details`` of the call's end, for logs."""
        if self.error is None:
            return "the coordinator ended the stream"
        details = self.error.details() if hasattr(self.error, "details") else str(self.error)
        return f"{self.code.name}: {details}"


class Wakeup:
    """Put in the inbox to wake a main loop waiting on it (signal handlers)."""


Incoming: TypeAlias = CoordinatorEvent | StreamEnded | Wakeup


class JoinStream:
    """A started Join call.

    Args:
        channel: The channel to the coordinator.
        inbox: Where incoming messages go (shared with signal handlers,
            which put :class:`Wakeup` in it). ``SimpleQueue.put`` is
            reentrant, so a signal handler may call it at any moment.
    """

    def __init__(self, channel: grpc.Channel, inbox: queue.SimpleQueue[Incoming]) -> None:
        self.inbox = inbox
        #: If set, takes lease commands straight from the receiver thread: a
        #: learner's step must not wait for the main loop's sampling step.
        self.lease_handler: Callable[[LeaseCommandIn | LeaseDataSwitch], None] | None = None
        # Unbounded on purpose: the coordinator hands a worker at most its
        # capacity of units, so the results waiting here are bounded by the
        # work it was given; gRPC drains the queue under flow control.
        self._outbox: queue.SimpleQueue[Outgoing | None] = queue.SimpleQueue()
        join = channel.stream_stream(
            _rpc.JOIN,
            request_serializer=serialize_outgoing,
            response_deserializer=parse_coordinator_message,
        )
        # The receiver waits for the coordinator's few messages without
        # grpcio's polls, which would take the GIL from the stepping thread.
        _rpc.install_long_waits()
        self._call = join(self._requests())
        self._receiver = threading.Thread(
            target=self._receive, name="rlfleet-worker-receiver", daemon=True
        )
        self._receiver.start()

    def send(self, message: Outgoing) -> None:
        """Queues a message (never blocks)."""
        self._outbox.put(message)

    def close_send(self) -> None:
        """Half-closes the stream once everything queued before is sent."""
        self._outbox.put(None)

    def cancel(self) -> None:
        """Ends the call at once (idempotent)."""
        self._call.cancel()
        self._outbox.put(None)  # frees gRPC's thread blocked on the request generator

    def wait_closed(self, timeout: float) -> bool:
        """Waits for the receiver thread to see the stream end; False on timeout."""
        self._receiver.join(timeout)
        return not self._receiver.is_alive()

    def _requests(self) -> Iterator[Outgoing]:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            yield item

    def _receive(self) -> None:
        try:
            for message in self._call:
                handler = self.lease_handler
                if handler is not None and isinstance(message, LeaseCommandIn | LeaseDataSwitch):
                    handler(message)
                else:
                    self.inbox.put(message)
        except grpc.RpcError as exc:
            self.inbox.put(StreamEnded(exc))
            return
        except Exception as exc:  # a deserializer failure must still end the session
            logger.warning("the Join stream failed: %s: %s", type(exc).__name__, exc)
            self.inbox.put(StreamEnded(None))
            return
        self.inbox.put(StreamEnded(None))


@contextlib.contextmanager
def lease_data_ticket(
    address: str, *, security: ClientSecurity | None, timeout: float, implementation: str
) -> Iterator[tuple[int, bytes] | None]:
    """Joins as a one-env worker that hosts leases, for as long as its data ticket is needed.

    The conformance kit's coordinator checks present this ticket (and bad
    ones) to the coordinator's data port; the Join stream stays open
    meanwhile, as a ticket lives only as long as its session.

    Args:
        address: The coordinator's ``HOST:PORT``.
        security: TLS and the worker token, or None.
        timeout: Seconds to wait for the Welcome.
        implementation: ``Hello.implementation``.

    Yields:
        ``(port, ticket)`` of ``Welcome.lease_data``, or None when the
        coordinator offers no data channel.

    Raises:
        UnavailableError: If no Welcome came within ``timeout`` seconds.
    """
    channel = _rpc.open_channel(address, security=security)
    inbox: queue.SimpleQueue[Incoming] = queue.SimpleQueue()
    stream = JoinStream(channel, inbox)
    try:
        stream.send(
            WorkerHello(
                protocol_version=_rpc.PROTOCOL_VERSION,
                capabilities=("rlfleet.episodes", _rpc.LEASE_CAPABILITY),
                num_envs=1,
                lease_slots=1,
                host=socket.gethostname(),
                pid=os.getpid(),
                implementation=implementation,
            )
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                message = inbox.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise UnavailableError(
                    f"no Welcome from {address} within {timeout:g} seconds of Hello"
                ) from None
            if isinstance(message, StreamEnded):
                raise UnavailableError(f"{address} ended the Join stream: {message.describe()}")
            if not isinstance(message, Wakeup):
                break
        if not isinstance(message, WorkerWelcome):
            raise UnavailableError(
                f"{address} sent {body_name(message)} before Welcome on the Join stream"
            )
        yield message.lease_data
    finally:
        stream.cancel()
        channel.close()
