"""A result lane's frames booked on the data loop's thread, and the fallback to its own.

With ``defer`` (a socket's frames, handed over at the end of the loop's
wake-up), the lane books a wake-up's frames on the loop's thread while its
own thread holds nothing of the worker's, and sends each call's results if
the learner's connection takes them at once. A send that cannot go at once
goes to the lane's thread, and every later frame of the worker goes there
behind it until that thread is done: nothing is lost or reordered, and the
loop never waits for a learner. ``ResultLane._book`` is replaced by a
recorder here (the booking itself is tests/test_result_booking.py's).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, cast

import pytest

from rlfleet.coordinator.leases.data_connections import DataConnection
from rlfleet.coordinator.leases.result_lane import _LOOP_BYTES, ResultLane
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.security import InflightBudget
from rlfleet.transport.lease_channel import FRAME_HEADER
from tests.waiting import PATIENCE, wait_until


class _Outbox:
    """A call's outbox whose learner takes results at once only while ``open`` is set."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.sent: list[tuple[str, list[Any]]] = []  # (thread, results) in send order
        self.partly = False  # the socket takes part of a try: its rest is finished later
        self.finished: list[tuple[str, int]] = []  # (thread, results) whose rest went

    def try_send_reserved(self, sender: object, forwards: Sequence[Any]) -> str:
        if not self.open.is_set():
            return "refused"
        self.sent.append((threading.current_thread().name, list(forwards)))
        return "begun" if self.partly else "sent"

    def finish_reserved(self, sender: object, count: int) -> None:
        assert self.open.wait(PATIENCE), "the learner never read again"
        self.finished.append((threading.current_thread().name, count))

    def send_reserved(self, sender: object, forwards: Sequence[Any]) -> None:
        assert self.open.wait(PATIENCE), "the learner never read again"
        self.sent.append((threading.current_thread().name, list(forwards)))


class _Recorded:
    """What the lane's stand-in ``_book`` saw (set on the class, it is called
    without the lane): each batch's thread and frames, in order."""

    def __init__(self, outbox: _Outbox) -> None:
        self.outbox = outbox
        self.booked: list[tuple[str, list[bytes]]] = []

    def book(self, frames: list[bytes], sends: list[Any] | None = None) -> None:
        self.booked.append((threading.current_thread().name, [bytes(f) for f in frames]))
        if sends is None:  # the lane's thread: it sends itself, and may wait
            self.outbox.send_reserved(None, frames)
        else:  # the loop: its caller sends (or hands the send on)
            sends += [(self.outbox, self.outbox, frame) for frame in frames]


@pytest.fixture
def lane(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ResultLane, _Recorded, list[Any]]]:
    """A deferred lane whose hand-overs wait in the list until the test runs them."""
    recorded = _Recorded(_Outbox())
    monkeypatch.setattr(ResultLane, "_book", recorded.book)
    handle = SimpleNamespace(name="w", alive=True, inflight=InflightBudget(64 << 20, "w"))
    asked: list[Callable[[], None]] = []
    lane = ResultLane(
        cast(WorkerEvents, None),
        cast(WorkerHandle, handle),
        threading.Event(),
        limit=64 << 20,
        close=lambda reason: None,
        defer=asked.append,
    )
    try:
        yield lane, recorded, asked
    finally:
        handle.alive = False  # the lane's thread ends at its next look
        recorded.outbox.open.set()


def _wake_up(asked: list[Callable[[], None]], lane: ResultLane, *frames: bytes) -> None:
    """One wake-up of the loop that read ``frames``: queued, then handed over."""
    lane.put_many(list(frames))
    (hand_over,) = asked
    asked.clear()
    hand_over()


def test_a_wake_ups_frames_are_booked_and_sent_on_the_loops_thread(
    lane: tuple[ResultLane, _Recorded, list[Any]],
) -> None:
    lane_, recorded, asked = lane
    here = threading.current_thread().name
    _wake_up(asked, lane_, b"a", b"b")
    _wake_up(asked, lane_, b"c")
    assert recorded.booked == [(here, [b"a", b"b"]), (here, [b"c"])]
    assert recorded.outbox.sent == [(here, [b"a", b"b"]), (here, [b"c"])]
    # The lane's thread was given nothing: it never woke for them.
    assert lane_._queue.empty() and lane_._given == 0
    assert lane_._received.used == 0  # what was read was let go once booked


