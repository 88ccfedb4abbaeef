"""Buffers that large frames are received into, reused once nothing views them.

On these VMs the first touch of fresh memory costs far more than the copy
that fills it: 900 kB frames written into new ``bytearray``\\ s took 580-600 us
each, into this class's buffers 63-76 us (thread CPU, 50 frames held at
once; docs/data_plane.md, "Receive buffers"). Both ends of a data
connection read large frames into a :class:`ReceiveBuffers`' buffers: the
coordinator's loop (a worker's results, until they are checked and
forwarded) and a learner's results connection (an answer's results, until
they are placed in the answer). A learner's sampler also makes its
answers' large arrays in a :class:`ReceiveBuffers`' buffers
(:meth:`ReceiveBuffers.array`): an answer the learner let go lends its
memory, already touched, to a later one.

A frame is handed out as a writable view of a kept buffer. Whatever keeps the
frame's bytes (a parsed result's arrays, a queued frame, the rest of a send,
an in-process learner's answer) holds a view of that buffer, and a
``bytearray`` with views cannot be resized: that is the test of a buffer
free to take again (:func:`_unviewed`), so a buffer is never written while
anything reads it. A frame takes the free buffer taken most recently,
looking from the newest past those still viewed (the frames in flight):
the one let go last, whose memory is still in the CPU's caches. Taking the
one taken longest ago instead cycles through every kept buffer, and the
receive copy then writes memory the caches lost: a 705 kB ``recv_into``
took 59-62 us of thread CPU into one of 2 buffers in turn, 140-143 into
one of 20 (docs/data_plane.md, "Receive buffers"). A new buffer is made
only when every kept one looked at is viewed; a buffer anything refers to
besides the kept list (a view does) is passed over without trying to
resize it, which costs an exception.

A frame that finds no free kept buffer once the kept ones reach their bound
first frees the kept buffers too short for it that nothing views (frames
grew: room for buffers of the size now coming), else gets memory of its
own from malloc, not zeroed, whose fresh pages the kernel commits only as
the frame's bytes arrive: a peer's header alone commits nothing past the
bound.
"""

from __future__ import annotations

import math
import sys
import threading

import numpy as np

#: Frames of at least this many bytes are worth a kept buffer (smaller ones
#: come from malloc's own reused small blocks as cheaply).
LARGE_FRAME_BYTES = 64 << 10
#: Bytes of answers' arrays a learner's sampler keeps to take again once
#: they are let go (past it, an answer's arrays are new memory): about two
#: native answers of 200,000 CartPole steps, or one of 4,000 Atari-sized frames.
ANSWER_KEPT_BYTES = 128 << 20
#: Kept buffers looked at, from the one taken most recently, before a new one
#: is made (a viewed one costs a fraction of a microsecond): up to this many
#: frames still held by lanes behind the loop cost a new frame no new memory.
_LOOK = 64


