"""The coordinator's side of the lease data channel: one selector loop.

Learners (per lease, and one results connection per sampler) and workers
(per Join session) dial this TCP port
with a ticket the coordinator gave them over their authenticated gRPC
stream (leases.proto, "The lease data channel"). A short-lived thread per
new connection does the TLS handshake and reads the ticket; from then on one
thread serves every connection: a ``selectors`` loop over non-blocking
sockets that cuts frames with ``struct`` and hands the frames of each
wake-up straight to its connection's :class:`LeaseDataPeer`, in one call
(no queue, no thread hand-off).
Sends come from any thread and go straight to the socket; only what the
kernel does not take at once waits for the loop, except a learner's result
frames on plain TCP, which their sender finishes itself
(``DataConnection.send_parts``).

A learner in this very process (``Fleet.local``) presents its ticket to
:meth:`LeaseDataServer.attach_in_process` instead of dialling: an
:class:`InProcessConnection` hands its frames over in memory, the learner's
on the learner's own thread (rlfleet.transport.in_process_link.InProcessLink).

The connections themselves are data_connections.py's. This module knows
bytes only; face.py, data_peers.py and rlfleet.coordinator.result_channels
say what a ticket's connection means.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import selectors
import socket
import threading
from collections.abc import Callable

from rlfleet._util.log_limit import LogLimiter, held_back_note
from rlfleet.coordinator.leases.data_connections import (
    NOT_NOW,
    Attach,
    DataConnection,
    InProcessConnection,
    LeaseConnection,
    too_long,
)
from rlfleet.coordinator.leases.data_hello import HandshakeDeadline, read_hello, tls_handshake
from rlfleet.errors import (
    RlfleetError,
    UnavailableError,
)
from rlfleet.security import ServerTLS
from rlfleet.transport.in_process_link import InProcessLink
from rlfleet.transport.lease_channel import frame
from rlfleet.transport.receive_buffers import Landing, ReceiveBuffers

logger = logging.getLogger("rlfleet.coordinator")

#: Connections in their handshake at once (each holds a thread for at most
#: the handshake timeout); more are refused at once.
_MAX_HANDSHAKES = 64
#: Bytes of receive buffers the loop keeps for reuse (frames in flight from
#: workers to learners; more are made, and freed, when they are all in use).
_KEPT_BYTES = 64 << 20
#: Frames of the largest size a connection may have waiting to be sent.
_PENDING_FRAMES = 4


class LeaseDataServer:
    """The data port: tickets, handshakes and the selector loop.

    Args:
        listen: ``HOST:PORT`` to bind (port 0 picks a free port).
        tls: The fleet's TLS credentials (mTLS when they require client
            certificates), or None for plaintext.
        max_frame_bytes: Longest frame accepted (the fleet's max message size).
        handshake_timeout: Seconds a new connection has for TLS and its ticket.
        parse_hello: The ticket of a serialized LeaseDataHello (raises
            ValueError for one that does not parse).
        on_connection: Called with ``"accepted"`` or ``"refused"`` (metrics).

    Raises:
        OSError: If the address cannot be bound.
    """

    def __init__(
        self,
        listen: str,
        *,
        tls: ServerTLS | None,
        max_frame_bytes: int,
        handshake_timeout: float,
        parse_hello: Callable[[bytes], bytes],
        on_connection: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        host, _, port = listen.rpartition(":")
        host = host.strip("[]")
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        # A restarted coordinator rebinds at once, past its old connections'
        # TIME_WAIT (as gRPC's port does); SO_REUSEPORT stays off.
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, int(port)))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self.port: int = self._listener.getsockname()[1]
        self._tls = tls.ssl_context() if tls is not None else None
        self._max_frame = max_frame_bytes
        self._handshake_timeout = handshake_timeout
        self._parse_hello = parse_hello
        self._on_connection = on_connection
        self._tickets: dict[bytes, Attach] = {}
        self._tickets_lock = threading.Lock()
        self._refusals = LogLimiter()
        self._handshakes = threading.BoundedSemaphore(_MAX_HANDSHAKES)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._orders: queue.SimpleQueue[tuple[str, LeaseConnection, str]] = queue.SimpleQueue()
        #: What after_wake_up was asked on the loop thread during its current wake-up.
        self._hand_overs: list[Callable[[], None]] = []
        self._connections: set[LeaseConnection] = set()
        #: What large frames are read into (only the loop reads): a frame's
        #: buffer is reused once nothing views it.
        self.buffers = ReceiveBuffers(_KEPT_BYTES)
        # Where reads land (recv(256 KiB) allocated 256 KiB per read, which a
        # thread's malloc arena mapped and unmapped: ~12 us a read): one of
        # those buffers, until a large frame read whole in it is handed out.
        self._landing = Landing(self.buffers)
        self._stopped = threading.Event()
        self._loop = threading.Thread(target=self._run, name="rlfleet-data-loop", daemon=True)
        self._loop.start()
        self._acceptor = threading.Thread(
            target=self._accept, name="rlfleet-data-accept", daemon=True
        )
        self._acceptor.start()
        logger.info("serving the lease data channel on %s:%d", host, self.port)

    # --- tickets ---------------------------------------------------------------------

    def issue(self, attach: Attach) -> bytes:
        """A new single-use ticket; presenting it calls ``attach`` with the connection."""
        ticket = secrets.token_bytes(32)
        with self._tickets_lock:
            self._tickets[ticket] = attach
        return ticket

    def revoke(self, ticket: bytes) -> None:
        """Forgets a ticket not presented yet (its lease or session ended)."""
        with self._tickets_lock:
            self._tickets.pop(ticket, None)

    # --- connections -------------------------------------------------------------------

    def want_write(self, connection: LeaseConnection) -> None:
        """Asks the loop to send what ``connection`` could not send at once."""
        self._order("write", connection)

    def close(self, connection: LeaseConnection, reason: str) -> None:
        """Closes a connection (any thread, any lock held); its peer hears
        ``on_closed(reason)`` from the loop thread, never from the caller's."""
        if not connection.mark_closed():
            return
        connection.shutdown()
        self._order("close", connection, reason)

    def after_wake_up(self, hand_over: Callable[[], None]) -> None:
        """Runs ``hand_over`` once the loop served every connection ready in
        its current wake-up, just before it waits again (called on the loop
        thread), or at once (on any other thread).

        A thread woken while the loop still runs the rest of its wake-up
        finds the interpreter's lock taken and waits for it, then passes it
        back and forth with the loop at each of the loop's reads: woken when
        the loop is about to wait, it runs at once. Hand-overs run in the
        order they were asked.
        """
        if threading.get_ident() == self._loop.ident:
            self._hand_overs.append(hand_over)
        else:
            hand_over()

    def stop(self) -> None:
        """Closes the port and every connection."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        for connection in list(self._connections):
            self.close(connection, "the coordinator is shutting down")
        with contextlib.suppress(OSError):  # not connected: close() below still wakes accept()
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._wake()
        self._loop.join(5.0)

    def _order(self, what: str, connection: LeaseConnection, reason: str = "") -> None:
        self._orders.put((what, connection, reason))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(
            OSError
        ):  # the pipe is full (the loop will wake anyway) or closed (stopped)
            self._wake_w.send(b"\0")

    # --- the acceptor and handshakes ------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, address = self._listener.accept()
            except OSError:
                return  # the listener was closed (stop)
            where = f"{address[0]}:{address[1]}"
            # Anyone who reaches the port can open connections that never
            # say hello: at most this many threads wait for them at once.
            if not self._handshakes.acquire(blocking=False):
                self._refuse(sock, where, f"{_MAX_HANDSHAKES} connections are in their handshake")
                continue
            threading.Thread(
                target=self._handshake, args=(sock, where), name="rlfleet-data-hello", daemon=True
            ).start()

    def _handshake(self, sock: socket.socket, where: str) -> None:
        """TLS, the ticket frame and the answer; then the loop serves it."""
        try:
            self._attach(sock, where)
        finally:
            self._handshakes.release()

    def _attach(self, sock: socket.socket, where: str) -> None:
        # One deadline for TLS, the ticket and the answer together: a peer
        # trickling a byte at a time must not renew a per-recv timeout.
        deadline = HandshakeDeadline(self._handshake_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = tls_handshake(self._tls, sock, deadline)
            hello = read_hello(sock, deadline)
            attach = self._take(hello)
        except (OSError, ValueError) as exc:
            self._refuse(sock, where, f"{type(exc).__name__}: {exc}")
            return
        if attach is None:
            self._refuse(sock, where, "an unknown, used or revoked ticket")
            return
        self._on_connection("accepted")
        connection = DataConnection(sock, self, where, _PENDING_FRAMES * self._max_frame)
        try:
            # LeaseDataAccepted (no fields) before anything attach may send.
            sock.settimeout(deadline.remaining())
            sock.sendall(frame(b""))
            sock.setblocking(False)
            connection.peer = attach(connection)
        except Exception as exc:  # the ticket's owner is gone, or the socket broke
            logger.info("lease data connection from %s not attached: %s", where, exc)
            connection.mark_closed()
            sock.close()
            return
        self._order("add", connection)

    def attach_in_process(self, hello: bytes) -> InProcessLink:
        """Attaches a learner of this process that presents its ticket (in
        ``hello``, a serialized LeaseDataHello) without dialling.

        Returns:
            The learner's end of an :class:`InProcessConnection`.

        Raises:
            UnavailableError: When the port was stopped, for an unknown, used
                or revoked ticket, or when its owner is gone.
        """
        if self._stopped.is_set():
            raise UnavailableError("the coordinator's lease data channel is stopped")
        try:
            attach = self._take(hello)
        except ValueError as exc:
            attach, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = "an unknown, used or revoked ticket"
        if attach is None:
            self._on_connection("refused")
            raise UnavailableError(f"the coordinator refused an in-process data connection: {why}")
        self._on_connection("accepted")
        connection = InProcessConnection(self)
        try:
            connection.peer = attach(connection)
        except Exception as exc:  # the ticket's owner is gone
            connection.mark_closed()
            raise UnavailableError(f"in-process data connection not attached: {exc}") from None
        self._order("add", connection)
        return connection.link

    def in_process_frame(self, connection: InProcessConnection, payload: bytes) -> None:
        """One frame of an in-process connection, on its sender's thread: handed
        to the peer with the loop's rules (too long, bad input or a handler's
        bug closes the connection)."""
        peer = connection.peer
        if peer is None:
            return
        reason: str | None
        if len(payload) > self._max_frame:
            reason = too_long(len(payload), self._max_frame)
        else:
            reason = _handled(connection, peer.on_frames, [payload])
        if reason is not None:
            self.close(connection, reason)

    def _take(self, hello: bytes) -> Attach | None:
        ticket = self._parse_hello(hello)
        with self._tickets_lock:
            return self._tickets.pop(ticket, None)

    def _refuse(self, sock: socket.socket, where: str, why: str) -> None:
        self._on_connection("refused")
        held_back = self._refusals.admit()
        if held_back is not None:
            logger.warning(
                "refused a lease data connection from %s: %s%s",
                where,
                why,
                held_back_note(held_back, "refusals"),
            )
        sock.close()

    # --- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        selector = self._selector
        while not self._stopped.is_set():
            for key, events in selector.select():
                try:
                    if key.fileobj is self._wake_r:
                        self._run_orders()
                    else:
                        self._serve(key.data, events)
                except Exception:  # a bug must not stop every lease's traffic
                    logger.exception("the lease data loop failed on one event; going on")
            if self._hand_overs:
                self._hand_over()
        self._hand_over()  # what the last wake-up asked
        for connection in list(self._connections):
            self._forget(connection)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _hand_over(self) -> None:
        hand_overs, self._hand_overs = self._hand_overs, []
        for hand_over in hand_overs:
            try:
                hand_over()
            except Exception:  # one owner's bug must not stop the others' hand-overs
                logger.exception("the lease data loop failed on one hand-over; going on")

    def _serve(self, connection: DataConnection, events: int) -> None:
        """One connection's readiness (a method, so that no frame of the loop keeps
        a closed connection, and its lease, alive while the loop waits)."""
        reason = None
        if events & selectors.EVENT_WRITE:
            done, reason = connection.flush()
            if done and reason is None:
                self._watch(connection, selectors.EVENT_READ)
        if reason is None and events & selectors.EVENT_READ:
            reason = _handled(connection, connection.read, self._max_frame, self._landing)
        if reason is not None:
            self.close(connection, reason)

    def _run_orders(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except NOT_NOW:
            pass
        while True:
            try:
                what, connection, reason = self._orders.get_nowait()
            except queue.Empty:
                return
            if what == "add":
                if connection.closed:
                    continue  # closed before it joined the loop: its "close" came first
                self._connections.add(connection)
                if isinstance(connection, DataConnection):
                    # WRITE too: frames sent before it joined may wait in its buffer.
                    events = selectors.EVENT_READ | selectors.EVENT_WRITE
                    self._selector.register(connection.sock, events, connection)
            elif (
                what == "write"
                and isinstance(connection, DataConnection)
                and connection in self._connections
            ):
                self._watch(connection, selectors.EVENT_READ | selectors.EVENT_WRITE)
            elif what == "close":
                self._forget(connection)
                if connection.peer is not None:
                    try:
                        connection.peer.on_closed(reason)
                    except Exception:  # one owner's bug must not stop the loop
                        logger.exception("closing lease data connection %s", connection.what)

    def _watch(self, connection: DataConnection, events: int) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):  # closed meanwhile
            self._selector.modify(connection.sock, events, connection)

    def _forget(self, connection: LeaseConnection) -> None:
        if connection in self._connections:
            self._connections.discard(connection)
            if isinstance(connection, DataConnection):
                with contextlib.suppress(KeyError, ValueError, OSError):  # already gone
                    self._selector.unregister(connection.sock)
        connection.release()


def _handled(
    connection: LeaseConnection, handle: Callable[..., str | None], *args: object
) -> str | None:
    """Runs ``handle`` on a connection's frames: the reason to close it, or None.

    Bad input from the peer (an RlfleetError) ends its connection with the
    error's message; any other exception is a handler's bug, logged, and ends
    that connection only, never the loop.
    """
    try:
        return handle(*args)
    except RlfleetError as exc:
        return str(exc)
    except Exception as exc:
        logger.exception("lease data connection %s failed", connection.what)
        return f"coordinator error: {exc!r}"
