"""The worker face: the Join stream, from gRPC to the Coordinator and back.

Each Join call has two threads. The handler (a server pool thread) does the
handshake and then yields the worker's outbox, so messages to a worker are
sent in the order they were queued. A reader thread consumes the worker's
messages and feeds them to the :class:`Coordinator`; anything wrong with
them ends this worker's call only (INVALID_ARGUMENT), never the coordinator.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

import grpc
from google.protobuf.message import DecodeError

from rlfleet._util.log_limit import LogLimiter, held_back_note
from rlfleet.coordinator.coordinator import Coordinator
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.leases.translation import RelayReply, relay_deserializer, relay_reply
from rlfleet.coordinator.registry import Ending, WorkerCommand, WorkerHandle
from rlfleet.coordinator.worker_messages import (
    LeaseReplyBody,
    ResultPiece,
    WorkerEvent,
    body_name,
    parse_worker_message,
    serialize_command,
)
from rlfleet.errors import ProtocolError, ResourceExhaustedError, WireFormatError
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.join import (
    AgentApplied,
    EnvBuilt,
    ResultsSwitch,
    WorkerBeat,
    WorkerHello,
    WorkerLeaving,
)
from rlfleet.security import InflightBudget
from rlfleet.transport import rpc as _rpc

logger = logging.getLogger("rlfleet.coordinator")
T = TypeVar("T")


@dataclass(frozen=True)
class Malformed:
    """A request message that could not be parsed (kept, to end the call cleanly)."""

    error: str


def tolerant(deserialize: Callable[[bytes], T]) -> Callable[[bytes], T | Malformed]:
    """Wraps a deserializer so that garbage becomes a :class:`Malformed` value.

    gRPC would end the call with INTERNAL on a raising deserializer; the
    protocol says a malformed message is the sender's fault (INVALID_ARGUMENT).
    """

    def wrapped(data: bytes) -> T | Malformed:
        try:
            return deserialize(data)
        except (WireFormatError, DecodeError, ValueError) as exc:
            return Malformed(f"{type(exc).__name__}: {exc}")

    return wrapped


class _NoHello:
    """Handed from the reader to the handler: the stream ended before any message."""


#: What the Join call's deserializer yields for each message of a worker.
_Incoming: TypeAlias = WorkerEvent | RelayReply | Malformed


class _Admission:
    """Hands the admitted worker (or a refusal) from the handler to the reader."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._handle: WorkerHandle | None = None

    def decide(self, handle: WorkerHandle | None) -> None:
        self._handle = handle
        self._event.set()

    def wait(self) -> WorkerHandle | None:
        self._event.wait()
        return self._handle


