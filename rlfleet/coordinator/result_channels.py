"""Learners' results connections: Sample answers' results off the gRPC stream.

A learner asks for a results connection (``OpenResultChannel``), dials the
lease data channel's port with the ticket (or, in this process, attaches in
memory), and names the connection in its Sample requests. For a call that
names a connection this coordinator knows and no other call is using, the
learner face sends each result message as a frame on it (a
:class:`ResultSender`): the bytes the stream would carry, plus the call's
number, then an end marker before the stream's footer or error
(learner.proto, "Results on a learner's data connection"); a call whose
learner reads the footer there too gets it in place of the marker
(``SampleRequest.footer_on_data``), one stream message fewer. gRPC costs the
coordinator 110-150 us of CPU per result message; a frame is a ``sendmsg``.
A result booked by a worker's result lane is sent by that lane
(:meth:`ResultSender.reserve`, then :meth:`ResultSender.send_reserved`),
the others by the call's thread; the end marker waits until every
reserved result was sent, so it follows them all.

A learner whose coordinator offers it (``ResultChannelOpened.requests_on_data``)
sends its Sample requests on the connection itself and gets the whole
answer there (result_requests.py); without that, any frame from the learner
closes the connection. A connection that ends mid-answer fails the call
with UNAVAILABLE, so the learner never assembles a partial answer.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Iterable, Sequence

from rlfleet.coordinator.calls import Forward
from rlfleet.coordinator.failures import CallError, exhausted, unavailable
from rlfleet.coordinator.learner_messages import (
    failure_bytes,
    footer_bytes,
    forwarded_parts,
    result_call_field,
    results_end,
)
from rlfleet.coordinator.leases.data_connections import LeaseConnection, LeaseDataPeer, Tried
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.coordinator.result_requests import ConnectionRequests, RequestRunner
from rlfleet.errors import ConnectionClosedError, RlfleetTimeoutError, WireFormatError
from rlfleet.protocol.modes import Footer

logger = logging.getLogger("rlfleet.coordinator")

#: How long a result frame waits for a learner that does not read its
#: connection (what waits to be sent is bounded) before the call fails.
RESULT_SEND_SECONDS = 60.0
#: Results connections whose ticket was not presented yet, at most (the
#: oldest ticket is revoked past it).
_UNCLAIMED_TICKETS = 256
#: How long a call naming a connection whose ticket was not attached yet
#: waits for it: the learner gets LeaseDataAccepted a moment before the
#: connection is booked here (data_server.py sends it first).
_ATTACH_WAIT_SECONDS = 10.0


class ResultChannels:
    """The coordinator's learners' results connections, by id.

    Args:
        server: The lease data channel, or None when it is off (results
            then stay on the stream).
        requests: Serves the Sample requests learners send on their
            connections (result_requests.py); None: a learner sends nothing
            there (any frame closes the connection).
        max_open: Connections attached at once (each may hold a thread for
            its requests) past which :meth:`open` refuses; None: no limit.
    """

    def __init__(
        self,
        server: LeaseDataServer | None,
        requests: RequestRunner | None = None,
        max_open: int | None = None,
    ) -> None:
        self._server = server
        self._requests = requests
        self._max_open = max_open
        self._lock = threading.Lock()
        self._open: dict[int, LeaseConnection] = {}
        self._busy: set[int] = set()
        self._unclaimed: dict[int, bytes] = {}
        self._attached = threading.Condition(self._lock)

    def open(self) -> tuple[int, int, bytes] | None:
        """A new results connection's ``(id, port, ticket)``; None without a data channel.

        Raises:
            CallError: RESOURCE_EXHAUSTED while ``max_open`` connections are attached.
        """
        server = self._server
        if server is None:
            return None
        with self._lock:
            if self._max_open is not None and len(self._open) >= self._max_open:
                raise exhausted(
                    f"{len(self._open)} results connections are open on this coordinator, its "
                    "limit (--max-learner-calls: each holds a thread for its requests); make "
                    "Sample calls, their results on the stream, until one closes",
                )
        # Random, not counted: a learner cannot name another's connection.
        channel = secrets.randbits(63) | 1
        ticket = server.issue(lambda connection: self._attach(channel, connection))
        with self._lock:
            self._unclaimed[channel] = ticket
            if len(self._unclaimed) > _UNCLAIMED_TICKETS:
                oldest = next(iter(self._unclaimed))
                server.revoke(self._unclaimed.pop(oldest))
                self._attached.notify_all()
        return channel, server.port, ticket

    def take(
        self, channel: int, call: int, *, footer_on_data: bool = False, header_first: bool = False
    ) -> ResultSender | None:
        """The sender of a call's results on connection ``channel``; None (results
        on the stream) for a connection this coordinator does not know, one
        that is closed or busy with another call, or a call number of 0. A
        connection whose ticket was issued but not attached yet is waited
        for, at most ``_ATTACH_WAIT_SECONDS``. ``footer_on_data``: the learner
        reads the footer there too (:attr:`ResultSender.footer_on_data`);
        ``header_first``: the header goes there too, before any result
        (:meth:`ResultSender.send_header`)."""
        if call <= 0:
            return None
        with self._lock:
            self._attached.wait_for(lambda: channel not in self._unclaimed, _ATTACH_WAIT_SECONDS)
            connection = self._open.get(channel)
            if connection is None or connection.closed or channel in self._busy:
                return None
            self._busy.add(channel)
        return ResultSender(
            self,
            channel,
            connection,
            call,
            footer_on_data=footer_on_data,
            header_first=header_first,
        )

    def give_back(self, sender: ResultSender) -> None:
        """The call is over: its connection may serve the learner's next call."""
        with self._lock:
            self._busy.discard(sender.channel)

    def _attach(self, channel: int, connection: LeaseConnection) -> LeaseDataPeer:
        with self._lock:
            self._unclaimed.pop(channel, None)
            self._open[channel] = connection
            self._attached.notify_all()
        if self._requests is not None:
            return ConnectionRequests(self, channel, connection, self._requests)
        return _ResultsPeer(self, channel)

    def closed(self, channel: int, reason: str) -> None:
        """Connection ``channel`` ended (its peer's ``on_closed``)."""
        with self._lock:
            self._open.pop(channel, None)
        logger.debug("results connection %d closed: %s", channel, reason)


