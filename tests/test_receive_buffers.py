"""ReceiveBuffers (rlfleet/transport/receive_buffers.py): what a frame's
header alone may make a data connection's end commit."""

from __future__ import annotations

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
