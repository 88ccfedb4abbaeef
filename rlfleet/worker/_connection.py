"""One Join stream of a worker: an outbox it writes to, an inbox it polls.

gRPC's streaming API is blocking on both sides, but the worker's main
thread must never block on the network between env steps. So the request
side is a generator fed by a queue (gRPC's own thread pulls from it and
applies HTTP/2 flow control), and a receiver thread moves every incoming
CoordinatorMessage into an inbox the main loop polls without blocking.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias

import grpc
from google.protobuf.message import Message

from rlfleet import _rpc
from rlfleet.v1 import leases_pb2, worker_pb2

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


Incoming: TypeAlias = worker_pb2.CoordinatorMessage | StreamEnded | Wakeup
# bytes: a message serialized already (a result's chunks, see _rpc.serialize).
Outgoing: TypeAlias = Message | _rpc.WithChunk | bytes


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
        self.lease_handler: Callable[[leases_pb2.LeaseCommand], None] | None = None
        # Unbounded on purpose: the coordinator hands a worker at most its
        # capacity of units, so the results waiting here are bounded by the
        # work it was given; gRPC drains the queue under flow control.
        self._outbox: queue.SimpleQueue[Outgoing | None] = queue.SimpleQueue()
        join = channel.stream_stream(
            _rpc.JOIN,
            request_serializer=_rpc.serialize,
            response_deserializer=_rpc.plain_deserializer(worker_pb2.CoordinatorMessage),
        )
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
                if self.lease_handler is not None and message.WhichOneof("body") == "lease":
                    self.lease_handler(message.lease)
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
