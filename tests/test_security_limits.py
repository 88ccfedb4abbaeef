"""Resource limits: validated settings and element checks that cannot overflow."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

from rlfleet.coordinator.leases.result_lane import ResultLane
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.worker_events import WorkerEvents
from rlfleet.errors import ConfigError, ResourceExhaustedError
from rlfleet.security import InflightBudget, Limits
from rlfleet.security.limits import CHUNK_OVERHEAD_BYTES


def test_defaults_are_valid_and_bounded() -> None:
    limits = Limits()
    assert limits.max_message_bytes == 64 * 1024 * 1024
    assert limits.max_inflight_bytes_per_worker == 256 * 1024 * 1024
    assert limits.max_tensor_elements == 1 << 28
    assert limits.handshake_timeout_seconds == 10.0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_workers", 0, "max_workers must be an int >= 1, got 0"),
        ("max_workers", True, "max_workers must be an int >= 1, got True"),
        ("max_subscribers", 2.5, "max_subscribers must be an int >= 1"),
        ("handshake_timeout_seconds", 0, "must be a positive number of seconds, got 0"),
        ("handshake_timeout_seconds", float("inf"), "positive number of seconds, got inf"),
        ("handshake_timeout_seconds", "10", "must be a number of seconds"),
        ("max_message_bytes", 1024, "must be between 65536"),
        ("max_message_bytes", 1 << 31, "gRPC's own ceiling"),
    ],
)
def test_bad_limits_are_refused(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Limits(**{field: value})  # type: ignore[arg-type]


def test_check_elements() -> None:
    limits = Limits(max_tensor_elements=100)
    assert limits.check_elements((10, 10), "t") == 100
    assert limits.check_elements((), "t") == 1
    assert limits.check_elements((0, 1 << 62), "t") == 0
    with pytest.raises(
        ResourceExhaustedError, match=r"t: shape \(10, 11\) has 110 elements, over the limit of 100"
    ):
        limits.check_elements((10, 11), "t")
    with pytest.raises(ResourceExhaustedError, match="negative dimension"):
        limits.check_elements((-1, -1), "t")


def test_huge_shapes_do_not_overflow() -> None:
    # int64 arithmetic would wrap (2**32 * 2**32 == 0 mod 2**64); Python ints do not.
    with pytest.raises(ResourceExhaustedError, match="18446744073709551616 elements"):
        Limits().check_elements(np.array([1 << 32, 1 << 32], dtype=np.int64), "t")


def test_check_tensor_map_names_the_nested_entry() -> None:
    limits = Limits(max_tensor_elements=8)
    ok = {"w": np.zeros((2, 4)), "nested": {"b": np.zeros(8)}}
    limits.check_tensor_map(ok, "params")
    bad = {"w": np.zeros((2, 4)), "nested": {"b": np.zeros(9)}}
    with pytest.raises(ResourceExhaustedError, match=r"params\['nested'\]\['b'\]: shape \(9,\)"):
        limits.check_tensor_map(bad, "params")


def test_bytes_held_on_a_carrier_count_in_its_session_until_let_go() -> None:
    """What a lane holds queued counts on its own carrier and in the session's
    one total (shared with the other carrier's unfinished result), until let go."""
    session = InflightBudget(10_000, "w")
    queued, joining = session.carrier(), session.carrier()
    assert queued.hold(100) == (100, 100)
    joining.charge(50)  # an unfinished result on the other carrier: 50 + the chunk overhead
    assert queued.hold(20) == (120, 120 + 50 + CHUNK_OVERHEAD_BYTES)
    queued.let_go(120)
    assert queued.used == 0
    assert session.session_used == 50 + CHUNK_OVERHEAD_BYTES
    joining.release()
    assert session.session_used == 0


def _held_lane(
    handle: SimpleNamespace, defer: Callable[[Callable[[], None]], None] | None = None
) -> ResultLane:
    """A lane of at most 1,600 bytes that books nothing (its frames stay
    queued), with the Join stream's unfinished result (the overhead) held."""
    handle.inflight.carrier().charge(0)
    return ResultLane(
        cast(WorkerEvents, None),
        cast(WorkerHandle, handle),
        threading.Event(),
        limit=1_600,
        close=lambda reason: None,
        after=threading.Event(),
        defer=defer,
    )


def test_a_result_lane_refuses_frames_past_the_limit_naming_what_it_holds() -> None:
    """The refusal counts the bytes this lane holds queued, and those of the session."""
    handle = SimpleNamespace(name="w", alive=True, inflight=InflightBudget(10_000, "w"))
    lane = _held_lane(handle)
    try:
        lane.put(b"x" * 300)
        with pytest.raises(ResourceExhaustedError, match="has 600 bytes of results received") as e:
            lane.put(b"y" * 300)
        assert f"({600 + CHUNK_OVERHEAD_BYTES} in flight" in str(e.value)
    finally:
        handle.alive = False  # the lane's thread ends at its next look


def test_a_deferred_lane_hands_a_wake_ups_frames_over_at_once_in_order_counted_meanwhile() -> None:
    """With ``defer`` (the data loop's ``after_wake_up``), what one wake-up of
    the loop queues reaches the lane's thread when the hand-over runs: its
    frames as one entry (one wake-up) and then the end, in order, one
    hand-over asked per wake-up; meanwhile the frames count against the
    limit, whose refusal comes at once."""
    handle = SimpleNamespace(name="w", alive=True, inflight=InflightBudget(10_000, "w"))
    asked: list[Callable[[], None]] = []
    lane = _held_lane(handle, defer=asked.append)
    try:
        lane.put_many([b"a" * 100, b"b" * 100])
        lane.put(b"c" * 100)
        assert len(asked) == 1 and lane._queue.empty()
        asked.pop()()
        assert [lane._queue.get_nowait() for _ in range(lane._queue.qsize())] == [
            [b"a" * 100, b"b" * 100, b"c" * 100]
        ]
        lane.put_many([b"d" * 10])
        with pytest.raises(ResourceExhaustedError, match="has 610 bytes of results received"):
            lane.put(b"x" * 300)  # the 300 queued and the 10 not yet handed over count
        lane.close()
        assert len(asked) == 1 and lane._queue.empty()
        asked.pop()()
        queued = [lane._queue.get_nowait() for _ in range(lane._queue.qsize())]
        assert queued[0] == [b"d" * 10] and type(queued[1]).__name__ == "_Closed"
        assert len(queued) == 2 and not asked
    finally:
        handle.alive = False  # the lane's thread ends at its next look


def test_a_result_lane_refuses_a_wake_ups_frames_from_the_first_past_the_limit() -> None:
    """Frames handed over together are held to the limit as if put one by one:
    those within it are queued, the first past it is refused, naming what
    the lane holds."""
    handle = SimpleNamespace(name="w", alive=True, inflight=InflightBudget(10_000, "w"))
    lane = _held_lane(handle)
    try:
        lane.put_many([b"x" * 200, b"y" * 100])
        with pytest.raises(ResourceExhaustedError, match="has 700 bytes of results received") as e:
            lane.put_many([b"a" * 100, b"b" * 300, b"c" * 1])
        assert f"({700 + CHUNK_OVERHEAD_BYTES} in flight" in str(e.value)
        queued = [lane._queue.get_nowait() for _ in range(lane._queue.qsize())]
        assert queued == [[b"x" * 200, b"y" * 100], b"a" * 100]
    finally:
        handle.alive = False  # the lane's thread ends at its next look
