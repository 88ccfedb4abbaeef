"""The lease data channel, dialling side: framed TCP (or TLS) to the coordinator.

A learner's lease and a worker's session move their lease calls and
replies off gRPC onto one plain TCP connection they dial to the
coordinator's host (so workers still need no inbound port): each message is
a frame, a 4-byte big-endian length and one serialized protobuf message
(leases.proto, "The lease data channel"; docs/protocol.md). gRPC costs
70-100 us of CPU per message per side; a frame costs a ``sendall`` and a
buffered read.

A learner in the coordinator's own process (``Fleet.local``) gets an
:class:`~rlfleet.transport.in_process_link.InProcessLink` instead: the
same frames handed over in memory, with no socket and no relay thread on
the way out.

This module knows bytes only: the messages are built and parsed by the
lease face's translation (rlfleet.wire.leases and the worker session).
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, TypeVar, cast

from rlfleet.errors import (
    ConnectionClosedError,
    ProtocolError,
    RlfleetTimeoutError,
    UnavailableError,
)
from rlfleet.security import ClientTLS
from rlfleet.transport.frame_pieces import FramePieces
from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES, Landing, ReceiveBuffers

logger = logging.getLogger("rlfleet.transport.lease_channel")

#: A frame's length prefix: unsigned 32-bit big-endian.
FRAME_HEADER = struct.Struct(">I")
#: Longest wait for the data channel's connection, TLS handshake and answer.
DATA_DIAL_SECONDS = 10.0
#: Largest first frame (LeaseDataHello / LeaseDataAccepted) either side reads.
HANDSHAKE_FRAME_BYTES = 1024
#: Bytes of receive buffers a results connection keeps for reuse: about one
#: large answer's frames (4,000 Atari-sized frames are 118 MB).
_KEPT_BYTES = 128 << 20
#: The least a results connection's read asks for over plain TCP (a kept
#: buffer's worth, ``receive_message``): about twenty 400-step CartPole
#: results, which a reader behind its sender takes in one system call.
LANDING_BYTES = 256 << 10
#: A landing with less room than this past its bytes is left for the next one
#: (a read into a few bytes' room would cost a system call for them).
_LEAST_READ = 16 << 10
#: Buffers handed to one ``sendmsg`` (below every system's IOV_MAX).
_SENDMSG_BUFFERS = 512
#: The most a reader that gathers frames (``receive_message``'s ``gather``)
#: and finds the next one not yet sent waits for: a landing's worth (about
#: twenty 400-step CartPole results), read with one system call ...
GATHER_BYTES = LANDING_BYTES
#: ... or this long, whichever comes first, and then for the frame as before:
#: one wake-up for several frames where each took its own, at up to this
#: much later a frame's read when fewer bytes follow it than were asked for.
#: A coordinator that sends a learner 40 MB/s of results fills about 200 kB
#: in it: a wait costs its thread about 15 us of CPU, mostly its sleep and
#: wake-up, so the longer the wait, the fewer a result pays for.
GATHER_SECONDS = 0.005

_T = TypeVar("_T")


def frame(payload: bytes | memoryview) -> bytes:
    """``payload`` behind its length prefix."""
    return FRAME_HEADER.pack(len(payload)) + payload


class DataLink(Protocol):
    """A dialled data connection, over TCP (:class:`LeaseDataLink`) or in
    memory (:class:`~rlfleet.transport.in_process_link.InProcessLink`):
    frames out from any thread, in by one at a time."""

    def send(self, payload: bytes) -> None:
        """Sends one frame (OSError: the connection is broken or closed)."""

    def receive(self) -> bytes | None:
        """The next frame; None once the coordinator closed the connection."""

    def receive_within(self, seconds: float) -> bytes | None:
        """:meth:`receive`, waiting at most ``seconds`` (TimeoutError past them)."""

    def readable(self) -> bool:
        """Whether a receive would start without waiting."""

    def receive_message(
        self, seconds: float | None, *, gather: int = 0
    ) -> bytes | memoryview | FramePieces | None:
        """The next frame in a buffer of its own (no copy past the one off the
        socket; a reused buffer, not written again while anything views it;
        in memory, its large piece not copied at all),
        waiting at most ``seconds`` (None: no limit); None once the
        coordinator closed the connection (RlfleetTimeoutError past the wait).
        ``gather``: bytes a reader expects soon, which it may wait for at
        once (:meth:`LeaseDataLink.receive_message`)."""

    def close(self) -> None:
        """Closes the connection (idempotent); a blocked receive returns."""


class LeaseDataLink:
    """One accepted data connection (a blocking socket).

    Sends may come from any thread (a lock keeps frames whole); frames are
    received by one thread at a time, with :meth:`receive`,
    :meth:`receive_within` or :meth:`receive_message`.

    Over TLS a send and a receive share one OpenSSL object, which must not
    be used by two threads at once (a TLS 1.3 read may write: a key update's
    answer): every SSL call runs under the lock. A receive therefore waits
    for the socket's bytes outside it (``poll``) and reads without blocking
    inside it, so a send never waits behind a receive's wait. No receive
    changes the socket's timeout while a send may run under it (a send's
    limit, :meth:`set_send_timeout`, is ``SO_SNDTIMEO`` over TCP and the
    socket's timeout over TLS), and over plain TCP a send costs what it did
    (the kernel's socket takes both at once).

    Args:
        sock: The connected socket, past the handshake.
        max_frame_bytes: Longest frame accepted from the coordinator.
    """

    def __init__(self, sock: socket.socket, max_frame_bytes: int) -> None:
        self._sock = sock
        self._max = max_frame_bytes
        self._lock = threading.Lock()  # a frame's sends; over TLS, every SSL call
        self._tls = isinstance(sock, ssl.SSLSocket)
        # Over TLS: decrypted bytes are held in OpenSSL past the last read,
        # where ``poll`` does not see them (written under the lock).
        self._tls_pending = False
        # Received bytes not yet returned: a wait that times out mid-frame
        # keeps what it read for the next one.
        self._buffer = bytearray()
        self._closed = False
        self._send_seconds: float | None = None
        # What receive_message reads frames into (made on first use: only a
        # learner's results connection reads that way).
        self._buffers: ReceiveBuffers | None = None
        # receive_message: reads land in a kept buffer
        # (``_land``), whose bytes ``_lo:_hi`` are not handed out yet (frames
        # before ``_lo`` were: ``_handed``), and past ``_hi`` are free.
        self._landing: Landing | None = None
        self._land: memoryview | None = None
        self._lo = 0
        self._hi = 0
        self._handed = False
        # A landing holds the last large frame and an eighth: a run of like
        # frames lands whole, handed out where it landed.
        self._land_bytes = LANDING_BYTES
        # The socket's SO_RCVLOWAT as a gathering wait left it (1: the
        # kernel's; 0: the system does not take it), set only when a wait
        # asks for another value: a run of waits for the same bytes costs no
        # call, and every other wait or read puts 1 back first.
        self._low_mark = 1
        self._gather_poll: select.poll | None = None  # a gathering wait's, kept

    def set_send_timeout(self, seconds: float) -> None:
        """Bounds every send: one the peer does not take within ``seconds`` fails
        (the socket's receives keep waiting as long as they did)."""
        self._send_seconds = seconds
        if self._tls:
            # OpenSSL retries a write that SO_SNDTIMEO cut short, for ever: over
            # TLS the socket's own timeout bounds each write instead (no
            # receive blocks under it: they wait outside the lock, with poll).
            with self._lock:
                self._sock.settimeout(seconds)
            return
        whole = int(seconds)
        timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)

    def send(self, payload: bytes) -> None:
        """Sends one frame.

        Raises:
            OSError: If the connection is broken (TimeoutError past the send timeout).
        """
        data = frame(payload)
        with self._lock, self._timed():
            self._sock.sendall(data)

    def send_frames(self, payloads: Sequence[bytes | memoryview]) -> None:
        """Sends frames in order, from the caller's thread, without copying a
        payload where the socket allows it (plain TCP: ``sendmsg``; TLS copies
        each frame once, behind its header).

        Raises:
            OSError: If the connection is broken (TimeoutError past the send
                timeout); what was sent of the frames is then unknown.
        """
        with self._lock, self._timed():
            sock = self._sock
            if isinstance(sock, ssl.SSLSocket):  # no sendmsg over TLS
                for payload in payloads:
                    sock.sendall(frame(payload))
                return
            parts: list[bytes | memoryview] = []
            for payload in payloads:
                parts += (FRAME_HEADER.pack(len(payload)), payload)
            while parts:
                sent = sock.sendmsg(parts[:_SENDMSG_BUFFERS])
                while parts and sent >= len(parts[0]):
                    sent -= len(parts.pop(0))
                if sent:
                    parts[0] = memoryview(parts[0])[sent:]

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        """Turns a send that ran past the send timeout into a TimeoutError naming it."""
        try:
            yield
        except (BlockingIOError, ssl.SSLWantWriteError, TimeoutError):
            raise RlfleetTimeoutError(
                f"the coordinator took no data for {self._send_seconds:g} seconds (the send "
                "timeout)"
            ) from None

    def receive(self) -> bytes | None:
        """The next frame's payload; None once the coordinator closed the connection.

        Waits for ever (see :meth:`receive_within`).

        Raises:
            OSError: If the connection broke.
            ProtocolError: For a frame longer than allowed.
        """
        return self._receive(None)

    def _receive(self, deadline: float | None) -> bytes | None:
        """:meth:`receive` until ``deadline`` (``time.monotonic()``; None: for ever;
        TimeoutError past it, keeping the frame's bytes read so far)."""
        buffer = self._buffer
        if self._land is not None and self._hi > self._lo:  # landed by receive_message
            buffer += self._land[self._lo : self._hi]
            self._lo = self._hi
        while True:
            if len(buffer) >= FRAME_HEADER.size:
                (length,) = FRAME_HEADER.unpack_from(buffer)
                if length > self._max:
                    raise ProtocolError(
                        f"the coordinator sent a lease data frame of {length} bytes, above "
                        f"the limit of {self._max}"
                    )
                end = FRAME_HEADER.size + length
                if len(buffer) >= end:
                    with memoryview(buffer) as view:
                        payload = bytes(view[FRAME_HEADER.size : end])
                    del buffer[:end]
                    return payload
                missing = end - len(buffer)
            else:
                missing = FRAME_HEADER.size - len(buffer)
            size = max(missing, 1 << 16)
            chunk = self._read(self._sock.recv, (size,), deadline)
            if not chunk:
                return None
            if not buffer and len(chunk) >= FRAME_HEADER.size:
                (length,) = FRAME_HEADER.unpack_from(chunk)
                if len(chunk) == FRAME_HEADER.size + length and length <= self._max:
                    return chunk[FRAME_HEADER.size :]  # the usual read: one whole frame
            buffer += chunk

    def receive_message(self, seconds: float | None, *, gather: int = 0) -> memoryview | None:
        """The next frame's payload, read straight into a buffer of its own: the
        one copy is the kernel's, off the socket (a results connection's
        frames are large; :meth:`receive` copies each twice). A large frame's
        buffer is a reused one (rlfleet.transport.receive_buffers): an answer's frames,
        let go once its rows are placed, take the same memory as the last
        answer's, whose first touch was the cost of the read.

        Each read takes what is there, up to a kept buffer's length, and
        hands out every whole frame in it as a view of it
        (:meth:`_receive_landed`): a reader behind its sender, as a learner
        reading an answer's frames is, reads several frames with one system
        call over plain TCP, and with one SSL read (a TLS record's bytes) over
        TLS.

        A reader ahead of its sender (a learner whose coordinator sends an
        answer's results as they come) waits for each frame: with ``gather``,
        over plain TCP, a wait for the next frame's first bytes asks the
        kernel for that many bytes at once (``SO_RCVLOWAT``; at most
        :data:`GATHER_BYTES`), for at most :data:`GATHER_SECONDS`, so that
        one wake-up reads several frames.

        Args:
            seconds: The longest wait for the whole frame (None: no limit).
            gather: Bytes the reader expects soon (0: none), waited for at
                once where the next frame is not here yet.

        Returns:
            The payload; None once the coordinator closed the connection
            between frames.

        Raises:
            RlfleetTimeoutError: If the frame was not whole within ``seconds``;
                what arrived of it is lost, so the caller drops the connection.
            ConnectionClosedError: If the connection ended inside a frame.
            OSError: If the connection broke.
            ProtocolError: For a frame longer than allowed.
        """
        deadline = None if seconds is None else time.monotonic() + seconds
        return self._receive_landed(deadline, seconds, gather)

    def _receive_landed(
        self, deadline: float | None, seconds: float | None, gather: int
    ) -> memoryview | None:
        """:meth:`receive_message`: each read takes what the socket (over TLS,
        OpenSSL) holds, up to a kept buffer's length (the landing), and every whole
        frame in it is handed out as a view of it. Reads go on into the
        landing past the frames handed out of it, never over them, until
        the next frame does not fit in what is left: its start is then
        copied to the front of the next landing (less than one frame), or,
        for a large frame, to a reused buffer of its own, whose rest is read
        straight into it (and what follows into the next landing, with the
        same call over plain TCP). A landing any handed-out frame still views
        is not taken again (rlfleet.transport.receive_buffers).

        Over TLS each read takes at most one record's decrypted bytes, and
        comes before any wait (:meth:`_read`'s ``eager``): what a record
        holds past the room given stays in OpenSSL, where ``poll`` does not
        see it, and the next read takes it without waiting."""
        header = FRAME_HEADER.size
        land, landing = self._land, self._landing
        if land is None or landing is None:
            land, landing = self._first_landing()
        lo, hi = self._lo, self._hi
        while True:
            avail = hi - lo
            if avail >= header:
                (length,) = FRAME_HEADER.unpack_from(land, lo)
                if length > self._max:
                    raise ProtocolError(
                        f"the coordinator sent a data frame of {length} bytes, above the limit "
                        f"of {self._max}"
                    )
                end = lo + header + length
                if end <= hi:
                    self._lo = end
                    self._handed = True
                    return land[lo + header : end]
                need = header + length
                if length >= LARGE_FRAME_BYTES:
                    wanted = need + (need >> 3)
                    if wanted > self._land_bytes or wanted < self._land_bytes >> 1:
                        self._land_bytes = max(wanted, LANDING_BYTES)
                    if len(land) - lo < need:
                        return self._receive_large(
                            landing, land[lo + header : hi], length, deadline, seconds
                        )
            else:
                need = header
            if len(land) - lo < need or len(land) - hi < _LEAST_READ:
                # The start of the next frame moves to the front of a landing
                # no handed-out frame views (a copy of less than one frame).
                start = bytes(land[lo:hi])
                if self._handed:
                    self._handed = False
                    landing.spend()
                land = self._land = landing.view(max(need, self._land_bytes))
                land[:avail] = start
                lo, hi = self._lo, self._hi = 0, avail
            try:
                count = self._read(
                    self._sock.recv_into,
                    (land[hi:], len(land) - hi),
                    deadline,
                    gather=gather if avail < header else 0,
                    eager=True,
                )
            except TimeoutError:
                raise RlfleetTimeoutError(
                    f"no whole data frame within {seconds:g} seconds"
                ) from None
            if not count:
                if not avail:
                    return None
                raise ConnectionClosedError("the coordinator closed the data connection mid-frame")
            gather = 0
            hi = self._hi = hi + count

    def _first_landing(self) -> tuple[memoryview, Landing]:
        """Makes the first landing, holding what the handshake's reads took past
        its frame."""
        if self._buffers is None:
            self._buffers = ReceiveBuffers(_KEPT_BYTES)
        landing = self._landing = Landing(self._buffers)
        kept = self._buffer
        land = self._land = landing.view(max(len(kept), self._land_bytes))
        land[: len(kept)] = kept
        self._lo, self._hi = 0, len(kept)
        kept.clear()
        return land, landing

    def _receive_large(
        self,
        landing: Landing,
        start: memoryview,
        length: int,
        deadline: float | None,
        seconds: float | None,
    ) -> memoryview:
        """A large frame of ``length`` bytes whose first bytes, ``start``, are in
        the landing: in a reused buffer of its own (``length`` is checked
        against the limit), its rest read straight into it and what follows
        it into a landing nothing views."""
        payload = cast(ReceiveBuffers, self._buffers).take(length)
        got = len(start)
        payload[:got] = start
        del start
        if self._handed:
            self._handed = False
            landing.spend()
        land = self._land = landing.view(self._land_bytes)
        self._lo = self._hi = 0
        while got < length:
            rest = payload[got:]
            try:
                if self._tls:  # no recvmsg_into: what follows stays in OpenSSL
                    count = self._read(
                        self._sock.recv_into, (rest, len(rest)), deadline, eager=True
                    )
                else:
                    count = self._read(self._read_two, (rest, land), deadline)
            except TimeoutError:
                raise RlfleetTimeoutError(
                    f"no whole data frame within {seconds:g} seconds"
                ) from None
            if not count:
                raise ConnectionClosedError("the coordinator closed the data connection mid-frame")
            if count > len(rest):
                self._hi = count - len(rest)
                count = len(rest)
            got += count
        return payload

    def _read_two(self, first: memoryview, then: memoryview, flags: int) -> int:
        """Reads into ``first`` and on into ``then`` with one call; the bytes read."""
        return self._sock.recvmsg_into((first, then), 0, flags)[0]

    def readable(self) -> bool:
        """Whether bytes of a frame are here already: a receive would start without waiting."""
        if self._buffer or self._tls_pending or self._hi > self._lo:
            return True
        if self._low_mark > 1:
            self._clear_low_mark()
        return bool(select.select([self._sock], [], [], 0)[0])

    def receive_within(self, seconds: float) -> bytes | None:
        """:meth:`receive`, waiting at most ``seconds``.

        Raises:
            TimeoutError: If no whole frame came within ``seconds`` (what
                arrived of it is kept for the next call).
            OSError, ProtocolError: As :meth:`receive`.
        """
        try:
            return self._receive(time.monotonic() + seconds)
        except TimeoutError:
            raise RlfleetTimeoutError(
                f"no whole lease data frame within {seconds:g} seconds"
            ) from None

    def _read(
        self,
        call: Callable[..., _T],
        args: tuple[object, ...],
        deadline: float | None,
        *,
        gather: int = 0,
        eager: bool = False,
    ) -> _T:
        """One read off the socket, ``call(*args, flags)``, once bytes are there.

        Plain TCP reads as it is (blocking, or, when there is a deadline or
        ``gather``, ``MSG_DONTWAIT``, waiting for readability only when nothing
        is there; with ``gather`` the first wait is :meth:`_wait_gathering`'s).
        TLS waits outside the lock and reads under it without blocking: a
        read that finds no whole record (``SSLWantReadError``) waits again.
        Bytes decrypted in OpenSSL past the last read, which ``poll`` does not
        see, are read without a wait; with ``eager`` (a reader that is
        usually behind its sender: a learner's results) the read comes
        first, and a wait only after one that found nothing: no ``poll`` per
        read where the bytes are there already.

        Raises:
            TimeoutError: Past ``deadline`` (``time.monotonic()``; None: none).
            OSError: If the connection broke or was closed.
        """
        sock = self._sock
        if not self._tls:
            if deadline is None and not gather:
                if self._low_mark > 1:
                    self._clear_low_mark()
                return call(*args, 0)
            while True:
                # Bytes already here (a reader behind its sender: a learner
                # reading an answer's frames) are read without waiting for
                # them first: one system call, not a poll and a read.
                try:
                    return call(*args, socket.MSG_DONTWAIT)
                except BlockingIOError:  # none yet, or another reader's
                    pass
                if gather:
                    self._wait_gathering(deadline, gather)
                    gather = 0
                else:
                    self._wait(select.POLLIN, deadline)
        want = 0 if eager or self._tls_pending else select.POLLIN
        while True:
            if want:
                self._wait(want, deadline)
            with self._lock:
                timeout = sock.gettimeout()  # a blocking socket's, or the dial's
                sock.settimeout(0.0)
                try:
                    got = call(*args, 0)
                except ssl.SSLWantReadError:
                    want = select.POLLIN
                except ssl.SSLWantWriteError:  # the read's own write (a key update's answer)
                    want = select.POLLOUT
                else:
                    self._tls_pending = sock.pending() > 0  # type: ignore[attr-defined]
                    return got
                finally:
                    sock.settimeout(timeout)
                self._tls_pending = False

    def _wait(self, events: int, deadline: float | None) -> None:
        """Waits (no lock held) until the socket is ready for ``events``.

        Raises:
            TimeoutError: Past ``deadline``.
            ConnectionClosedError: If the link was closed meanwhile (an OSError).
        """
        fd = self._sock.fileno()
        if fd < 0:
            raise ConnectionClosedError("the lease data connection was closed on this side")
        if self._low_mark > 1:
            self._clear_low_mark()
        poller = select.poll()
        poller.register(fd, events)
        while True:
            if deadline is None:
                wait = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RlfleetTimeoutError("no lease data frame before the read's deadline")
                wait = math.ceil(left * 1000)
            if poller.poll(wait):
                return

    def _wait_gathering(self, deadline: float | None, size: int) -> None:
        """Waits (no lock held) until ``size`` bytes (at most
        :data:`GATHER_BYTES`) are here, the connection
        ends, :data:`GATHER_SECONDS` pass or the deadline does,
        whichever is first (the read that follows takes what is there, or
        waits for any byte as before).

        ``SO_RCVLOWAT`` makes the socket readable only past that many bytes
        (poll honours it over TCP). It stays set past this wait, and is set
        again only for another value: the reads that follow do not wait
        (``MSG_DONTWAIT`` returns what is there whatever the mark), and every
        other wait, blocking read or :meth:`readable` puts 1 back first
        (:meth:`_clear_low_mark`), so that none of them ever sees it.
        """
        sock = self._sock
        fd = sock.fileno()
        if fd < 0:
            raise ConnectionClosedError("the lease data connection was closed on this side")
        mark = min(size, GATHER_BYTES)
        if mark != self._low_mark:
            if not self._low_mark:  # a system that does not take it: each frame waited for
                return
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, mark)
            except OSError:  # as before
                self._low_mark = 0
                return
            self._low_mark = mark
        wait = GATHER_SECONDS
        if deadline is not None:
            wait = min(wait, max(deadline - time.monotonic(), 0.0))
        poller = self._gather_poll
        if poller is None:
            poller = self._gather_poll = select.poll()
            poller.register(fd, select.POLLIN)
        poller.poll(math.ceil(wait * 1000))

    def _clear_low_mark(self) -> None:
        """Puts the socket's ``SO_RCVLOWAT`` back to 1 (a gathering wait left it higher)."""
        with contextlib.suppress(OSError):  # closed meanwhile: nothing waits on it
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
        self._low_mark = 1

    def close(self) -> None:
        """Closes the connection (idempotent); a blocked :meth:`receive` returns."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(OSError):  # already disconnected
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def dial(
    host: str,
    port: int,
    hello: bytes,
    *,
    tls: ClientTLS | None,
    timeout: float,
    max_frame_bytes: int,
) -> LeaseDataLink:
    """Connects to the coordinator's data port and presents a ticket.

    Args:
        host: The coordinator's host (the one dialled for gRPC).
        port: Its data port (LeaseDataAddress.port).
        hello: The serialized LeaseDataHello.
        tls: The fleet's client TLS settings, or None for plaintext.
        timeout: Seconds for connecting, the TLS handshake and the answer.
        max_frame_bytes: Longest frame accepted afterwards.

    Raises:
        OSError: If the port cannot be reached (the caller falls back to gRPC).
        UnavailableError: If the coordinator closed the connection instead of
            accepting the ticket.
    """
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            sock = tls.ssl_context().wrap_socket(sock, server_hostname=tls.server_name or host)
        sock.sendall(frame(hello))
        link = LeaseDataLink(sock, max_frame_bytes)
        try:
            accepted = link.receive_within(timeout)
        except TimeoutError:
            accepted = None
        if accepted is None:
            raise UnavailableError(
                f"the coordinator's lease data port {host}:{port} closed the connection "
                f"instead of accepting the ticket within {timeout:g} seconds (see its log)"
            )
        sock.settimeout(None)
        return link
    except BaseException:
        sock.close()
        raise
