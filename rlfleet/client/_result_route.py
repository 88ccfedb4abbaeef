"""Where a sampler's Sample answers' results travel: its results connection, or gRPC.

A :class:`~rlfleet.client.RemoteSampler` asks its coordinator for a results
connection (``OpenResultChannel``) before its first Sample call, dials the
lease data channel's port with the ticket (rlfleet.transport.lease_channel;
in ``Fleet.local`` it attaches in memory instead), and names the connection
in every Sample request. The coordinator then sends the answer's result
messages there as frames, and the call's stream keeps the header, the
footer and errors (learner.proto, "Results on a learner's data
connection"); the sampler asks for the footer there too
(``SampleRequest.footer_on_data``), which a coordinator that knows it sends
in place of the end marker, one stream message fewer per call. A
coordinator that takes requests on the connection
(``ResultChannelOpened.requests_on_data``) gets the SampleRequest itself
there, and answers wholly there, header and failure too: no Sample call at
all (:meth:`DataResults.requested`). A frame is
read straight into a buffer of its own, which the assembly reads in place,
with no gRPC message and no protobuf object per result
(docs/performance.md, "Results on the learner's own data connection").

What keeps answers whole: the learner reads the frames of its call up to
the coordinator's end marker before it reads the footer, and the marker's
count must equal the frames read and the footer's ``data_results``. A
connection that ends or stalls mid-answer fails the call with a retryable
error and is dropped, so no partial answer is ever assembled and no frame
of a failed call is read by the next one (that one opens a new connection).
Results stay on gRPC when the coordinator has no data channel or does not
know the method (an older one), or its port cannot be reached (one WARNING
says what to open).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import NotImplementedType
from typing import Any, TypeVar

from rlfleet.client._errors import RESOURCE_EXHAUSTED, failure_error
from rlfleet.client._learner_messages import (
    CallFailed,
    LearnerStubs,
    ResponsePart,
    ResultsEnd,
    parse_result_frame,
    read_coordinator_result,
)
from rlfleet.errors import (
    ConnectionClosedError,
    ProtocolError,
    RlfleetError,
    RlfleetTimeoutError,
    UnavailableError,
)
from rlfleet.protocol.learner_calls import CallHeader, ResultPart, SampleAsk
from rlfleet.protocol.modes import Footer
from rlfleet.security import ClientSecurity
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.data_address import coordinator_host, warn_unreachable
from rlfleet.transport.frame_pieces import FramePieces
from rlfleet.transport.lease_channel import (
    DATA_DIAL_SECONDS,
    DataLink,
    dial,
)
from rlfleet.wire.chunks import Chunk
from rlfleet.wire.leases import data_hello
from rlfleet.wire.result_message import read_frame_made
from rlfleet.wire.result_views import ViewedResult
from rlfleet.wire.results import ResultHeader

logger = logging.getLogger("rlfleet.client")

_Made = TypeVar("_Made")
#: A result frame read: its call, its header and its chunk.
_FrameRead = tuple[int, ResultHeader, Chunk | None]


class ResultRoute:
    """One sampler's results connection to one coordinator, opened on first use.

    Args:
        address: The coordinator's gRPC address (its host is dialled).
        stubs: The sampler's calls (OpenResultChannel).
        security: TLS settings (the data channel uses the fleet's TLS).
        receive_bytes: The largest frame accepted: the sampler's receive
            limit, which holds every result message its coordinator may
            forward whatever the sampler's own message limit
            (:class:`~rlfleet.client._coordinator_calls.CoordinatorCalls`).
        send_bytes: The largest request sent: the sampler's message limit,
            which its Sample calls' channel holds to as well.
    """

    def __init__(
        self,
        address: str,
        stubs: LearnerStubs,
        security: ClientSecurity,
        receive_bytes: int,
        *,
        send_bytes: int = _rpc.DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        self._address = address
        self._stubs = stubs
        self._security = security
        self._receive_bytes = receive_bytes
        self._send_bytes = send_bytes
        # The longest request frame the coordinator reads (0: it does not say).
        self._coordinator_bytes = 0
        #: The coordinator's in-memory attach when it runs in this process
        #: (``Fleet.local``): takes a serialized LeaseDataHello, returns the link.
        self.attach: Callable[[bytes], DataLink] | None = None
        self._link: DataLink | None = None
        self._channel = 0
        self._calls = 0
        self._grpc_only = False  # no data channel to use: every answer on gRPC
        self._requests = False  # the coordinator takes requests on the connection
        # One call at a time reads the connection (shards may run two calls on
        # one coordinator at once): another call meanwhile takes gRPC.
        self._lock = threading.Lock()
        self._busy = False

    @property
    def carrier(self) -> str:
        """``"data"`` while a results connection is open, else ``"grpc"``."""
        return "data" if self._link is not None else "grpc"

    @contextlib.contextmanager
    def routed(
        self, ask: SampleAsk, timeout: float | None
    ) -> Iterator[tuple[SampleAsk, DataResults | None]]:
        """:meth:`prepare` for one call, and :meth:`finished` when it is over."""
        ask, data = self.prepare(ask, timeout)
        try:
            yield ask, data
        finally:
            self.finished(data)

    def prepare(
        self, ask: SampleAsk, timeout: float | None
    ) -> tuple[SampleAsk, DataResults | None]:
        """``ask`` naming the results connection (opened if needed), and the reader of
        its frames; ``(ask, None)`` when results stay on gRPC (then, or once
        the call is over, :meth:`finished` must follow)."""
        with self._lock:
            if self._busy:
                return ask, None
            self._busy = True
        try:
            link = self._open(timeout)
        except BaseException:
            self._busy = False
            raise
        if link is None:
            self._busy = False
            return ask, None
        self._calls += 1
        ask = dataclasses.replace(
            ask, result_channel=self._channel, result_call=self._calls, footer_on_data=True
        )
        data = DataResults(
            link,
            self._calls,
            timeout,
            self._address,
            requests=self._requests,
            request_bytes=(self._send_bytes, self._coordinator_bytes),
        )
        return ask, data

    def finished(self, data: DataResults | None) -> None:
        """A call that named the connection is over: a connection the coordinator did
        not take, or whose frames of the call were not all read, is dropped."""
        if data is None:
            return
        if not data.clean:
            self.drop()
        self._busy = False

    def drop(self) -> None:
        """Closes the results connection; the next call opens a new one."""
        link, self._link = self._link, None
        if link is not None:
            link.close()

    def close(self) -> None:
        """Closes the results connection for good."""
        self._grpc_only = True
        self.drop()

    def _open(self, timeout: float | None) -> DataLink | None:
        if self._link is not None and self._link.readable():
            # Between answers a connection holds nothing: its end (or anything)
            # there means the coordinator closed it (it restarted, say), and a
            # request sent on it would fail unanswered. A new one is opened.
            self.drop()
        if self._link is not None or self._grpc_only:
            return self._link
        wait = DATA_DIAL_SECONDS if timeout is None else min(timeout, DATA_DIAL_SECONDS)
        try:
            opened = self._stubs.open_result_channel(timeout=wait)
        except RlfleetError as exc:  # tried again on the next call
            # The Sample call that follows reports the coordinator's trouble itself.
            logger.debug("OpenResultChannel on %s failed: %s", self._address, exc)
            return None
        if opened is None:  # no data channel, or an older coordinator
            self._grpc_only = True
            return None
        channel, port, ticket, self._requests, self._coordinator_bytes = opened
        hello = data_hello(ticket)
        if self.attach is not None:
            try:
                self._link = self.attach(hello)
            except UnavailableError as exc:  # the learner dials as any learner would
                logger.info("results connection: %s; dialling its data port instead", exc)
        if self._link is None:
            host = coordinator_host(self._address)
            try:
                tls = self._security.tls
                self._link = dial(
                    host, port, hello, tls=tls, timeout=wait, max_frame_bytes=self._receive_bytes
                )
            except (OSError, UnavailableError) as exc:
                why = f"{type(exc).__name__}: {exc}"
                warn_unreachable(host, port, "the sampler's results", why)
                self._grpc_only = True
                return None
        self._channel = channel
        return self._link


class DataResults:
    """Reads one call's result frames off its results connection.

    Args:
        link: The connection.
        call: The call's number on it.
        timeout: The call's deadline in seconds (None: none), counted from now.
        address: The coordinator's address, for errors.
        requests: The coordinator takes the request itself on the connection
            (:meth:`requested`).
        request_bytes: The longest request the sampler sends (its message
            limit) and the longest the coordinator reads there (0: not said).
    """

    def __init__(
        self,
        link: DataLink,
        call: int,
        timeout: float | None,
        address: str,
        *,
        requests: bool = False,
        request_bytes: tuple[int, int] = (_rpc.DEFAULT_MAX_MESSAGE_BYTES, 0),
    ) -> None:
        self.requests = requests
        self._request_bytes = request_bytes
        self._asked = False  # the request went on the connection
        self._link = link
        self._call = call
        self._timeout = timeout
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._address = address
        self.count = 0  # result frames read
        self.used = False  # the coordinator took the connection for the call
        self.ended = False  # its end marker (or footer) was read
        #: The call's header said its footer comes here, in place of the end
        #: marker (``SampleHeader.footer_on_data``; the answer's reader sets it).
        self.footer_expected = False
        #: The footer read here, once read (None: the stream carries it, or
        #: the call failed: an end marker came instead).
        self.footer: Footer | None = None
        self.result_bytes = 0  # of the result frames read
        #: Bytes of results expected soon (0: none known): a wait for the
        #: next frame then takes up to that many at once
        #: (``DataLink.receive_message``'s ``gather``). The answer's reader
        #: sets it from what is left of the answer (:func:`collect_answer`).
        self.gather = 0

    @property
    def call(self) -> int:
        """The call's number on the connection."""
        return self._call

    @property
    def clean(self) -> bool:
        """Whether the connection holds no frame of this call any more (it may serve the next)."""
        return self.used and self.ended

    def requested(self, request: bytes) -> Iterator[ResponsePart]:
        """Sends a serialized SampleRequest on the connection (no Sample call) and
        yields its answer's header, read there; its results and footer follow
        there too (:meth:`results`). What a Sample call iterates, for
        :func:`~rlfleet.client._responses.collect_answer`.

        Raises:
            UnavailableError: If the connection ended first (retryable).
            RlfleetTimeoutError: If the call's deadline passed first.
            ProtocolError: For a first frame of another call, or no header.
            ResourceExhaustedError: For a request longer than the sampler
                sends or the coordinator reads: not sent (the connection
                serves the next), worded as the Sample call's status is.
            RlfleetError: The request's failure, typed as its Sample call's
                status would have been (rlfleet.client._errors).
        """
        oversized = _oversized(len(request), *self._request_bytes)
        if oversized is not None:
            # The coordinator would close the connection unanswered: its
            # failure would have to name the call the unread frame holds.
            raise self._failed(CallFailed(RESOURCE_EXHAUSTED, oversized, None))
        self._asked = True
        try:
            self._link.send(request)
        except (ConnectionClosedError, OSError) as exc:
            raise UnavailableError(
                f"{self._what}: the results connection failed before the request went "
                f"({type(exc).__name__}: {exc}); retry"
            ) from None
        call, part = parse_result_frame(self._receive())
        if call != self._call:
            raise ProtocolError(
                f"{self._what}: a results frame of call {call} arrived during call {self._call}"
            )
        if isinstance(part, CallFailed):
            raise self._failed(part)
        if not (isinstance(part, CallHeader) and part.results_on_data):
            raise ProtocolError(f"{self._what}: the answer on the results connection has no header")
        yield part

    @property
    def _what(self) -> str:
        return f"Sample on coordinator {self._address}"

    def _failed(self, failure: CallFailed) -> RlfleetError:
        """The typed error of the request's failure; the connection holds nothing
        more of the call (it may serve the next)."""
        self.used = self.ended = True
        what, timeout = self._what, self._timeout
        return failure_error(
            failure.code, failure.message, failure.detail, what=what, timeout=timeout
        )

    def _receive(
        self, gather: int = 0, *, mid_answer: bool = False
    ) -> bytes | memoryview | FramePieces:
        """The next frame within the call's deadline (``gather``: as
        ``DataLink.receive_message``'s); ``mid_answer``: results of the call
        were due (else its header or failure, of a request sent here).

        Raises:
            UnavailableError: As :meth:`results`.
            RlfleetTimeoutError: As :meth:`results`.
        """
        left = None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)
        try:
            payload = self._link.receive_message(left, gather=gather)
        except RlfleetTimeoutError:
            # Worded as the call's own deadline is (rlfleet.transport.rpc).
            late = (
                " (its results had not all arrived on the results connection)" if mid_answer else ""
            )
            raise RlfleetTimeoutError(
                f"{self._what}: no answer within {self._timeout:g} seconds{late}"
            ) from None
        except (ConnectionClosedError, OSError) as exc:
            payload, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = "closed by the coordinator"
        if payload is None:
            where = "mid-answer" if mid_answer else "before the answer's header"
            raise UnavailableError(
                f"{self._what}: the results connection ended {where} ({why}); the partial "
                "answer was dropped, retry (a retried obtain_* call gets the same seeds)"
            )
        return payload

    def results(
        self, make: Callable[[ResultHeader, Chunk | None], _Made], context: Any = None
    ) -> Iterator[_Made | ViewedResult]:
        """What ``make`` makes of each of the call's result messages (its header and
        chunk), up to the coordinator's end marker, or its footer when
        :attr:`footer_expected` (then :attr:`footer`); with ``context``
        (:meth:`~rlfleet.client._responses.ResponseReader.frame_context`), a
        one-chunk result its worker's kept plan views is taken in the reader's
        one call instead, as ``make`` would take it
        (:func:`~rlfleet.wire.result_message.read_frame_made`).

        Raises:
            UnavailableError: If the connection ended before the marker (retryable).
            RlfleetTimeoutError: If the call's deadline passed first.
            ProtocolError: For a frame that is no result or marker of a
                call, or a marker whose count is not the frames read, or a
                footer the header did not announce.
        """
        self.used = True
        while True:
            payload = self._receive(self.gather, mid_answer=True)
            # A result as the coordinator writes it is read with no object per frame
            # but its header and chunk, made in the reader's one call (a frame off
            # a socket is a byte view; one handed over in memory comes in pieces),
            # or taken whole in that call where the context's views know it.
            made = (
                read_frame_made(payload, ResultHeader, Chunk, context)
                if type(payload) is memoryview
                else NotImplemented
            )
            if type(made) is ViewedResult:  # taken: its call is this one's
                self.count += 1
                self.result_bytes += len(payload)
                yield made
                continue
            read: _FrameRead | NotImplementedType | None = made
            if read is NotImplemented:
                read = read_coordinator_result(payload)
            if read is None:
                call, part = parse_result_frame(payload)
                if isinstance(part, ResultPart):
                    read = (call, part.header, part.chunk)
            else:
                call = read[0]
            if call != self._call:
                raise ProtocolError(
                    f"Sample on coordinator {self._address}: a results frame of call {call} "
                    f"arrived during call {self._call}"
                )
            if read is not None:
                self.count += 1
                self.result_bytes += len(payload)
                yield make(read[1], read[2])
            elif isinstance(part, ResultsEnd):
                if part.results != self.count:
                    raise ProtocolError(
                        f"Sample on coordinator {self._address}: the results connection's end "
                        f"marker counts {part.results} results, {self.count} arrived"
                    )
                self.ended = True
                return
            elif isinstance(part, Footer) and self.footer_expected:
                # Its data_results is checked against the count by the answer's reader.
                self.footer = part
                self.ended = True
                return
            elif isinstance(part, CallFailed) and self._asked:
                raise self._failed(part)
            else:
                raise ProtocolError(
                    f"Sample on coordinator {self._address}: a results frame holding neither "
                    "a result nor an end marker"
                )


def _oversized(size: int, sent: int, read: int) -> str | None:
    """Why a request of ``size`` bytes is not sent, in gRPC's words for a Sample
    call's (the sampler's channel refuses it first, then the coordinator's
    server), or None: it goes. ``sent``: the sampler's message limit;
    ``read``: the coordinator's (0: not said)."""
    if size > sent:
        return f"CLIENT: Sent message larger than max ({size} vs. {sent})"
    if read and size > read:
        return f"SERVER: Received message larger than max ({size} vs. {read})"
    return None