class WorkerFace:
    """Serves ``rlfleet.v1.WorkerService/Join``.

    Args:
        coordinator: The fleet state the streams feed.
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._refusals = LogLimiter()

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a server."""
        join = grpc.stream_stream_rpc_method_handler(
            self.join,
            request_deserializer=tolerant(relay_deserializer(parse_worker_message)),
            response_serializer=serialize_command,
        )
        return grpc.method_handlers_generic_handler(_rpc.WORKER_SERVICE, {"Join": join})

    def join(
        self,
        requests: Iterator[_Incoming],
        context: grpc.ServicerContext,
    ) -> Iterator[WorkerCommand]:
        """The Join handler: handshake, then the worker's outbox until its end."""
        first: queue.SimpleQueue[_Incoming | _NoHello] = queue.SimpleQueue()
        admission = _Admission()
        threading.Thread(
            target=self._read,
            args=(requests, first, admission),
            name=f"rlfleet-join-{context.peer()}",
            daemon=True,
        ).start()
        try:
            handle = self._handshake(first, context)
        except CallError as exc:
            admission.decide(None)
            self._coordinator.metrics.error(f"join_{exc.code.name}")
            # Anyone who can reach the port can open streams that never say
            # Hello: at most one line per interval.
            held_back = self._refusals.admit()
            if held_back is not None:
                logger.warning(
                    "refused a worker from %s: %s%s",
                    context.peer(),
                    exc.message,
                    held_back_note(held_back, "refusals"),
                )
            _rpc.abort(context, exc.code, exc.message, exc.detail)
        admission.decide(handle)

        def broken() -> None:
            self._coordinator.workers.drop(handle, grpc.StatusCode.CANCELLED, "its stream broke")

        if not context.add_callback(broken):
            broken()
        while True:
            item = handle.outbox.get()
            if isinstance(item, Ending):
                if item.code is grpc.StatusCode.OK:
                    return
                _rpc.abort(context, item.code, item.message, item.detail)
            yield item

    def _handshake(
        self,
        first: queue.SimpleQueue[_Incoming | _NoHello],
        context: grpc.ServicerContext,
    ) -> WorkerHandle:
        timeout = self._coordinator.config.handshake_timeout_seconds
        try:
            item = first.get(timeout=timeout)
        except queue.Empty:
            raise CallError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no Hello within {timeout:g} seconds of opening the Join stream; a "
                "worker's first message must be Hello",
            ) from None
        if isinstance(item, _NoHello):
            raise CallError(grpc.StatusCode.CANCELLED, "the stream ended before its Hello")
        if isinstance(item, Malformed):
            raise CallError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed Hello: {item.error}")
        if not isinstance(item, WorkerHello):
            raise CallError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first message of a Join stream must be Hello, got {body_name(item)}",
            )
        return self._coordinator.workers.admit(item, context.peer())

    def _read(
        self,
        requests: Iterator[_Incoming],
        first: queue.SimpleQueue[_Incoming | _NoHello],
        admission: _Admission,
    ) -> None:
        """The reader thread: the worker's messages, in order, until its stream ends."""
        try:
            first.put(next(requests))
        except Exception:  # StopIteration or the call's end: no Hello will come
            first.put(_NoHello())
            return
        handle = admission.wait()
        if handle is None:
            return
        events = self._coordinator.workers
        budget = handle.inflight.carrier()  # shared with its data connection's results
        try:
            for item in requests:
                handle.touch()
                self._dispatch(handle, item, budget)
        except CallError as exc:
            events.drop(handle, exc.code, exc.message, exc.detail)
        except ResourceExhaustedError as exc:
            events.drop(handle, grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except (ProtocolError, WireFormatError) as exc:
            events.drop(handle, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except grpc.RpcError:
            events.drop(handle, grpc.StatusCode.CANCELLED, "its stream broke")
        except Exception as exc:  # a bug here must not leave a zombie worker
            logger.exception("internal error on the stream of worker %r", handle.name)
            events.drop(handle, grpc.StatusCode.INTERNAL, f"coordinator bug: {exc!r}")
        else:
            # Nothing more comes on the stream: results held on the data
            # connection after it are booked now.
            handle.join_results_over.set()
            # gRPC often ends the request iterator cleanly, not with an error,
            # when the peer's connection drops (a killed process): only a
            # worker that said Leaving or was drained closes on purpose.
            if handle.leaving or self._coordinator.draining:
                # Its last results may still be on its lease data connection.
                events.await_data_results(handle)
                events.drop(handle, grpc.StatusCode.OK, "the worker closed its stream")
            else:
                events.drop(
                    handle,
                    grpc.StatusCode.CANCELLED,
                    "its stream broke (it ended without Leaving: the worker died or lost "
                    "its connection)",
                )

    def _dispatch(self, handle: WorkerHandle, item: _Incoming, budget: InflightBudget) -> None:
        if isinstance(item, Malformed):
            raise ProtocolError(f"malformed message from worker {handle.name!r}: {item.error}")
        if isinstance(item, RelayReply):  # the lease relay's fast path: its bytes are kept
            self._coordinator.leases.on_reply(handle, item)
            return
        events = self._coordinator.workers
        if isinstance(item, ResultPiece):
            if handle.join_results_over.is_set():
                raise ProtocolError(
                    f"worker {handle.name!r} sent a result on its Join stream after its results "
                    "switch marker: every later result must come on its lease data connection "
                    "(leases.proto, 'Results on the lease data channel')"
                )
            events.on_chunk(handle, handle.assembler, budget, item.header, item.chunk)
        elif isinstance(item, ResultsSwitch):
            events.on_results_switch(handle)
        elif isinstance(item, WorkerBeat):
            events.on_heartbeat(handle, item)
        elif isinstance(item, EnvBuilt):
            events.on_env_ready(handle, item)
        elif isinstance(item, AgentApplied):
            events.on_agent_ready(handle, item)
        elif isinstance(item, ErrorReport):
            events.on_error(handle, item)
        elif isinstance(item, LeaseReplyBody):  # not alone in its message (other fields first)
            self._coordinator.leases.on_reply(handle, relay_reply(item.body))
        elif isinstance(item, WorkerLeaving):
            events.on_leaving(handle, item)
        elif isinstance(item, WorkerHello):
            raise ProtocolError(f"worker {handle.name!r} sent a second Hello")
        else:
            raise ProtocolError(f"worker {handle.name!r} sent an empty WorkerMessage")
