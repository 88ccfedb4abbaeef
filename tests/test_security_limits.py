"""Resource limits: validated settings and element checks that cannot overflow."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.errors import ConfigError, ResourceExhaustedError
from rlfleet.security import Limits


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
