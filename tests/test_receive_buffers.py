"""ReceiveBuffers (rlfleet/transport/receive_buffers.py): what a frame's
header alone may make a data connection's end commit, and which buffers a
frame may take again."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rlfleet.transport.receive_buffers import ReceiveBuffers


def _resident_mib() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 >> 20


def test_a_frame_past_the_kept_buffers_commits_memory_only_as_its_bytes_arrive() -> None:
    # A peer's header sizes the frame's buffer before any of its bytes came:
    # 4 frames of 256 MiB announced must not make 1 GiB resident.
    buffers = ReceiveBuffers(keep_bytes=1 << 20)
    before = _resident_mib()
    views = [buffers.take(256 << 20) for _ in range(4)]
    assert all(len(view) == 256 << 20 and not view.readonly for view in views)
    assert _resident_mib() - before < 64
    views[0][-3:] = b"end"
    assert bytes(views[0][-3:]) == b"end"


def test_kept_buffers_are_taken_again_once_nothing_views_them() -> None:
    buffers = ReceiveBuffers(keep_bytes=8 << 20)
    first = buffers.take(1 << 20)
    first[:3] = b"abc"
    second = buffers.take(1 << 20)  # the first is still viewed: a new one
    assert buffers.made == 2
    del first, second
    buffers.take(1 << 20)
    assert buffers.made == 2


def test_a_kept_buffer_is_tested_for_views_with_no_reallocation() -> None:
    # Whether a kept buffer is free is tested by a resize a byte up and back:
    # a buffer made with no room for that byte would reallocate its whole
    # length the first time (the allocation grows), into fresh memory.
    buffers = ReceiveBuffers(keep_bytes=8 << 20)
    view = buffers.take(256 << 10)
    assert isinstance(view.obj, bytearray) and len(view.obj) == 256 << 10
    kept, made = id(view.obj), sys.getsizeof(view.obj)
    del view
    again = buffers.take(256 << 10)  # tests the first for views
    assert id(again.obj) == kept and buffers.made == 1
    assert isinstance(again.obj, bytearray) and len(again.obj) == 256 << 10
    assert sys.getsizeof(again.obj) == made


def test_a_frame_takes_a_free_buffer_past_others_still_viewed() -> None:
    # Frames are let go about in order, not quite (a lane lagging another):
    # the frames in flight still viewed, one let go between them is taken
    # again rather than new memory made.
    buffers = ReceiveBuffers(keep_bytes=8 << 20)
    views = [buffers.take(1 << 20) for _ in range(4)]
    let_go = id(views[1].obj)
    del views[1]
    again = buffers.take(1 << 20)
    assert buffers.made == 4
    assert id(again.obj) == let_go


def test_a_frame_takes_the_free_buffer_taken_most_recently() -> None:
    # The buffer let go last is still in the CPU's caches: a frame takes it,
    # not the one taken longest ago, so a steady run of frames cycles
    # through as few buffers as it holds at once.
    buffers = ReceiveBuffers(keep_bytes=8 << 20)
    views = [buffers.take(1 << 20) for _ in range(4)]
    ids = [id(view.obj) for view in views]
    del views
    taken = []
    for _ in range(6):
        view = buffers.take(1 << 20)
        taken.append(id(view.obj))
        del view
    assert taken == [ids[3]] * 6
    assert buffers.made == 4


def test_frames_grown_past_the_bound_free_the_buffers_too_short_for_them() -> None:
    # Results grew (25 frames each, then 125): the kept buffers too short for
    # the new frames and not viewed are let go to keep ones of the new size,
    # rather than each new frame getting fresh memory; a viewed one stays.
    buffers = ReceiveBuffers(keep_bytes=4 << 20)
    short = [buffers.take(1 << 20) for _ in range(4)]
    held = short.pop(0)
    del short
    made = buffers.made
    for _ in range(4):
        view = buffers.take(2 << 20)
        view[-1:] = b"x"
        del view
    assert buffers.made == made + 1  # one kept buffer of the new size, taken again
    assert [b is held.obj for b in buffers._buffers] == [True, False]


#: Whatever may keep a frame's bytes past its view: a slice, a cast, a
#: parsed result's arrays (and a view of those), the buffer itself.
HOLDERS: dict[str, Callable[[memoryview], Any]] = {
    "a slice": lambda view: view[8:16],
    "a slice of a slice": lambda view: view[4:][4:],
    "a cast": lambda view: view.cast("d"),
    "an array": lambda view: np.frombuffer(view, np.float32, 10, 4),
    "an array's view": lambda view: np.frombuffer(view, np.uint8)[::2],
    "a view of an array": lambda view: np.frombuffer(view, np.uint8).data,
    "the buffer": lambda view: view.obj,
}


@pytest.mark.parametrize("holder", HOLDERS.values(), ids=HOLDERS.keys())
def test_a_buffer_held_by_anything_made_from_its_frame_is_not_taken_again(
    holder: Callable[[memoryview], Any],
) -> None:
    buffers = ReceiveBuffers(keep_bytes=8 << 20)
    view = buffers.take(1 << 20)
    view[:] = b"\1" * len(view)
    held = holder(view)
    first = id(view.obj)
    del view
    others = []
    for _ in range(3):  # the held buffer is passed over each time
        other = buffers.take(1 << 20)
        assert id(other.obj) != first
        other[:] = b"\2" * len(other)
        others.append(other)
    del other
    assert np.asarray(held).tobytes()[:8] == b"\1" * 8
    others.pop()  # one free besides the held one
    made = buffers.made
    spare = buffers.take(1 << 20)
    assert id(spare.obj) != first
    del held  # now free: taken again, no new buffer
    assert id(buffers.take(1 << 20).obj) == first
    assert buffers.made == made
