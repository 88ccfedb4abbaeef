"""A learner's results connection reads many frames per system call
(``LeaseDataLink.receive_message``): each read lands in a kept buffer, and
every whole frame in it is handed out as a view of it. The tests over a
connected socket run over plain TCP and over real TLS (a socket pair; TLS's
own cases: tests/test_learner_landing_tls.py)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import ConnectionClosedError, ProtocolError, RlfleetTimeoutError
from rlfleet.transport import lease_channel
from rlfleet.transport.lease_channel import LeaseDataLink, frame
from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES
from tests.tls_fixtures import tls_socket_pair


class _CutStream:
    """A socket whose reads stop at given offsets of a byte stream, then end:
    a frame cut anywhere across reads, as the kernel may cut it."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        self._data = data
        self._cuts = sorted({c for c in cuts if 0 < c < len(data)} | {len(data)})
        self._at = 0
        self.reads = 0

    def _take(self, room: int) -> bytes:
        self.reads += 1
        stop = next(c for c in self._cuts if c > self._at or c == len(self._data))
        got = self._data[self._at : min(stop, self._at + room)]
        self._at += len(got)
        return got

    def recv_into(self, view: memoryview, size: int, flags: int = 0) -> int:
        got = self._take(size)
        view[: len(got)] = got
        return len(got)

    def recvmsg_into(
        self, views: Any, ancsize: int = 0, flags: int = 0
    ) -> tuple[int, list[Any], int, None]:
        first, then = (memoryview(v) for v in views)
        got = self._take(len(first) + len(then))
        head = min(len(got), len(first))
        first[:head] = got[:head]
        then[: len(got) - head] = got[head:]
        return len(got), [], 0, None

    def recv(self, size: int, flags: int = 0) -> bytes:
        return self._take(size)

    def fileno(self) -> int:
        return -1

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        pass


@contextmanager
def _plain_pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, theirs


@pytest.fixture(params=["tcp", "tls"])
def connected(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the learner's end, the coordinator's end) of a connection."""
    with _plain_pair() if request.param == "tcp" else tls_socket_pair() as pair:
        yield pair


#: Frame sizes: small ones, and large ones about a kept buffer's least.
FRAME_SIZES = st.one_of(
    st.integers(0, 40_000), st.integers(LARGE_FRAME_BYTES - 4, 3 * LARGE_FRAME_BYTES + 7)
)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(FRAME_SIZES, min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 1 << 20), max_size=30),
    landing=st.sampled_from([64, 4096, lease_channel.LANDING_BYTES]),
    deadline=st.sampled_from([None, 30.0]),
)
def test_frames_cut_anywhere_across_reads_reach_the_reader_whole_and_in_order(
    sizes: list[int], cuts: list[int], landing: int, deadline: float | None
) -> None:
    payloads = [bytes([k % 251 + 1]) * size for k, size in enumerate(sizes)]
    data = b"".join(frame(p) for p in payloads)
    stream = _CutStream(data, [c % (len(data) + 1) for c in cuts])
    link = LeaseDataLink(stream, 1 << 22)  # type: ignore[arg-type]
    link._land_bytes = landing
    got = [link.receive_message(deadline) for _ in payloads]
    assert link.receive_message(deadline) is None  # the end, between frames
    # Every frame is still held: none was written over by a later read.
    assert [None if g is None else bytes(g) for g in got] == payloads


def test_a_buffer_holding_a_viewed_frame_is_not_written_over(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = connected
    link = LeaseDataLink(ours, 1 << 20)
    link._land_bytes = LARGE_FRAME_BYTES  # the least kept buffer: several taken below
    try:
        # Each read ends inside the next frame's header.
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
    finally:
        link.close()
        theirs.close()


def test_a_wait_past_the_deadline_and_a_close_mid_frame_fail_as_before(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = connected
    link = LeaseDataLink(ours, 1 << 20)
    try:
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
    finally:
        link.close()


def test_a_large_frame_cut_mid_way_then_closed_is_a_close_mid_frame(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = connected
    link = LeaseDataLink(ours, 1 << 22)
    try:
        theirs.sendall(frame(b"a" * 10) + struct.pack(">I", 1 << 21) + b"b" * 1000)
        assert bytes(link.receive_message(None) or b"") == b"a" * 10
        theirs.close()
        with pytest.raises(ConnectionClosedError, match=r"mid-frame$"):
            link.receive_message(None)
    finally:
        link.close()


def test_a_frame_above_the_limit_behind_frames_in_one_read_is_refused(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    ours, theirs = connected
    link = LeaseDataLink(ours, 1 << 16)
    try:
        theirs.sendall(frame(b"a" * 10) + struct.pack(">I", (1 << 16) + 1))
        assert bytes(link.receive_message(1.0) or b"") == b"a" * 10
        with pytest.raises(
            ProtocolError,
            match=r"^the coordinator sent a data frame of 65537 bytes, above the limit of 65536$",
        ):
            link.receive_message(1.0)
    finally:
        link.close()
        theirs.close()
