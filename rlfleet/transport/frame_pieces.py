"""A data frame handed over in memory in pieces, its large one not copied.

In ``Fleet.local`` the coordinator hands a learner's results-connection
frames over in memory (rlfleet.transport.in_process_link.InProcessLink). A
result frame's pieces are the result's small head, its chunk's data (a view
of the buffer the worker's message was received into) and the call's
number; joining them would copy the data once more than a socket does. A
:class:`FramePieces` carries them as they are, and the learner reads them
where they lie (rlfleet.wire.result_message.read_result_frame_pieces). The
data's view keeps that receive buffer from being taken again until the
learner lets the result go (rlfleet.transport.receive_buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from rlfleet.transport.receive_buffers import LARGE_FRAME_BYTES


class FramePieces:
    """The frame ``head + data + tail``, not joined.

    Args:
        head: The frame's bytes before ``data``.
        data: Its large piece (a byte view, not copied).
        tail: Its bytes after ``data``.
    """

    __slots__ = ("data", "head", "tail")

    def __init__(self, head: bytes, data: bytes | memoryview, tail: bytes) -> None:
        self.head = head
        self.data = data
        self.tail = tail

    def __len__(self) -> int:
        """The frame's length in bytes, as joined."""
        return len(self.head) + len(self.data) + len(self.tail)

    def joined(self) -> bytes:
        """The frame's bytes in one piece (a copy)."""
        return b"".join((self.head, self.data, self.tail))


def frame_of(pieces: Sequence[bytes | memoryview]) -> bytes | memoryview | FramePieces:
    """The frame of ``pieces`` to hand over in memory: its one non-empty piece as
    it is, its largest piece not copied when it holds
    :data:`~rlfleet.transport.receive_buffers.LARGE_FRAME_BYTES` or more (the
    others joined either side of it, as a socket sends such a piece without
    joining it), else the pieces joined (a copy that costs less than a read
    in pieces)."""
    pieces = [piece for piece in pieces if piece]
    if len(pieces) == 1:
        return pieces[0]
    sizes = [len(piece) for piece in pieces]
    largest = max(range(len(pieces)), key=sizes.__getitem__, default=0)
    if not pieces or sizes[largest] < LARGE_FRAME_BYTES:
        return b"".join(pieces)
    return FramePieces(b"".join(pieces[:largest]), pieces[largest], b"".join(pieces[largest + 1 :]))


#: A frame as the coordinator hands it over in memory.
InProcessFrame: TypeAlias = "bytes | memoryview | FramePieces"

__all__ = ["FramePieces", "InProcessFrame", "frame_of"]
