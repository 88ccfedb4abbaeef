"""The compiled view check says what the Python checks say, and reads nothing outside its frame.

``rlfleet.wire._view_check.view_check`` (C) makes the checks a learner's
viewed result takes (rlfleet.wire.result_views): the bytes between the
arrays are the plan's, the lengths the header's, bounded bytes (uint8 step
types, bools) at most their largest value. Here random frames, runs,
lengths and ranges are checked against the same checks in numpy and bytes
methods; runs and ranges past the frame's end, or at offsets a forged count
could give, are a mismatch, never a read past the buffer (the tests run
under ASan and UBSan as docs/performance.md says).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.wire._view_check import view_check

INT_DTYPES = [np.dtype(t) for t in ("i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8")]


class Case(NamedTuple):
    """A frame and what its plan says of it (view_check's arguments)."""

    frame: bytes
    runs: list[tuple[int, int]]
    joined: bytes
    lengths_at: int
    dtype: np.dtype
    lengths: list[int]
    limits: list[tuple[int, int, int]]


def _reference(case: Case) -> bool:
    """The checks as numpy and bytes methods make them (False for what is outside the frame)."""
    frame, runs, joined, lengths_at, dtype, lengths, limits = case
    size = len(frame)

    def inside(at: int, count: int) -> bool:
        return at >= 0 and count >= 0 and at + count <= size

    if not inside(lengths_at, len(lengths) * dtype.itemsize):
        return False
    got = np.frombuffer(frame, dtype, len(lengths), lengths_at).tolist()
    if got != lengths:
        return False
    if not all(inside(at, count) for at, count in runs):
        return False
    if b"".join(frame[at : at + count] for at, count in runs) != joined:
        return False
    for at, count, most in limits:
        if not inside(at, count) or most < 0:
            return False
        if count and max(frame[at : at + count]) > most:
            return False
    return True


def _checked(case: Case) -> bool:
    frame, runs, joined, lengths_at, dtype, lengths, limits = case
    return view_check(
        memoryview(frame),
        np.array(runs, np.int64).reshape(-1, 2).tobytes(),
        joined,
        lengths_at,
        dtype.itemsize,
        dtype.kind == "i",
        tuple(lengths),
        np.array(limits, np.int64).reshape(-1, 3).tobytes(),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """A frame with a plan's runs, lengths and ranges, mostly matching, some spoilt
    or reaching past the frame."""
    frame = draw(st.binary(max_size=96))
    size = len(frame)
    reach = st.integers(-3, size + 4)  # past either end now and then
    runs = draw(st.lists(st.tuples(reach, st.integers(-2, 12)), max_size=4))
    joined = b"".join(frame[max(at, 0) : max(at, 0) + max(count, 0)] for at, count in runs)
    if draw(st.booleans()) and joined:
        spoilt = bytearray(joined)
        spoilt[draw(st.integers(0, len(spoilt) - 1))] ^= 1 << draw(st.integers(0, 7))
        joined = bytes(spoilt)
    elif draw(st.integers(0, 9)) == 0:
        joined += b"x"
    dtype = draw(st.sampled_from(INT_DTYPES))
    lengths_at = draw(reach)
    count = draw(st.integers(0, 5))
    if lengths_at >= 0 and lengths_at + count * dtype.itemsize <= size:
        lengths = np.frombuffer(frame, dtype, count, lengths_at).tolist()
        if lengths and draw(st.booleans()):
            lengths[draw(st.integers(0, len(lengths) - 1))] += draw(st.sampled_from([-1, 1, 2**64]))
    else:
        lengths = draw(st.lists(st.integers(0, 300), max_size=count))
    limits = draw(st.lists(st.tuples(reach, st.integers(-2, 24), st.integers(-1, 300)), max_size=3))
    return Case(frame, runs, joined, lengths_at, dtype, lengths, limits)


@given(cases())
@settings(max_examples=300, deadline=None)
def test_the_view_check_says_what_the_python_checks_say(case: Case) -> None:
    assert _checked(case) == _reference(case)


def test_bytes_past_a_bound_or_a_changed_run_are_refused() -> None:
    # A run, int32 lengths 3 and 1, four step types, the last two bools too.
    frame = bytes([7, 7, 3, 0, 0, 0, 1, 0, 0, 0, 2, 1, 0, 1])
    ok = Case(frame, [(0, 2)], b"\x07\x07", 2, np.dtype("i4"), [3, 1], [(12, 2, 1), (10, 4, 2)])
    assert _checked(ok)
    assert not _checked(ok._replace(joined=b"\x07\x08"))
    assert not _checked(ok._replace(lengths=[3, 2]))
    assert not _checked(ok._replace(limits=[(10, 2, 1)]))  # a 2 where at most 1
    assert not _checked(ok._replace(limits=[(13, 2, 1)]))  # one byte past the end
    assert not _checked(ok._replace(runs=[(13, 2)], joined=b"\x01\x00"))
    assert not _checked(ok._replace(lengths_at=2**40))


def test_arguments_of_the_wrong_kind_are_refused() -> None:
    with pytest.raises(ValueError, match="lengths_size must be 1, 2, 4 or 8"):
        view_check(b"", b"", b"", 0, 3, True, (), b"")
    with pytest.raises(ValueError, match="int64 pairs"):
        view_check(b"", b"\x00" * 8, b"", 0, 4, True, (), b"")
    with pytest.raises(TypeError):
        view_check(b"", b"", b"", 0, 4, True, None, b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        view_check(b"\x01", b"", b"", 0, 1, True, ("1",), b"")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="8 arguments"):
        view_check(b"")  # type: ignore[call-arg]