class ReceiveBuffers:
    """Reused buffers for received frames, at most ``keep_bytes`` of them kept.

    Args:
        keep_bytes: The kept buffers' bytes at most; a frame that finds no
            free buffer past it gets one of its own, freed with it.
    """

    def __init__(self, keep_bytes: int) -> None:
        self._keep = keep_bytes
        self._kept = 0
        # Oldest taken first: a buffer taken again moves to the end.
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()
        self.made = 0  # buffers made (kept or not): what reuse saves shows here

    def take(self, size: int) -> memoryview:
        """A writable view of ``size`` bytes that nothing else views.

        The caller bounds ``size`` (a frame's length, checked against the
        connection's limit first).
        """
        with self._lock:
            buffers = self._buffers
            count = len(buffers)
            for index in range(count - 1, max(count - _LOOK, 0) - 1, -1):
                if len(buffers[index]) >= size and _unviewed(buffers, index):
                    buffer = buffers.pop(index)
                    buffers.append(buffer)
                    return memoryview(buffer)[:size]
            self.made += 1
            # Rounded up, so that later frames a little longer fit too.
            grain = LARGE_FRAME_BYTES
            rounded = -(-size // grain) * grain
            if self._kept + rounded > self._keep:
                self._free_shorter(size)
            if self._kept + rounded > self._keep:
                # Not kept: malloc's memory, not zeroed, so fresh pages are
                # committed only as the frame's bytes arrive (a bytearray
                # zero-fills all of them at once: a header alone would commit
                # the frame's whole length), and memory freed by earlier frames
                # is reused warm.
                return memoryview(np.empty(size, np.uint8).data)
            # A byte of room past its length: the resize that tests it for
            # views (_unviewed: a byte more, then back) then moves nothing,
            # where a bytearray made full reallocates for it, remapping or
            # copying its whole length into fresh memory (10-60 us for 256 KiB).
            buffer = bytearray(rounded + 1)
            buffer.pop()
            self._kept += rounded
            buffers.append(buffer)
        return memoryview(buffer)[:size]

    def _free_shorter(self, size: int) -> None:
        """Forgets the kept buffers shorter than ``size`` that nothing views (the
        caller holds the lock): no frame of this size can take them."""
        buffers = self._buffers
        for index in range(len(buffers) - 1, -1, -1):
            if len(buffers[index]) < size and _unviewed(buffers, index):
                self._kept -= len(buffers.pop(index))

    def array(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A new writable, C-contiguous array that nothing else views
        (``np.empty``'s arguments): a view of a kept buffer when it is large,
        so that a learner's answers, let go in turn, take memory already
        touched (rlfleet.wire.placement)."""
        dtype = np.dtype(dtype)
        size = int(math.prod(shape)) * dtype.itemsize  # np.prod's wrapper: 10x the cost
        if size < LARGE_FRAME_BYTES or dtype.hasobject:
            return np.empty(shape, dtype)
        return np.frombuffer(self.take(size), dtype).reshape(shape)


def _references(buffers: list[bytearray], index: int) -> int:
    """``buffers[index]``'s reference count, as this call sees it."""
    return sys.getrefcount(buffers[index])


#: :func:`_references` of a buffer that only its list refers to.
_ALONE = _references([bytearray(1)], 0)


def _unviewed(buffers: list[bytearray], index: int) -> bool:
    """Whether nothing views ``buffers[index]`` (a bytearray with views cannot
    be resized). A view refers to its buffer, so a buffer referred to from
    anywhere but its list is taken for viewed without the resize that
    would raise."""
    if _references(buffers, index) > _ALONE:
        return False
    buffer = buffers[index]
    try:
        buffer.append(0)
    except BufferError:
        return False
    buffer.pop()
    return True


class Landing:
    """Where a reader's reads land before it knows the frames they hold: a view
    of one of ``buffers``' kept buffers, read into again and again until a
    frame in it is handed out (or kept there to be completed) as a view,
    after which the next read takes another free buffer.

    A large frame that a read finds whole is so handed out where it landed:
    one read and no copy. Only one thread reads into it (the data loop).

    Args:
        buffers: Where its buffers come from.
    """

    def __init__(self, buffers: ReceiveBuffers) -> None:
        self._buffers = buffers
        self._view: memoryview | None = None

    def view(self, size: int) -> memoryview:
        """The buffer to read into next, of at least ``size`` bytes (the
        current one if it is that long; nothing else views it either way)."""
        view = self._view
        if view is None or len(view) < size:
            # Let go first: the old buffer, unviewed, may be the one taken.
            self._view = view = None
            # The whole buffer (``take`` views ``size`` bytes of it): a
            # buffer rounded up holds a little more of what follows.
            view = self._view = memoryview(self._buffers.take(size).obj)
        return view

    def spend(self) -> None:
        """A frame keeps a view of the current buffer: the next read takes another."""
        self._view = None
