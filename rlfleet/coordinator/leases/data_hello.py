"""A lease data connection's handshake: TLS and the ticket frame, within one deadline.

The handshake timeout bounds the whole handshake, not each read: a peer
that trickles its hello a byte at a time is dropped when the timeout ends,
so the bounded handshake slots (data_server.py) free up on time.
"""

from __future__ import annotations

import select
import socket
import ssl
import time

from rlfleet.errors import ConnectionClosedError, RlfleetTimeoutError, WireFormatError
from rlfleet.transport.lease_channel import FRAME_HEADER, HANDSHAKE_FRAME_BYTES


class HandshakeDeadline:
    """The one deadline of a connection's whole handshake.

    Args:
        seconds: The handshake timeout.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left (for the next blocking socket call).

        Raises:
            RlfleetTimeoutError: Once the deadline passed (a TimeoutError, so an OSError).
        """
        left = self._end - time.monotonic()
        if left <= 0:
            raise RlfleetTimeoutError(
                f"no complete LeaseDataHello within the handshake timeout of {self.seconds:g} s "
                "(--handshake-timeout)"
            )
        return left


def tls_handshake(
    context: ssl.SSLContext, sock: socket.socket, deadline: HandshakeDeadline
) -> ssl.SSLSocket:
    """The server's TLS handshake on ``sock``, within ``deadline`` as a whole.

    Raises:
        OSError: The handshake failed or ran out of time (TimeoutError).
    """
    sock.setblocking(False)
    wrapped = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    while True:
        try:
            wrapped.do_handshake()
            return wrapped
        except ssl.SSLWantReadError:
            ready = select.select([wrapped], [], [], deadline.remaining())[0]
        except ssl.SSLWantWriteError:
            ready = select.select([], [wrapped], [], deadline.remaining())[1]
        if not ready:
            deadline.remaining()  # raises once the deadline passed


def read_hello(sock: socket.socket, deadline: HandshakeDeadline) -> bytes:
    """The first frame (a LeaseDataHello's bytes) of a blocking socket, by ``deadline``.

    Raises:
        WireFormatError: For a frame above HANDSHAKE_FRAME_BYTES.
        ConnectionClosedError: For a connection that ended first.
        RlfleetTimeoutError: When the deadline passes first.
    """
    header = _read_exactly(sock, FRAME_HEADER.size, deadline)
    (length,) = FRAME_HEADER.unpack(header)
    if length > HANDSHAKE_FRAME_BYTES:
        raise WireFormatError(f"a first frame of {length} bytes (a LeaseDataHello is tiny)")
    return _read_exactly(sock, length, deadline)


def _read_exactly(sock: socket.socket, count: int, deadline: HandshakeDeadline) -> bytes:
    data = bytearray()
    while len(data) < count:
        sock.settimeout(deadline.remaining())
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionClosedError("the connection ended before its LeaseDataHello")
        data += chunk
    return bytes(data)
