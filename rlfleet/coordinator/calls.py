"""Learner calls as the coordinator sees them: their events, scope and turn.

Worker threads produce a learner call's results; the call's own thread
sends them. A :class:`CallOutbox` connects the two, a :class:`CallScope`
carries the call's cancellation into the coordinator's waits, and a
:class:`FifoGate` serves Sample and update requests one at a time, in
arrival order (a plain lock is not fair: a request could wait forever).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import grpc

from rlfleet.coordinator.failures import CallError
from rlfleet.errors import InternalError
from rlfleet.protocol.learner_calls import CallHeader
from rlfleet.protocol.modes import Footer
from rlfleet.wire import Chunk
from rlfleet.wire.results import ResultHeader

if TYPE_CHECKING:  # result_channels imports this module
    from rlfleet.coordinator.leases.data_connections import Tried
    from rlfleet.coordinator.result_channels import ResultSender


@dataclass(frozen=True)
class Forward:
    """A worker's result to pass on: its metadata and its original chunks.

    Attributes:
        header: The metadata (chunk 0's, as the worker sent it: ``header.wire``).
        worker_id: The sender, for the learner to join its chunks by.
        chunks: The chunks, as the worker sent them.
        steps: Steps in the result.
    """

    header: ResultHeader
    worker_id: int
    chunks: tuple[Chunk, ...]
    steps: int


@dataclass(frozen=True)
class Finished:
    """The request is complete: send the footer and end the call."""

    footer: Footer


#: A result booked for its booking thread to send on the learner's results
#: connection, once the coordinator's lock is let go: its call's outbox, the
#: sender reserved for it (:meth:`CallOutbox.reserve`), the result.
ReservedSend: TypeAlias = "tuple[CallOutbox, ResultSender, Forward]"

#: What a learner call sends, in order: a header first (and, in
#: subscriptions, one more on each env change), results, then the end.
Event: TypeAlias = Forward | CallHeader | Finished | CallError


class CallOutbox:
    """The events of one Sample or Subscribe call, in order.

    After a Finished or a failure, further events are dropped: the call is
    over and nothing may follow its end.
    """

    def __init__(
        self, request_id: int, *, subscription: bool, sender: ResultSender | None = None
    ) -> None:
        self.request_id = request_id
        self.subscription = subscription
        #: The learner's results connection for this call, if it named one:
        #: a worker's result lane sends there itself (:meth:`reserve`).
        self.sender = sender
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()

    def put(self, event: Event) -> None:
        """Queues an event (ignored once the call has ended)."""
        with self._lock:
            if self._closed:
                return
            if isinstance(event, Finished | CallError):
                self._closed = True
            self._queue.put(event)

    def reserve(self) -> ResultSender | None:
        """The sender by which the booking thread may send a result itself, once it
        lets go of the coordinator's lock (one thread hop fewer than the
        call's thread sending it); None: :meth:`put` it. The call's end marker
        waits for what was reserved (``ResultSender.end``)."""
        sender = self.sender
        if sender is None or self._closed or not sender.reserve():
            return None
        return sender

    def send_reserved(self, sender: ResultSender, forwards: Sequence[Forward]) -> None:
        """Sends results :meth:`reserve` gave ``sender`` for, in order and
        together; a failure to send ends the call with it."""
        try:
            sender.send_reserved(forwards)
        except CallError as exc:
            self.put(exc)

    def try_send_reserved(self, sender: ResultSender, forwards: Sequence[Forward]) -> Tried:
        """:meth:`send_reserved` without waiting for the learner
        (``ResultSender.try_send_reserved``: ``"refused"`` leaves the results
        reserved, ``"begun"`` leaves their rest to :meth:`finish_reserved`);
        a failure to send ends the call with it (``"sent"``)."""
        try:
            return sender.try_send_reserved(forwards)
        except CallError as exc:
            self.put(exc)
            return "sent"

    def finish_reserved(self, sender: ResultSender, count: int) -> None:
        """Sends the rest of ``count`` results :meth:`try_send_reserved` began
        (may wait for the learner); a failure to send ends the call with it."""
        try:
            sender.finish_reserved(count)
        except CallError as exc:
            self.put(exc)

    def get(self) -> Event:
        """The next event; blocks (cancellation arrives as a CallError event)."""
        return self._queue.get()

    @property
    def closed(self) -> bool:
        """True once a Finished or a failure was queued."""
        return self._closed


class CallScope:
    """A learner call's cancellation, visible to the coordinator's waits.

    The face registers :meth:`cancel` as the gRPC call's done-callback, so a
    learner that hangs up or runs past its deadline frees what it held.
    """

    def __init__(self) -> None:
        self.cancelled = False
        self.outbox: CallOutbox | None = None
        #: The handler has returned (a stream: ended): nothing of the call
        #: waits any more, so the call's end has nothing to wake.
        self.served = False

    def cancel(self) -> None:
        """Marks the call as gone and wakes its outbox."""
        self.cancelled = True
        if self.outbox is not None:
            self.outbox.put(CallError(grpc.StatusCode.CANCELLED, "the learner ended the call"))

    def check(self) -> None:
        """Raises CallError(CANCELLED) if the call is gone."""
        if self.cancelled:
            raise CallError(grpc.StatusCode.CANCELLED, "the learner ended the call")


class FifoGate:
    """Admits one holder at a time, in arrival order.

    Uses the coordinator's condition (so its waits also wake on every fleet
    change, and cancellation is seen at once). Call every method with the
    condition's lock held.

    Args:
        changed: The coordinator's condition variable.
        max_waiting: Holders waiting beyond which :meth:`enter` refuses.
    """

    def __init__(self, changed: threading.Condition, max_waiting: int) -> None:
        self._changed = changed
        self._max_waiting = max_waiting
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    @property
    def waiting(self) -> int:
        """Holders queued or being served."""
        return self._next_ticket - self._serving - len(self._abandoned)

    def enter(self, scope: CallScope, what: str) -> int:
        """Waits for this caller's turn; returns its ticket for :meth:`leave`.

        Raises:
            CallError: RESOURCE_EXHAUSTED when too many callers wait,
                CANCELLED if the call ends while waiting.
        """
        if self.waiting >= self._max_waiting:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.waiting} requests are already queued (the limit); {what} was refused. "
                "Wait for earlier requests to finish, or raise --max-queued-requests",
            )
        ticket = self._next_ticket
        self._next_ticket += 1
        while self._serving != ticket:
            if scope.cancelled:
                self._abandoned.add(ticket)
                scope.check()
            self._changed.wait()
        return ticket

    def leave(self, ticket: int) -> None:
        """Ends the holder's turn and admits the next live ticket."""
        if ticket != self._serving:
            raise InternalError(f"ticket {ticket} left, but ticket {self._serving} holds the gate")
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.discard(self._serving)
            self._serving += 1
        self._changed.notify_all()


def by_call(
    sends: Sequence[ReservedSend],
) -> list[tuple[CallOutbox, ResultSender, list[Forward]]]:
    """``sends`` gathered by sender, each sender's in booking order (calls
    in the order of their first result)."""
    gathered: dict[int, tuple[CallOutbox, ResultSender, list[Forward]]] = {}
    for outbox, sender, forward in sends:
        entry = gathered.get(id(sender))
        if entry is None:
            gathered[id(sender)] = (outbox, sender, [forward])
        else:
            entry[2].append(forward)
    return list(gathered.values())
