"""The lease data channel's connections, as the coordinator holds them.

A :class:`DataConnection` is one accepted TCP (or TLS) connection of the
selector loop (data_server.py); an :class:`InProcessConnection` is a
learner of this very process (``Fleet.local``), its frames handed over in
memory. Their owners (face.py, data_peers.py, the learner face's results
connections) see what :class:`LeaseConnection` offers.
"""

from __future__ import annotations

import abc
import contextlib
import queue
import select
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, cast

from rlfleet.errors import ConnectionClosedError, RlfleetTimeoutError
from rlfleet.transport.frame_pieces import InProcessFrame, frame_of
from rlfleet.transport.in_process_link import InProcessLink
from rlfleet.transport.lease_channel import FRAME_HEADER, frame
from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES, Landing

if TYPE_CHECKING:
    from rlfleet.coordinator.leases.data_server import LeaseDataServer

#: Bytes waiting to be sent past which :meth:`DataConnection.send_parts` waits.
_PACED_BYTES = 4 << 20
#: A frame with at least this many bytes still to come is read straight into
#: its own buffer rather than through the loop's (one copy, the kernel's).
_DIRECT_BYTES = LARGE_FRAME_BYTES
#: Bytes a read takes at least into the loop's landing (a kept buffer) when
#: it does not know what follows, before a connection sent a large frame:
#: small frames ready together come in one read each this long.
_FIRST_READ_BYTES = LARGE_FRAME_BYTES
#: Bytes one readiness of a connection reads at most before the loop serves
#: the others (reads go on while each fills the landing).
_READ_TURN_BYTES = 4 << 20
#: Waiting pieces one ``sendmsg`` takes at most (well under the kernel's IOV_MAX).
_SEND_PIECES = 64
#: Pieces of several frames :meth:`DataConnection.send_frames` hands one
#: ``sendmsg`` at most (a frame's are never split; under the kernel's IOV_MAX).
_SEND_BATCH_PIECES = 256
#: What :meth:`LeaseConnection.try_send_frames` did: ``"sent"`` every frame
#: (in the kernel, or in memory for the peer); ``"begun"``, what the socket
#: took at once, the rest waiting, ahead of any later frame, for the caller
#: to :meth:`~LeaseConnection.finish` on a thread that may wait;
#: ``"refused"``, nothing.
Tried: TypeAlias = Literal["sent", "begun", "refused"]
#: Errors of a non-blocking socket (or TLS) that only mean "not now".
NOT_NOW = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class LeaseDataPeer(Protocol):
    """What a ticket's owner does with its connection's traffic."""

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        """The frames one wake-up of the loop read, in order (the loop thread;
        an in-process learner's frame alone, on its thread): each bytes, or
        for a large frame (or one read in parts) a view of a reused buffer,
        which is not written again while anything views it (the peer may
        keep it). Raising closes the connection; the frames after the one
        that raised are not handled."""

    def on_closed(self, reason: str) -> None:
        """The connection ended, for ``reason`` (once, the loop thread)."""


#: Called with the new connection when its ticket is presented; returns its peer.
Attach = Callable[["LeaseConnection"], LeaseDataPeer]


