"""The lease data channel of a learner in the coordinator's own process.

``Fleet.local``'s learner gets an :class:`InProcessLink` where a remote one
dials a socket (rlfleet.transport.lease_channel): the same frames, handed
over in memory, with no socket and no relay thread on the way out.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from rlfleet.errors import ConnectionClosedError, RlfleetTimeoutError
from rlfleet.transport.frame_pieces import FramePieces, InProcessFrame


class InProcessLink:
    """A data connection to the coordinator of this process (``Fleet.local``).

    The same frames as over TCP, handed over in memory: :meth:`send` runs
    the coordinator's handling of the frame on the caller's thread (no
    socket, no wake-up of the relay's loop), and the coordinator's frames
    wait in a queue for :meth:`receive`. Its coordinator side is
    ``rlfleet.coordinator.leases.data_connections.InProcessConnection``, which
    makes it.

    Args:
        frames: Where the coordinator puts its frames, and None once it
            closed the connection.
        deliver: Hands one frame to the coordinator (OSError once closed).
        hang_up: Tells the coordinator that this side closed.
    """

    def __init__(
        self,
        frames: queue.SimpleQueue[InProcessFrame | None],
        deliver: Callable[[bytes], None],
        hang_up: Callable[[], None],
    ) -> None:
        self._frames = frames
        self._deliver = deliver
        self._hang_up = hang_up
        self._ended = False  # the coordinator's end was read
        self._closed = False

    def send(self, payload: bytes) -> None:
        """Hands one frame to the coordinator.

        Raises:
            ConnectionClosedError: If the connection was closed (by either side).
        """
        if self._closed or self._ended:
            raise ConnectionClosedError("the in-process lease data connection is closed")
        self._deliver(payload)

    def receive(self) -> bytes | None:
        """The next frame; None once the coordinator closed the connection."""
        return _whole(self._next(None))

    def receive_within(self, seconds: float) -> bytes | None:
        """:meth:`receive`, waiting at most ``seconds``.

        Raises:
            RlfleetTimeoutError: If no frame came within ``seconds``.
        """
        return _whole(self._next(max(seconds, 0.0)))

    def receive_message(
        self, seconds: float | None, *, gather: int = 0
    ) -> bytes | memoryview | FramePieces | None:
        """:meth:`receive` or :meth:`receive_within`, the frame as the coordinator
        handed it over: its own bytes, or a result's pieces whose chunk is a
        view of the buffer the worker's message was received into (no copy
        at all; ``gather`` changes nothing in memory)."""
        return self._next(None if seconds is None else max(seconds, 0.0))

    def readable(self) -> bool:
        """Whether a frame (or the end) is here already."""
        return self._ended or not self._frames.empty()

    def close(self) -> None:
        """Closes the connection (idempotent); a blocked receive returns None."""
        if self._closed:
            return
        self._closed = True
        self._frames.put(None)  # wakes a receive blocked in another thread
        hang_up, self._hang_up = self._hang_up, _closed_link
        # A closed link keeps nothing of the coordinator's alive (its lease).
        self._deliver = _closed_link
        hang_up()

    def _next(self, seconds: float | None) -> InProcessFrame | None:
        if self._ended:
            return None
        try:
            payload = self._frames.get(timeout=seconds)
        except queue.Empty:
            raise RlfleetTimeoutError(f"no lease data frame within {seconds:g} seconds") from None
        if payload is None:
            self._ended = True
        return payload


def _whole(frame: InProcessFrame | None) -> bytes | None:
    """``frame`` as bytes, for the readers of whole frames (the frames of a
    lease's calls, which come whole: only results come in pieces)."""
    if frame is None or isinstance(frame, bytes):
        return frame
    return frame.joined() if isinstance(frame, FramePieces) else bytes(frame)


def _closed_link(*_: bytes) -> None:
    raise ConnectionClosedError("the in-process lease data connection is closed")
