"""A scripted test coordinator: a real gRPC server whose Join calls a check drives.

Unlike the real coordinator, this one makes no decisions. Every Join call
becomes a :class:`ScriptedSession` that a check picks up with
:meth:`ScriptedCoordinator.accept` and then scripts by hand: it sends
CoordinatorMessages, reads the worker's messages in stream order (each
stamped with its arrival time and its serialized size), and ends the call
with OK or any status code. That is what lets the conformance kit put a
worker in situations a well-behaved coordinator never creates, such as a
protocol version mismatch.

The worker's messages are parsed as they were sent
(:func:`~rlfleet.conformance.kit_messages.parse_worker_message`; batch
chunks stay out of protobuf) and read with the functions of
:mod:`rlfleet.conformance.kit_messages`. Bytes that do not parse are
delivered as an :class:`Inbound` of kind ``"malformed"`` rather than failing
the call, so the check can say what was wrong.
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from google.protobuf.message import Message

from rlfleet.conformance.kit_messages import EMPTY, parse_worker_message
from rlfleet.errors import UsageError, WireFormatError
from rlfleet.transport import rpc as _rpc
from rlfleet.wire import Chunk

#: Kinds of :class:`Inbound` that are not a WorkerMessage body (and :data:`EMPTY`:
#: a WorkerMessage with no body set).
MALFORMED = "malformed"  # bytes that do not parse as a WorkerMessage
CLOSED = "closed"  # the worker closed its side of the stream
BROKEN = "broken"  # the call broke (worker killed, connection reset, ...)

#: How long the reader thread gets to notice that a call ended.
_READER_GRACE_SECONDS = 1.0

#: How long a refused Join waits for the worker's first message.
_REFUSAL_WAIT_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class Inbound:
    """One event of a worker's stream, in arrival order.

    Attributes:
        kind: The WorkerMessage body's field name (``"hello"``, ``"result"``,
            ...), or :data:`MALFORMED`, :data:`CLOSED`, :data:`BROKEN`,
            :data:`EMPTY`.
        seq: Position in the stream (0, 1, ...), heartbeats included.
        at: Arrival time (``time.monotonic()``).
        size: Serialized size of the message in bytes (0 for end events).
        message: The WorkerMessage as sent (its chunk field cleared), if any:
            read it with :mod:`rlfleet.conformance.kit_messages`.
        chunk: The batch chunk an EpisodeResult carried, if any.
        error: What was wrong (malformed bytes, how the call broke).
    """

    kind: str
    seq: int
    at: float
    size: int = 0
    message: Message | None = None
    chunk: Chunk | None = None
    error: str = ""


@dataclasses.dataclass(frozen=True)
class _Parsed:
    kind: str
    message: Message | None
    chunk: Chunk | None
    size: int
    error: str = ""


@dataclasses.dataclass(frozen=True)
class _Finish:
    code: grpc.StatusCode
    details: str = ""


def _deserialize(data: bytes) -> _Parsed:
    try:
        kind, message, chunk = parse_worker_message(data)
    except WireFormatError as exc:
        return _Parsed(MALFORMED, None, None, len(data), str(exc))
    return _Parsed(kind, message, chunk, len(data))


def _serialize(message: Any) -> bytes:
    if isinstance(message, bytes):
        return message  # serialized already (the kit's commands)
    return bytes(message.SerializeToString())


class ScriptedSession:
    """One Join call, scripted by a check.

    Messages from the worker are read by a thread of their own as they
    arrive. Heartbeats go to :attr:`heartbeats` (a check rarely wants them
    in the way); everything else is returned by :meth:`receive` in order.

    Attributes:
        index: The Join call's number on this coordinator (0, 1, ...).
        peer: The worker's address as gRPC reports it.
        heartbeats: Every Heartbeat received so far, in order.
    """

    def __init__(self, index: int, peer: str) -> None:
        self.index = index
        self.peer = peer
        self.heartbeats: list[Inbound] = []
        self._inbox: queue.Queue[Inbound] = queue.Queue()
        self._outbox: queue.Queue[Message | bytes | _Finish] = queue.Queue()
        self._seq = itertools.count()
        self._ended = threading.Event()  # the worker's side is over
        self._end_lock = threading.Lock()  # the reader and a timer may both end it
        self._finished = threading.Event()  # this side ended the call

    @property
    def ended(self) -> bool:
        """Whether the worker closed its side of the stream or the call broke."""
        return self._ended.is_set()

    def send(self, message: Message | bytes) -> None:
        """Queues a CoordinatorMessage, or one serialized already, for the worker (in order).

        Raises:
            UsageError: If this side already ended the call.
        """
        if self._finished.is_set():
            raise UsageError(f"Join call {self.index} was already ended by the coordinator")
        self._outbox.put(message)

    def receive(self, timeout: float) -> Inbound | None:
        """The worker's next message that is not a heartbeat, or None on timeout.

        After the worker's side ended, returns its :data:`CLOSED` or
        :data:`BROKEN` event again on every call.
        """
        try:
            item = self._inbox.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if item.kind in (CLOSED, BROKEN):
            self._inbox.put(item)  # stays the answer: nothing comes after it
        return item

    def finish(self) -> None:
        """Ends the call with status OK (messages queued before are sent first)."""
        self.abort(grpc.StatusCode.OK)

    def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        """Ends the call with ``code`` after the messages queued before."""
        if not self._finished.is_set():
            self._finished.set()
            self._outbox.put(_Finish(code, details))

    def abort_quietly(self) -> None:
        """Ends the call with UNAVAILABLE, as a coordinator going away would."""
        self.abort(grpc.StatusCode.UNAVAILABLE, "conformance kit: the check is over")

    # --- used by the server's threads -------------------------------------------

    def _outgoing(self, context: grpc.ServicerContext) -> Iterator[Message | bytes]:
        while True:
            item = self._outbox.get()
            if isinstance(item, _Finish):
                if item.code is not grpc.StatusCode.OK:
                    context.abort(item.code, item.details)
                return
            yield item

    def _read(self, requests: Iterator[_Parsed]) -> None:
        try:
            for parsed in requests:
                self._deliver(parsed)
        except Exception as exc:  # gRPC raises assorted errors when a call dies mid-read
            detail = f": {exc}" if str(exc) else ""
            self._end(BROKEN, f"the call broke ({type(exc).__name__}{detail})")
        else:
            self._end(CLOSED, "")

    def _deliver(self, parsed: _Parsed) -> None:
        if self._ended.is_set():
            return
        now = time.monotonic()
        seq = next(self._seq)
        item = Inbound(
            parsed.kind, seq, now, parsed.size, parsed.message, parsed.chunk, parsed.error
        )
        if item.kind == "heartbeat":
            self.heartbeats.append(item)
        else:
            self._inbox.put(item)

    def _end(self, kind: str, error: str) -> None:
        with self._end_lock:
            if not self._ended.is_set():
                self._inbox.put(Inbound(kind, next(self._seq), time.monotonic(), error=error))
                self._ended.set()

    def _on_call_done(self) -> None:
        # The call is over (either side, or the connection): stop the
        # response generator, which may be blocked on an empty outbox.
        self._finished.set()
        self._outbox.put(_Finish(grpc.StatusCode.OK))
        # The reader notices on its own; this only guards against a reader
        # that gRPC leaves blocked.
        timer = threading.Timer(_READER_GRACE_SECONDS, self._end, (BROKEN, "the call ended"))
        timer.daemon = True
        timer.start()


class ScriptedCoordinator:
    """A gRPC server on 127.0.0.1 speaking the worker face, driven by checks.

    Use as a context manager; :attr:`address` is ``HOST:PORT``.

    Args:
        host: Interface to listen on.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._host = host
        self._sessions: queue.Queue[ScriptedSession] = queue.Queue()
        self._count = itertools.count()
        self._lock = threading.Lock()
        self._refusal: _Finish | None = None
        self.join_times: list[float] = []
        self._server: grpc.Server | None = None
        self.address = ""

    def start(self) -> str:
        """Starts serving on an ephemeral port; returns ``HOST:PORT``."""
        handler = grpc.method_handlers_generic_handler(
            _rpc.WORKER_SERVICE,
            {
                "Join": grpc.stream_stream_rpc_method_handler(
                    self._join, request_deserializer=_deserialize, response_serializer=_serialize
                )
            },
        )
        # One pool thread per live Join call: a worker that reconnects in a
        # hot loop must not starve the calls a check is scripting.
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="conformance-join"),
            options=_rpc.server_options(keepalive_seconds=30.0),
        )
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port(f"{self._host}:0")
        server.start()
        self._server = server
        self.address = f"{self._host}:{port}"
        return self.address

    def stop(self) -> None:
        """Stops the server, ending every call."""
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None

    def __enter__(self) -> ScriptedCoordinator:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def accept(self, timeout: float) -> ScriptedSession | None:
        """The next Join call not yet taken, or None if none comes within ``timeout``."""
        try:
            return self._sessions.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def discard_pending(self) -> int:
        """Ends Join calls nobody took (left by an earlier worker); returns how many."""
        count = 0
        while True:
            try:
                session = self._sessions.get_nowait()
            except queue.Empty:
                return count
            session.abort(grpc.StatusCode.UNAVAILABLE, "conformance kit: stale connection")
            count += 1

    def refuse(self, code: grpc.StatusCode | None, details: str = "") -> None:
        """Makes every new Join end with ``code`` after the worker's first message.

        Refused calls are counted in :attr:`join_times` but never returned
        by :meth:`accept`. ``refuse(None)`` accepts calls again.
        """
        with self._lock:
            self._refusal = None if code is None else _Finish(code, details)

    def _join(
        self, requests: Iterator[_Parsed], context: grpc.ServicerContext
    ) -> Iterator[Message | bytes]:
        with self._lock:
            refusal = self._refusal
            self.join_times.append(time.monotonic())
        session = ScriptedSession(next(self._count), context.peer())
        context.add_callback(session._on_call_done)
        threading.Thread(
            target=session._read, args=(requests,), name=f"join-{session.index}", daemon=True
        ).start()
        if refusal is not None:
            # A real coordinator reads Hello before refusing: it is what names
            # the worker's protocol version.
            session.receive(_REFUSAL_WAIT_SECONDS)
            session.abort(refusal.code, refusal.details)
        else:
            self._sessions.put(session)
        yield from session._outgoing(context)


__all__ = [
    "BROKEN",
    "CLOSED",
    "EMPTY",
    "MALFORMED",
    "Inbound",
    "ScriptedCoordinator",
    "ScriptedSession",
]