def test_a_send_the_learner_cannot_take_goes_to_the_lane_and_later_frames_wait_behind_it(
    lane: tuple[ResultLane, _Recorded, list[Any]],
) -> None:
    lane_, recorded, asked = lane
    here, lanes = threading.current_thread().name, "rlfleet-data-results-w"
    outbox = recorded.outbox
    outbox.open.clear()  # the learner stops reading
    _wake_up(asked, lane_, b"a")  # booked here; its send goes to the lane's thread, which waits
    _wake_up(asked, lane_, b"b")  # the lane holds the worker's work: booked there, after it
    assert recorded.booked == [(here, [b"a"])] and outbox.sent == []
    outbox.open.set()  # the learner reads again
    wait_until(lambda: len(outbox.sent) == 2, "the lane's sends")
    assert outbox.sent == [(lanes, [b"a"]), (lanes, [b"b"])]
    assert recorded.booked == [(here, [b"a"]), (lanes, [b"b"])]
    wait_until(lambda: lane_._given == lane_._taken, "the lane's thread done")
    _wake_up(asked, lane_, b"c")  # the lane holds nothing again: the loop books and sends
    assert recorded.booked[-1] == (here, [b"c"]) and outbox.sent[-1] == (here, [b"c"])


def _frames_of(stream: bytes) -> list[bytes]:
    """The payloads of the frames in ``stream``."""
    frames = []
    while stream:
        (length,) = FRAME_HEADER.unpack_from(stream)
        frames.append(stream[FRAME_HEADER.size : FRAME_HEADER.size + length])
        stream = stream[FRAME_HEADER.size + length :]
    return frames


def test_frames_tried_without_waiting_leave_their_rest_to_a_waiting_thread_in_order() -> None:
    """``DataConnection.try_send_frames`` (the loop's send to a learner): what the
    socket does not take at once waits, ahead of anything later, for a thread
    that may wait to ``finish`` it; meanwhile a try sends nothing and says
    so, and a sender that may wait sends behind it. The loop is asked nothing."""
    ours, theirs = socket.socketpair()
    asked: list[object] = []
    server = SimpleNamespace(want_write=asked.append, close=lambda connection, reason: None)
    ours.setblocking(False)
    connection = DataConnection(ours, cast(Any, server), "the learner", 1 << 30)
    try:
        big, small, after = b"\x07" * (8 << 20), b"small", b"after"
        # More than the kernel takes at once: the rest waits for finish().
        assert connection.try_send_frames([[b"head", big]]) == "begun"
        assert connection._pending and asked == []
        assert connection.try_send_frames([[small]]) == "refused"  # nothing goes past the rest
        with ThreadPoolExecutor(2) as pool:
            finished = pool.submit(connection.finish, PATIENCE)
            sent = pool.submit(connection.send_frames, [[after]], PATIENCE)  # waits its turn
            received = bytearray()
            expected = 2 * FRAME_HEADER.size + 4 + len(big) + len(after)
            theirs.settimeout(PATIENCE)
            while len(received) < expected:
                received += theirs.recv(1 << 20)
            finished.result(PATIENCE)
            sent.result(PATIENCE)
        assert _frames_of(bytes(received)) == [b"head" + big, after]
        assert connection.try_send_frames([[small]]) == "sent" and not connection._pending
        assert _frames_of(theirs.recv(64)) == [small]
        assert asked == []
    finally:
        ours.close()
        theirs.close()


def test_the_rest_of_a_send_the_socket_took_in_part_is_finished_on_the_lanes_thread(
    lane: tuple[ResultLane, _Recorded, list[Any]],
) -> None:
    lane_, recorded, asked = lane
    here, lanes = threading.current_thread().name, "rlfleet-data-results-w"
    outbox = recorded.outbox
    outbox.partly = True
    _wake_up(asked, lane_, b"a", b"b")  # booked and begun here; the lane's thread finishes it
    wait_until(lambda: outbox.finished, "the rest sent")
    assert outbox.sent == [(here, [b"a", b"b"])] and outbox.finished == [(lanes, 2)]


def test_a_wake_ups_frames_of_megabytes_are_booked_on_the_lanes_thread(
    lane: tuple[ResultLane, _Recorded, list[Any]],
) -> None:
    lane_, recorded, asked = lane
    lanes = "rlfleet-data-results-w"
    large = b"x" * (_LOOP_BYTES + 1)
    _wake_up(asked, lane_, large)
    wait_until(lambda: recorded.booked, "the lane's booking")
    assert recorded.booked == [(lanes, [large])]
    assert recorded.outbox.sent == [(lanes, [large])]