class LeaseConnection(abc.ABC):
    """A ticket's accepted connection, over TCP (:class:`DataConnection`) or in
    memory from this process (:class:`InProcessConnection`): its peer, and a
    close flag set once.

    Args:
        server: The data port that accepted it.
        what: Who it is, for logs.
    """

    def __init__(self, server: LeaseDataServer, what: str) -> None:
        self.what = what  # who it is, for logs
        self._server = server
        # TLS objects must not be used by two threads at once; plain sockets
        # take the same lock (uncontended: microseconds).
        self._lock = threading.Lock()
        self._closed = False
        self.peer: LeaseDataPeer | None = None

    def close(self, reason: str = "closed by the coordinator") -> None:
        """Closes the connection (idempotent, any thread)."""
        self._server.close(self, reason)

    def after_wake_up(self, hand_over: Callable[[], None]) -> None:
        """Runs ``hand_over`` once the data loop served this wake-up's ready
        connections (on its thread), or at once (on any other thread):
        :meth:`LeaseDataServer.after_wake_up`."""
        self._server.after_wake_up(hand_over)

    @property
    def closed(self) -> bool:
        """Whether it was closed."""
        return self._closed

    def mark_closed(self) -> bool:
        """Marks it closed; False if it already was."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._drop_pending()
            return True

    @abc.abstractmethod
    def send(self, payload: bytes) -> None:
        """Sends one frame to the peer without blocking (any thread)."""

    @abc.abstractmethod
    def send_parts(self, parts: Sequence[bytes | memoryview], wait_seconds: float) -> None:
        """Sends one frame whose payload is ``parts`` joined, waiting while the peer
        has not taken what was sent before (a learner's results connection).

        Raises:
            ConnectionClosedError: If the connection is closed.
            RlfleetTimeoutError: If the peer took nothing for ``wait_seconds``.
        """

    def send_frames(
        self, frames: Sequence[Sequence[bytes | memoryview]], wait_seconds: float
    ) -> None:
        """:meth:`send_parts` for each of ``frames`` (each a frame's parts), in order.

        Raises:
            ConnectionClosedError: As :meth:`send_parts`; the frames before
                the one that failed were sent.
            RlfleetTimeoutError: As :meth:`send_parts`.
        """
        for parts in frames:
            self.send_parts(parts, wait_seconds)

    def try_send_frames(self, frames: Sequence[Sequence[bytes | memoryview]]) -> Tried:
        """:meth:`send_frames` without waiting (the data loop's thread); here
        ``"refused"``: its sender's thread sends them (ConnectionClosedError
        if the connection is closed, in the subclasses)."""
        return "refused"

    def finish(self, wait_seconds: float) -> None:  # noqa: B027  (only sockets leave a rest)
        """Sends the rest a ``"begun"`` :meth:`try_send_frames` left, as
        :meth:`send_parts` waits (and raises)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Ends the connection for the peer (any thread; after :meth:`mark_closed`)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Frees what it holds (the loop thread, once it forgot the connection)."""

    def _drop_pending(self) -> None:  # noqa: B027  (a hook: only queued frames need dropping)
        """Forgets what waits to be sent (under the lock, once closed)."""


class DataConnection(LeaseConnection):
    """One accepted connection: frames out from any thread, frames in to its peer.

    Args:
        sock: The connected non-blocking socket (TLS-wrapped or plain).
        server: The loop that serves it.
        what: Who it is, for logs.
    """

    def __init__(
        self, sock: socket.socket, server: LeaseDataServer, what: str, max_pending_bytes: int
    ) -> None:
        super().__init__(server, what)
        self._sock = sock
        # TLS or plain, for good: TLS has no sendmsg and may hold decrypted bytes.
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._max_pending = max_pending_bytes
        self._pending_bytes = 0
        self._pending: list[memoryview] = []
        # Notified (under the lock) when pending bytes were sent or dropped.
        self._drained = threading.Condition(self._lock)
        self._head = bytearray()  # the first bytes of a frame header not whole yet
        self._body: memoryview | None = None  # the payload of a frame not whole yet
        self._got = 0  # bytes of it received
        # The bytes of the connection's large frames with their header, the
        # largest of a run (0: none yet): the landing a read takes holds a
        # frame that long and an eighth more.
        self._expect = 0

    def send(self, payload: bytes) -> None:
        """Sends one frame without blocking (what the socket does not take at once
        is sent by the loop, in order)."""
        with self._lock:
            if self._closed:
                return  # the peer's on_closed already ended what this belonged to
            rest, failure = self._write([frame(payload)])
            if failure is None and rest:
                waiting = self._pending_bytes + sum(map(len, rest))
                if waiting > self._max_pending:
                    # A peer that does not read what it asked for must not
                    # make the coordinator hold replies without bound.
                    failure = (
                        f"{waiting} bytes wait to be sent, above {self._max_pending}: the "
                        "peer does not read its connection"
                    )
                else:
                    self._pending += rest
                    self._pending_bytes = waiting
        if failure is not None:
            self._server.close(self, failure)
        elif rest:
            self._server.want_write(self)

    def send_parts(self, parts: Sequence[bytes | memoryview], wait_seconds: float) -> None:
        """Sends one frame of ``parts`` (no copy of them on plain TCP: ``sendmsg``),
        going at the peer's pace, as gRPC's flow control would make it.

        On plain TCP the caller's thread sends the whole frame itself: what
        the socket does not take at once it sends as the peer reads, waiting
        for room in the socket between writes, and returns once the frame is
        in the kernel. The loop never carries such a frame: no hand-off, no
        wake-up of the loop per frame, and what waits stays within the
        kernel's buffer. Over TLS (an SSL object may need to read to write)
        the rest waits for the loop instead. Either way the caller first
        waits while more than ``_PACED_BYTES`` wait to be sent (frames left
        by a sender that timed out), so what waits stays bounded.

        Raises:
            ConnectionClosedError: If the connection is (or gets) closed.
            RlfleetTimeoutError: If the peer took nothing for ``wait_seconds``.
        """
        self._send_pieces([FRAME_HEADER.pack(sum(map(len, parts))), *parts], wait_seconds)

    def send_frames(
        self, frames: Sequence[Sequence[bytes | memoryview]], wait_seconds: float
    ) -> None:
        """Sends ``frames`` (each a frame's parts) in order as :meth:`send_parts`
        does one, on plain TCP in one ``sendmsg`` for up to
        :data:`_SEND_BATCH_PIECES` pieces (a result lane's batch: one system
        call and one wake-up of the learner for its results, not one each).
        Over TLS (no ``sendmsg``) frame by frame, each paced as alone.

        Raises:
            ConnectionClosedError: As :meth:`send_parts`.
            RlfleetTimeoutError: As :meth:`send_parts`; the rest of the
                frames handed to the kernel so far still goes out, in order.
        """
        if self._tls or len(frames) == 1:
            super().send_frames(frames, wait_seconds)
            return
        pieces: list[bytes | memoryview] = []
        for parts in frames:
            if pieces and len(pieces) + 1 + len(parts) > _SEND_BATCH_PIECES:
                self._send_pieces(pieces, wait_seconds)
                pieces = []
            pieces.append(FRAME_HEADER.pack(sum(map(len, parts))))
            pieces += parts
        if pieces:
            self._send_pieces(pieces, wait_seconds)

    def try_send_frames(self, frames: Sequence[Sequence[bytes | memoryview]]) -> Tried:
        """Sends ``frames`` (each a frame's parts) as one write of what the
        socket takes at once: ``"begun"`` leaves the rest, ahead of any later
        frame, to :meth:`finish` (over TLS to the loop, ``"sent"``);
        ``"refused"``, nothing sent, while earlier frames wait to be sent (a
        sender that may wait sends behind them) or past one ``sendmsg``.

        Raises:
            ConnectionClosedError: If the connection is (or gets) closed.
        """
        pieces: list[bytes | memoryview] = []
        for parts in frames:
            pieces.append(FRAME_HEADER.pack(sum(map(len, parts))))
            pieces += parts
        if len(pieces) > _SEND_BATCH_PIECES:
            return "refused"
        with self._lock:
            if self._pending and not self._closed:  # closed: raised as before anything
                return "refused"
            rest, failure = self._write_or_queue(pieces)
        if failure is not None:
            raise self._broken(failure)
        if not rest:
            return "sent"
        if self._tls:
            self._server.want_write(self)
            return "sent"
        return "begun"

    def finish(self, wait_seconds: float) -> None:
        """Sends what waits on this thread (a rest :meth:`try_send_frames`
        left), as the peer reads.

        Raises:
            ConnectionClosedError: If the connection is (or gets) closed.
            RlfleetTimeoutError: If the peer took nothing for ``wait_seconds``.
        """
        failure = self._drain(wait_seconds)
        if failure is not None:
            raise self._broken(failure)

    def _send_pieces(self, pieces: Sequence[bytes | memoryview], wait_seconds: float) -> None:
        """:meth:`send_parts`' sending of ``pieces`` (whole frames, headers included)."""
        with self._lock:
            while self._pending_bytes > _PACED_BYTES and not self._closed:
                if not self._drained.wait(wait_seconds):
                    raise RlfleetTimeoutError(
                        f"{self.what} took no data for {wait_seconds:g} seconds"
                    )
            rest, failure = self._write_or_queue(pieces)
        if failure is None and rest and not self._tls:
            failure = self._drain(wait_seconds)
            rest = []
        if failure is not None:
            raise self._broken(failure)
        if rest:
            self._server.want_write(self)

    def _write_or_queue(
        self, pieces: Sequence[bytes | memoryview]
    ) -> tuple[list[memoryview], str | None]:
        """:meth:`_write` (lock held); the rest waits, ahead of later frames. Closed: raises."""
        if self._closed:
            raise ConnectionClosedError(f"the data connection of {self.what} is closed")
        rest, failure = self._write(pieces)
        if failure is None and rest:
            self._pending += rest
            self._pending_bytes += sum(map(len, rest))
        return rest, failure

    def _broken(self, failure: str) -> ConnectionClosedError:
        """Closes the connection for ``failure``; the error a sender raises."""
        self._server.close(self, failure)
        return ConnectionClosedError(f"the data connection of {self.what} broke: {failure}")

    def _drain(self, wait_seconds: float) -> str | None:
        """Sends what waits on this thread (plain TCP), waiting for room in the
        socket between writes; a reason to close, or None once all was sent.

        Raises:
            ConnectionClosedError: If the connection gets closed meanwhile.
            RlfleetTimeoutError: If the peer took nothing for ``wait_seconds``.
        """
        poller = select.poll()
        try:
            poller.register(self._sock, select.POLLOUT)
        except (OSError, ValueError):  # released meanwhile: no file descriptor left
            raise ConnectionClosedError(f"the data connection of {self.what} is closed") from None
        while True:
            # Without the lock: others may close the connection meanwhile.
            if not poller.poll(wait_seconds * 1000):
                # The frame's rest still goes out, from the loop, should the
                # peer read again: the stream stays whole for what follows.
                self._server.want_write(self)
                raise RlfleetTimeoutError(f"{self.what} took no data for {wait_seconds:g} seconds")
            with self._lock:
                if self._closed:
                    raise ConnectionClosedError(f"the data connection of {self.what} is closed")
                done, failure = self._send_pending()
            if failure is not None or done:
                return failure

    def _write(self, pieces: Sequence[bytes | memoryview]) -> tuple[list[memoryview], str | None]:
        """Writes what the socket takes at once of ``pieces`` (nothing while
        earlier frames wait: they go first); returns what is left
        of them, or why the connection failed. The caller holds the lock."""
        sent = 0
        if not self._pending:
            try:
                if len(pieces) == 1:
                    sent = self._sock.send(pieces[0])
                elif self._tls:
                    # No sendmsg over TLS: large pieces go as they are, the
                    # small ones around them joined (fewer TLS records).
                    pieces = _coalesced(pieces)
                    for piece in pieces:
                        took = self._sock.send(piece)
                        sent += took
                        if took < len(piece):
                            break
                else:
                    sent = self._sock.sendmsg(pieces)
            except NOT_NOW:
                pass  # what was sent before counts
            except OSError as exc:
                return [], f"send failed: {exc}"
        rest: list[memoryview] = []
        for piece in pieces:
            if sent >= len(piece):
                sent -= len(piece)
            elif piece:
                rest.append(memoryview(piece)[sent:])
                sent = 0
        return rest, None

    # --- the loop's side -----------------------------------------------------------

    def read(self, max_frame: int, landing: Landing) -> str | None:
        """Reads what arrived and hands the whole frames to the peer, all of
        them in one :meth:`LeaseDataPeer.on_frames` call; a reason to close,
        or None.

        Bytes land in ``landing`` (a kept buffer, read into again until a
        frame stays in it), which holds at least the last large frame's
        length and an eighth (:data:`_FIRST_READ_BYTES` before any): a large
        frame a read finds whole is handed out as a view of it, one read and
        no copy, and so is one that arrives in parts and fits in what is
        left of it (its rest is read into it where it is). Small frames are
        cut from it as ``bytes``. A large frame that does not fit (the first
        of its connection, or the next one of a read that took two) gets a
        buffer of its own, sized from the header, into which what the read
        took of it is copied; once its header says that at least
        :data:`_DIRECT_BYTES` are still to come, the rest is read straight
        into that frame's buffer. A read that fills the landing is followed
        by another at once (more is ready: the same wake-up takes it), up to
        :data:`_READ_TURN_BYTES`.
        """
        peer = self.peer
        if peer is None:
            return "no peer"
        frames: list[bytes | memoryview] = []
        reason = self._read(max_frame, landing, frames)
        if frames:
            peer.on_frames(frames)
        return reason

    def _read(
        self, max_frame: int, landing: Landing, frames: list[bytes | memoryview]
    ) -> str | None:
        """:meth:`read`'s reads; the whole frames go to ``frames``."""
        sock = self._sock
        turn = 0
        while True:
            body = self._body
            if body is not None and len(body) - self._got < _DIRECT_BYTES:
                body = None  # the rest of a frame is short: read with what follows it
            if body is None:
                expect = self._expect
                target = landing.view(max(expect + (expect >> 3), _FIRST_READ_BYTES))
            else:
                target = body[self._got :]
            try:
                with self._lock:
                    count = sock.recv_into(target)
            except NOT_NOW:
                return None
            except OSError as exc:
                return f"connection broken: {exc}"
            if not count:
                return "closed by the peer"
            if body is not None:
                self._got += count
                if self._got == len(body):
                    self._body = None
                    frames.append(body)
            else:
                reason = self._cut(target, count, max_frame, landing, frames)
                if reason is not None:
                    return reason
            turn += count
            if body is None and count == len(target) and turn < _READ_TURN_BYTES:
                # The landing was filled: more is waiting (a large frame's
                # rest, or further frames). A frame's own buffer is not read
                # again on this wake-up: every read lets go of the GIL, and one
                # that finds nothing costs a thread switch for no bytes.
                continue
            # A TLS socket may hold decrypted bytes the selector does not see.
            if not (self._tls and cast(ssl.SSLSocket, sock).pending()):
                return None

    def _cut(
        self,
        data: memoryview,
        count: int,
        max_frame: int,
        landing: Landing,
        frames: list[bytes | memoryview],
    ) -> str | None:
        """Puts the whole frames of ``data[:count]`` (the landing) in ``frames``
        (finishing one begun in an earlier read) and keeps the start of the
        next one: its header's first bytes, or its payload in a buffer; a
        reason to close, or None."""
        start = 0
        body = self._body
        if body is not None:  # the short rest of a frame begun in an earlier read
            take = min(len(body) - self._got, count)
            body[self._got : self._got + take] = data[:take]
            self._got += take
            if self._got < len(body):
                return None
            start = take
            self._body = None
            frames.append(body)
        head = self._head
        if head:  # a header cut by the previous read
            take = min(FRAME_HEADER.size - len(head), count - start)
            head += data[start : start + take]
            start += take
            if len(head) < FRAME_HEADER.size:
                return None
            (length,) = FRAME_HEADER.unpack(head)
            head.clear()
            if length > max_frame:
                return too_long(length, max_frame)
            start = self._begin(length, data, start, count, landing=landing, frames=frames)
        # The whole frames, inline: one call cuts every frame of the read.
        size = FRAME_HEADER.size
        unpack = FRAME_HEADER.unpack_from
        while count - start >= size:
            (length,) = unpack(data, start)
            if length > max_frame:
                return too_long(length, max_frame)
            start += size
            end = start + length
            if end > count or length >= _DIRECT_BYTES:
                start = self._begin(length, data, start, count, landing=landing, frames=frames)
            else:
                frames.append(bytes(data[start:end]))
                start = end
        if start < count:
            head += data[start:count]
        return None

    def _begin(
        self,
        length: int,
        data: memoryview,
        start: int,
        count: int,
        *,
        landing: Landing,
        frames: list[bytes | memoryview],
    ) -> int:
        """A frame of ``length`` bytes whose payload starts at ``data[start]``
        (a large frame, or one not whole in ``data[:count]``): handed out as a
        view of the landing when whole, kept there when it fits, else in a
        buffer of its own; returns where the next frame starts."""
        end = start + length
        if length >= _DIRECT_BYTES:
            total = FRAME_HEADER.size + length
            # The largest of a run of like frames: the landing's size holds
            # still while their sizes vary (each new size would leave the
            # kept buffers too short for it, and make new ones).
            if total > self._expect or total < self._expect >> 1:
                self._expect = total
        if end <= len(data):
            # Where it landed: the landing is the frame's now.
            landing.spend()
            body = data[start:end]
            if end <= count:
                frames.append(body)
                return end
        else:
            # A reused buffer; ``length`` is bounded by max_frame, checked by the caller.
            body = self._server.buffers.take(length)
            body[: count - start] = data[start:count]
        self._got = count - start
        self._body = body
        return count

    def flush(self) -> tuple[bool, str | None]:
        """Sends what waits; returns (everything sent, a reason to close or None)."""
        with self._lock:
            return self._send_pending()

    def _send_pending(self) -> tuple[bool, str | None]:
        """Sends what waits, as far as the socket takes it (the caller holds the
        lock); returns (everything sent, a reason to close or None). On plain
        TCP every waiting piece goes in one ``sendmsg`` (a frame's header and
        small pieces are not a call each)."""
        while self._pending:
            try:
                if not self._tls and len(self._pending) > 1:
                    sent = self._sock.sendmsg(self._pending[:_SEND_PIECES])
                else:
                    sent = self._sock.send(self._pending[0])
            except NOT_NOW:
                return False, None
            except OSError as exc:
                return False, f"send failed: {exc}"
            if not sent:
                return False, None
            self._pending_bytes -= sent
            self._drained.notify_all()
            while sent:
                head = self._pending[0]
                if sent < len(head):
                    self._pending[0] = head[sent:]
                    return False, None
                sent -= len(head)
                self._pending.pop(0)
        return True, None

    def _drop_pending(self) -> None:
        self._pending.clear()
        self._pending_bytes = 0
        self._drained.notify_all()

    @property
    def sock(self) -> socket.socket:
        """The socket (the loop registers it)."""
        return self._sock

    def shutdown(self) -> None:
        """Ends the connection for the peer (any thread; after :meth:`mark_closed`)."""
        with contextlib.suppress(OSError):  # already disconnected
            self._sock.shutdown(socket.SHUT_RDWR)

    def release(self) -> None:
        """Frees the socket (the loop thread, once it forgot the connection)."""
        self._sock.close()


class InProcessConnection(LeaseConnection):
    """A connection from this process (a ``Fleet.local`` learner), in memory.

    Its owner sees what a :class:`DataConnection` offers (``send``,
    ``close``); the learner holds its other end, :attr:`link`. The
    learner's frames reach the peer on the learner's thread, with the
    loop's error rules (:meth:`LeaseDataServer.in_process_frame`).

    Args:
        server: The data port that attached it.
    """

    def __init__(self, server: LeaseDataServer) -> None:
        super().__init__(server, "this process")
        self._frames: queue.SimpleQueue[InProcessFrame | None] = queue.SimpleQueue()
        self.link = InProcessLink(self._frames, self._deliver, self._hung_up)

    def send(self, payload: bytes) -> None:
        """Queues one frame for the learner (any thread, never blocks)."""
        if not self._closed:
            self._frames.put(payload)

    def send_parts(self, parts: Sequence[bytes | memoryview], wait_seconds: float) -> None:
        """Queues one frame of ``parts`` for the learner: a large piece (a result's
        chunk, a view of its receive buffer) as it is, the rest joined
        (:func:`~rlfleet.transport.frame_pieces.frame_of`).

        Raises:
            ConnectionClosedError: If the connection is closed.
        """
        if self._closed:
            raise ConnectionClosedError("the in-process data connection is closed")
        self._frames.put(frame_of(parts))

    def try_send_frames(self, frames: Sequence[Sequence[bytes | memoryview]]) -> Tried:
        """Queues ``frames`` for the learner (:meth:`send_parts` never waits;
        ConnectionClosedError if the connection is closed)."""
        self.send_frames(frames, 0.0)
        return "sent"

    def shutdown(self) -> None:
        """Ends the connection for the learner: its receive returns None."""
        self._frames.put(None)

    def release(self) -> None:
        """Nothing to free: no socket."""

    def _deliver(self, payload: bytes) -> None:
        if self._closed:
            raise ConnectionClosedError(
                "the coordinator closed the in-process lease data connection"
            )
        self._server.in_process_frame(self, payload)

    def _hung_up(self) -> None:
        self._server.close(self, "closed by the peer")


def _coalesced(pieces: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    """``pieces`` with each run of pieces under :data:`_DIRECT_BYTES` joined
    (larger pieces are not copied)."""
    out: list[bytes | memoryview] = []
    small: list[bytes | memoryview] = []
    for piece in pieces:
        if len(piece) < _DIRECT_BYTES:
            small.append(piece)
            continue
        if small:
            out.append(b"".join(small))
            small = []
        out.append(piece)
    if small:
        out.append(b"".join(small))
    return out


def too_long(length: int, max_frame: int) -> str:
    """Why a frame of ``length`` bytes closes its connection."""
    return f"a frame of {length} bytes, above the limit of {max_frame}"
