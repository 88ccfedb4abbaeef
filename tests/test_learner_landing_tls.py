"""A learner's results connection over TLS takes the landing too
(``LeaseDataLink.receive_message``): each SSL read lands in a kept buffer,
and every whole frame in it is handed out as a view of it.

Real TLS on loopback (a socket pair, each end wrapped, the coordinator's end
writing the bytes as the tests cut them: each cut ends a TLS record). A read
takes at most one record's decrypted bytes, and what a record holds past the
room given stays in OpenSSL, which ``poll`` does not see: the reader takes it
without waiting. Frames reach the reader whole and in order wherever records
cut them, several of a record's frames with one SSL read, no handed-out frame
is written over, and waits and closes fail with the texts they have over TCP.
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import ConnectionClosedError, ProtocolError, RlfleetTimeoutError
from rlfleet.security import ClientTLS, ServerTLS
from rlfleet.transport import lease_channel
from rlfleet.transport.lease_channel import LeaseDataLink, frame
from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES
from tests.tls_fixtures import make_ca, make_cert

pytestmark = pytest.mark.timeout(120)

_CA = make_ca()
_SERVER = make_cert(_CA, "coordinator")
_SERVER_TLS = ServerTLS(_SERVER.cert_pem, _SERVER.key_pem)
_CLIENT_TLS = ClientTLS(_CA.cert_pem)


class _Counted(ssl.SSLSocket):
    """An SSL socket that counts its ``recv_into`` calls (SSL reads)."""

    reads = 0

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        type(self).reads += 1
        return super().recv_into(*args, **kwargs)


@contextmanager
def _tls_pair(counted: bool = False) -> Iterator[tuple[ssl.SSLSocket, ssl.SSLSocket]]:
    """(learner's end, coordinator's end) of a TLS connection on a socket pair,
    past the handshake; the learner's end blocking, as ``dial`` leaves it."""
    ours, theirs = socket.socketpair()
    client = _CLIENT_TLS.ssl_context()
    if counted:
        _Counted.reads = 0
        client.sslsocket_class = _Counted
    server_side: dict[str, ssl.SSLSocket] = {}

    def accept() -> None:
        server_side["sock"] = _SERVER_TLS.ssl_context().wrap_socket(theirs, server_side=True)

    accepting = threading.Thread(target=accept)
    accepting.start()
    learner = client.wrap_socket(ours, server_hostname="localhost")
    accepting.join(30)
    learner.settimeout(None)
    try:
        yield learner, server_side["sock"]
    finally:
        learner.close()
        server_side["sock"].close()


def _send_in_thread(sock: ssl.SSLSocket, pieces: Sequence[bytes], close: bool) -> threading.Thread:
    """Writes each piece with its own ``sendall`` (its own TLS records) from a
    thread, then closes ``sock`` if ``close``."""

    def send() -> None:
        for piece in pieces:
            sock.sendall(piece)
        if close:
            sock.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


_sizes = st.one_of(
    st.integers(0, 40_000), st.integers(LARGE_FRAME_BYTES - 4, 3 * LARGE_FRAME_BYTES + 7)
)


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(_sizes, min_size=1, max_size=10),
    cuts=st.lists(st.integers(1, 1 << 20), max_size=30),
    landing=st.sampled_from([64, 4096, lease_channel.LANDING_BYTES]),
    deadline=st.sampled_from([None, 30.0]),
)
def test_frames_cut_anywhere_across_tls_records_reach_the_reader_whole_and_in_order(
    sizes: list[int], cuts: list[int], landing: int, deadline: float | None
) -> None:
    payloads = [bytes([k % 251 + 1]) * size for k, size in enumerate(sizes)]
    data = b"".join(frame(p) for p in payloads)
    ends = sorted({c % len(data) for c in cuts} - {0} | {len(data)})
    pieces = [data[a:b] for a, b in zip([0, *ends], ends, strict=False)]
    with _tls_pair() as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 22)
        link._land_bytes = landing
        sending = _send_in_thread(theirs, pieces, close=True)
        held = [link.receive_message(deadline) for _ in payloads]
        assert link.receive_message(deadline) is None  # the end, between frames
        sending.join(30)
        got = [None if g is None else bytes(g) for g in held]
    # Every frame is still held: none was written over by a later read.
    assert got == payloads


