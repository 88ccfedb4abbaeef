"""A learner's results connection over TLS takes the landing too
(``LeaseDataLink.receive_message``): each SSL read lands in a kept buffer,
and every whole frame in it is handed out as a view of it.

Real TLS on loopback (a socket pair, each end wrapped, the coordinator's end
writing the bytes as the tests cut them: each cut ends a TLS record). A read
takes at most one record's decrypted bytes, and what a record holds past the
room given stays in OpenSSL, which ``poll`` does not see: the reader takes it
without waiting. Frames reach the reader whole and in order wherever records
cut them, and several of a record's frames come with one SSL read.
tests/test_learner_landing.py runs its connected-socket cases (no frame
written over while viewed, waits, closes and frames over the limit failing
with their texts) over TLS too.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import RlfleetTimeoutError
from rlfleet.transport import lease_channel
from rlfleet.transport.lease_channel import LeaseDataLink, frame
from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES
from tests.test_learner_landing import FRAME_SIZES
from tests.tls_fixtures import tls_socket_pair

pytestmark = pytest.mark.timeout(120)


class _Counted(ssl.SSLSocket):
    """An SSL socket that counts its ``recv_into`` calls (SSL reads)."""

    reads = 0

    def recv_into(self, *args: Any, **kwargs: Any) -> int:
        type(self).reads += 1
        return super().recv_into(*args, **kwargs)


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


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(FRAME_SIZES, min_size=1, max_size=10),
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
    with tls_socket_pair() as (ours, theirs):
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
    _Counted.reads = 0
    with tls_socket_pair(_Counted) as (ours, theirs):
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
    with tls_socket_pair() as (ours, theirs):
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
    with tls_socket_pair() as (ours, theirs):
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
