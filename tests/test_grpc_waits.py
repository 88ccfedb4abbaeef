"""grpcio's waits off the main thread without 0.1 s polls (``rpc.install_long_waits``)."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable

import grpc
import pytest
from grpc import _common

from rlfleet.transport import rpc as _rpc
from rlfleet.worker._connection import Incoming, JoinStream
from tests.test_remote_worker import ScriptedCoordinator, scripted, welcome

__all__ = ["scripted"]

pytestmark = pytest.mark.timeout(60)


def voluntary_switches(native_id: int) -> int:
    """A thread of this process's voluntary context switches so far (Linux)."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def wake_ups_in_a_second(thread: threading.Thread) -> int:
    """A waiting thread's voluntary context switches over one second (Linux)."""
    assert thread.native_id is not None
    time.sleep(0.2)
    before = voluntary_switches(thread.native_id)
    time.sleep(1.0)
    return voluntary_switches(thread.native_id) - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_join_streams_receiver_sleeps_while_no_message_comes(
    scripted: ScriptedCoordinator,
) -> None:
    # Each wake-up of the receiver takes the GIL from a worker's stepping
    # thread; grpcio's own wait wakes it ten times a second to look for
    # signals, which only the main thread runs.
    channel = _rpc.open_channel(scripted.address)
    inbox: queue.SimpleQueue[Incoming] = queue.SimpleQueue()
    stream = JoinStream(channel, inbox)
    try:
        connection = scripted.accept()
        welcome(connection)
        assert inbox.get(timeout=30) is not None  # the receiver is back in its wait
        receiver = stream._receiver  # this stream's, not another test's
        assert receiver.name == "rlfleet-worker-receiver"
        woke = wake_ups_in_a_second(receiver)
        assert woke <= 2, f"the receiver woke {woke} times in a second of silence"
        welcome(connection)  # and a message still wakes it at once
        assert inbox.get(timeout=30) is not None
    finally:
        stream.cancel()
        assert stream.wait_closed(30)
        channel.close()


def _timeouts_of_a_wait(
    *, timeout: float | None = None, spin_cb: Callable[[], None] | None = None
) -> list[float]:
    """The timeouts grpcio's ``_common.wait`` gives its condition's wait, over three wake-ups."""
    seen: list[float] = []

    def wait_fn(*, timeout: float) -> bool:
        seen.append(timeout)
        return False

    _common.wait(wait_fn, lambda: len(seen) >= 3, timeout, spin_cb)
    return seen


def test_off_the_main_thread_grpcios_waits_wait_long() -> None:
    _rpc.install_long_waits()
    got: list[list[float]] = []
    thread = threading.Thread(target=lambda: got.append(_timeouts_of_a_wait()))
    thread.start()
    thread.join()
    assert got == [[_rpc.LONG_WAIT_SECONDS] * 3]


def test_the_main_thread_and_bounded_or_spinning_waits_keep_grpcios_polls() -> None:
    # The main thread runs signal handlers between polls; a spin callback is
    # grpcio's fork support, which must run between them too.
    _rpc.install_long_waits()
    assert _timeouts_of_a_wait() == [_common.MAXIMUM_WAIT_TIMEOUT] * 3
    spins: list[None] = []
    got: list[list[float]] = []
    thread = threading.Thread(
        target=lambda: got.append(_timeouts_of_a_wait(spin_cb=lambda: spins.append(None)))
    )
    thread.start()
    thread.join()
    assert got == [[_common.MAXIMUM_WAIT_TIMEOUT] * 3] and len(spins) == 3
    bounded = _timeouts_of_a_wait(timeout=60.0)
    assert all(t <= _common.MAXIMUM_WAIT_TIMEOUT for t in bounded)


def test_installing_twice_keeps_one_wrapper() -> None:
    _rpc.install_long_waits()
    _rpc.install_long_waits()
    assert _common.wait is _rpc._long_wait
    assert grpc.__version__  # the grpcio whose private wait is replaced is importable


def test_a_grpcio_wait_of_other_parameters_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def other_wait(wait_fn: Callable[..., bool], done: Callable[[], bool], deadline: float) -> bool:
        return False

    monkeypatch.setattr(_common, "wait", other_wait)
    _rpc.install_long_waits()
    assert _common.wait is other_wait