def test_a_records_frames_are_handed_out_from_one_ssl_read() -> None:
    payloads = [bytes([k]) * 100 for k in range(1, 51)]
    with _tls_pair(counted=True) as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 20)
        theirs.sendall(b"".join(frame(p) for p in payloads))  # one record of 5,200 bytes
        got = [bytes(link.receive_message(10.0) or b"") for _ in payloads]
        assert got == payloads
        assert _Counted.reads == 1


def test_bytes_left_in_openssl_past_a_reads_room_are_read_without_waiting() -> None:
    # A large frame whose last record also holds a small frame: the large
    # frame's last read takes only its own bytes, the small frame stays in
    # OpenSSL, not the socket, and nothing more comes. A wait for the socket
    # would last the whole deadline.
    # Longer than the first landing (a buffer of its own); ends 104 bytes
    # into a 16 KiB record.
    large = b"L" * (2 * lease_channel.LANDING_BYTES + 100)
    with _tls_pair() as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 22)
        sending = _send_in_thread(theirs, [frame(large) + frame(b"b" * 40)], close=False)
        assert bytes(link.receive_message(5.0) or b"") == large
        sending.join(30)
        assert link._hi == link._lo and ours.pending() == 44  # all of it in OpenSSL
        assert link.readable()
        assert bytes(link.receive_message(2.0) or b"") == b"b" * 40
        with pytest.raises(RlfleetTimeoutError, match=r"^no whole data frame within 0\.2 seconds$"):
            link.receive_message(0.2)


def test_a_large_frame_and_the_frames_behind_it_in_its_last_record_come_whole() -> None:
    large = b"L" * (3 * LARGE_FRAME_BYTES + 5)
    with _tls_pair() as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 22)
        data = frame(b"s" * 10) + frame(large) + frame(b"t" * 20) + frame(b"u" * 30)
        sending = _send_in_thread(theirs, [data], close=False)
        first = link.receive_message(10.0)
        second = link.receive_message(10.0)
        third = link.receive_message(10.0)
        fourth = link.receive_message(10.0)
        sending.join(30)
        assert [bytes(f or b"") for f in (first, second, third, fourth)] == [
            b"s" * 10,
            large,
            b"t" * 20,
            b"u" * 30,
        ]


def test_a_tls_landing_holding_a_viewed_frame_is_not_written_over() -> None:
    with _tls_pair() as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 20)
        link._land_bytes = LARGE_FRAME_BYTES  # the least kept buffer: several taken below
        # Each record ends inside the next frame's header.
        theirs.sendall(frame(b"\x01" * 1000) + b"\x00\x00")
        first = link.receive_message(10.0)
        assert first is not None and bytes(first) == b"\x01" * 1000
        for k in range(2, 400):  # many landings' worth, read while ``first`` is held
            theirs.sendall(b"\x03\xe8" + bytes([k % 256]) * 1000 + b"\x00\x00")
            got = link.receive_message(10.0)
            assert got is not None and got == bytes([k % 256]) * 1000
            assert bytes(first) == b"\x01" * 1000
        # Its landing was left for others, and is not taken again while viewed.
        assert link._land is not None and link._land.obj is not first.obj


def test_a_tls_wait_past_the_deadline_and_a_close_mid_frame_fail_as_over_tcp() -> None:
    with _tls_pair() as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 20)
        # A frame handed out of the landing, then half of the next one.
        theirs.sendall(frame(b"a" * 10) + struct.pack(">I", 3000) + b"b" * 1000)
        assert bytes(link.receive_message(0.2) or b"") == b"a" * 10
        with pytest.raises(RlfleetTimeoutError, match=r"^no whole data frame within 0\.2 seconds$"):
            link.receive_message(0.2)
        assert link.readable()
        theirs.close()
        with pytest.raises(
            ConnectionClosedError, match=r"^the coordinator closed the data connection mid-frame$"
        ):
            link.receive_message(0.2)


def test_a_tls_frame_above_the_limit_behind_frames_in_one_record_is_refused() -> None:
    with _tls_pair() as (ours, theirs):
        link = LeaseDataLink(ours, 1 << 16)
        theirs.sendall(frame(b"a" * 10) + struct.pack(">I", (1 << 16) + 1))
        assert bytes(link.receive_message(1.0) or b"") == b"a" * 10
        with pytest.raises(
            ProtocolError,
            match=r"^the coordinator sent a data frame of 65537 bytes, above the limit of 65536$",
        ):
            link.receive_message(1.0)