def _failed_mid_answer(exc: Exception) -> CallError:
    """The call's failure when its results connection failed under a send."""
    return unavailable(
        f"the learner's results connection failed mid-answer ({exc}); the answer is dropped "
        "whole: retry the request",
    )


class _ResultsPeer:
    """A results connection's inbound side when no requests are served there: the
    learner sends nothing on it."""

    def __init__(self, channels: ResultChannels, channel: int) -> None:
        self._channels = channels
        self._channel = channel

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        raise WireFormatError(
            "a learner sends nothing on its results connection after its LeaseDataHello "
            "(learner.proto, 'Results on a learner's data connection')"
        )

    def on_closed(self, reason: str) -> None:
        self._channels.closed(self._channel, reason)


class ResultSender:
    """Sends one Sample call's result messages on the learner's results connection.

    Args:
        channels: Where the connection is booked (given back when the call ends).
        channel: The connection's id.
        connection: The connection.
        call: The call's number on it (SampleRequest.result_call).
        footer_on_data: The learner reads the footer on the connection, in
            place of the end marker (SampleRequest.footer_on_data).
        header_first: The call's header goes on the connection too, as its
            first frame (:meth:`send_header`): no result lane sends before it.
    """

    def __init__(
        self,
        channels: ResultChannels,
        channel: int,
        connection: LeaseConnection,
        call: int,
        *,
        footer_on_data: bool = False,
        header_first: bool = False,
    ) -> None:
        self.channel = channel
        self.footer_on_data = footer_on_data
        self.sent = 0  # result frames sent
        self._channels = channels
        self._connection = connection
        self._call = call
        #: Every result message's last piece: the call's number (SampleResponse.result_call).
        self.tail = result_call_field(call)
        self._ended = False
        self._failed = False
        # One result's frames go out together, whichever thread sends them.
        self._sending = threading.Lock()
        # Results booked to be sent by the thread that booked them (a worker's
        # result lane), not sent yet: the end marker waits for them.
        self._state = threading.Condition()
        self._in_flight = 0
        # Until the header went, results go through the call's thread (after it).
        self._header_due = header_first
        #: Called once the call gave its connection back, before its last
        #: frame goes (a request sent on the connection: the next may come).
        self.released: Callable[[], None] | None = None

    def send(self, messages: Iterable[list[bytes | memoryview]]) -> None:
        """Sends result messages (each the pieces of one SampleResponse ending
        with :attr:`tail`), in order.

        Raises:
            CallError: UNAVAILABLE if the connection is closed or the learner
                does not read it (the call fails; the learner retries).
        """
        # Together: several messages (a lane's batch, a result's chunks) go
        # in one write, not a system call and a wake-up of the learner each.
        frames = list(messages)
        with self._sending:
            if self._failed:
                return  # the call fails already: nothing more goes out
            try:
                self._connection.send_frames(frames, RESULT_SEND_SECONDS)
                self.sent += len(frames)
            except (ConnectionClosedError, RlfleetTimeoutError) as exc:
                self._failed = True
                raise _failed_mid_answer(exc) from None

    def reserve(self) -> bool:
        """Books one result to be sent by the caller's thread (:meth:`send_reserved`,
        after it lets go of the coordinator's lock): the end marker then waits
        for it. False once the call ended (the result is not sent), and before
        a header due on the connection went (the call's thread sends it after)."""
        with self._state:
            if self._ended or self._failed or self._header_due:
                return False
            self._in_flight += 1
            return True

    def send_reserved(self, forwards: Sequence[Forward]) -> None:
        """Sends results booked with :meth:`reserve`, one reservation each, in
        order and together (a slow learner slows the caller, as it slows the
        call's thread when that sends).

        Raises:
            CallError: UNAVAILABLE as :meth:`send` (for the call to end with).
        """
        tail = self.tail
        try:
            self.send([parts for forward in forwards for parts in forwarded_parts(forward, tail)])
        finally:
            self._settle(len(forwards))

    def try_send_reserved(self, forwards: Sequence[Forward]) -> Tried:
        """:meth:`send_reserved` on a thread that must not wait (the data loop),
        as one ``LeaseConnection.try_send_frames``: ``"sent"``; ``"begun"``,
        the rest of their frames waiting, ahead of any later frame, for
        :meth:`finish_reserved` on a thread that may wait; ``"refused"``,
        nothing sent and their reservations kept, while another thread sends
        on this call or frames wait to be sent on the connection (a thread
        that may wait sends them later, :meth:`send_reserved`).

        Raises:
            CallError: UNAVAILABLE as :meth:`send`.
        """
        if not self._sending.acquire(blocking=False):
            return "refused"  # another thread sends on this call: maybe waiting for the learner
        failure = None
        tried: Tried = "sent"
        try:
            if not self._failed:  # else the call fails already: nothing more goes out
                tail = self.tail
                frames = [parts for forward in forwards for parts in forwarded_parts(forward, tail)]
                try:
                    tried = self._connection.try_send_frames(frames)
                    if tried == "refused":
                        return tried
                    self.sent += len(frames)
                except ConnectionClosedError as exc:
                    self._failed = True
                    failure = _failed_mid_answer(exc)
        finally:
            self._sending.release()
        if tried != "begun":
            self._settle(len(forwards))
        if failure is not None:
            raise failure
        return tried

    def finish_reserved(self, count: int) -> None:
        """Sends the rest of ``count`` results :meth:`try_send_reserved` began,
        waiting as :meth:`send` does; then the end marker may follow them.

        Raises:
            CallError: UNAVAILABLE as :meth:`send`.
        """
        try:
            self._connection.finish(RESULT_SEND_SECONDS)
        except (ConnectionClosedError, RlfleetTimeoutError) as exc:
            self._failed = True
            raise _failed_mid_answer(exc) from None
        finally:
            self._settle(count)

    def _settle(self, count: int) -> None:
        """``count`` reserved results were sent or dropped: the end marker may go."""
        with self._state:
            self._in_flight -= count
            self._state.notify_all()

    def send_header(self, header: bytes) -> None:
        """Sends a request's header (a serialized ``SampleResponse`` with its header,
        without :attr:`tail`) as its answer's first frame: a request sent on the
        connection (result_requests.py). Not counted among the results.

        Raises:
            CallError: UNAVAILABLE as :meth:`send`.
        """
        sent = self.sent
        self.send([[header, self.tail]])
        self.sent = sent
        with self._state:
            self._header_due = False  # the lanes may send results themselves now

    def end(self, footer: Footer | None = None, *, failure: CallError | None = None) -> None:
        """Sends the call's end marker (once; a closed connection needs none), after
        every result booked before it was sent, and gives the connection back
        (before that last frame: the learner's next call may follow it at once).

        Args:
            footer: The answer's footer, sent in place of the marker (with
                :attr:`footer_on_data`; its ``data_results`` is the count
                sent). None: the marker.
            failure: The call's failure, sent in place of the marker (a
                request sent on the connection: ``SampleResponse.failure``).

        Raises:
            CallError: UNAVAILABLE if a footer could not be sent (the answer
                is then incomplete: the call must fail, not end well).
        """
        with self._state:
            if self._ended:
                return
            self._ended = True
            # Each waits at most RESULT_SEND_SECONDS per frame to be taken.
            settled = self._state.wait_for(lambda: self._in_flight == 0, RESULT_SEND_SECONDS)
        self._channels.give_back(self)
        if self.released is not None:
            self.released()
        if not settled:
            reason = (
                f"results booked for the learner were not sent within {RESULT_SEND_SECONDS:g} "
                "seconds; no end marker"
            )
            logger.debug("results connection %d: %s", self.channel, reason)
            self._connection.close(reason)
            if footer is not None:
                raise unavailable(f"the learner's results connection failed: {reason}")
            return
        if failure is not None:
            last = failure_bytes(failure, self._call)
        elif footer is None:
            last = results_end(self._call, self.sent)
        else:
            last = footer_bytes(footer, self.sent) + self.tail
        try:
            self._connection.send_parts([last], RESULT_SEND_SECONDS)
        except (ConnectionClosedError, RlfleetTimeoutError) as exc:
            # The learner sees the connection's end, or the stream's status.
            logger.debug("results connection %d: no end marker (%s)", self.channel, exc)
            self._connection.close(f"no end marker: {exc}")
            if footer is not None:
                raise unavailable(
                    f"the learner's results connection failed at the answer's footer ({exc}); "
                    "the answer is dropped whole: retry the request",
                ) from None
