"""The compiled gather copies byte pieces as numpy slicing does, and refuses any that do not fit.

``rlfleet.wire._gather.gather`` (C) places each field of a learner's answer
from the results' arrays, views of network frames. Here random sources and
pieces are gathered and compared with joining numpy's slices of the same
bytes; pieces outside their source, naming no source or not filling the
destination exactly are refused with InvalidValueError and leave the
destination untouched, never a crash or a read past a buffer (the tests run
under ASan and UBSan as docs/performance.md says).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import InvalidValueError
from rlfleet.wire._gather import gather

#: Sources: byte strings of random lengths (some empty).
SOURCES = st.lists(st.binary(max_size=64), min_size=1, max_size=6)


@st.composite
def pieces_of(draw: st.DrawFn, sources: list[bytes]) -> list[tuple[int, int, int]]:
    """(source, offset, count) pieces inside their sources."""
    out = []
    for _ in range(draw(st.integers(0, 8))):
        index = draw(st.integers(0, len(sources) - 1))
        size = len(sources[index])
        offset = draw(st.integers(0, size))
        out.append((index, offset, draw(st.integers(0, size - offset))))
    return out


def _reference(sources: list[bytes], pieces: list[tuple[int, int, int]]) -> bytes:
    return b"".join(sources[i][offset : offset + count] for i, offset, count in pieces)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_pieces_are_copied_as_joining_their_slices_copies_them(data: st.DataObject) -> None:
    sources = data.draw(SOURCES)
    pieces = data.draw(pieces_of(sources))
    want = _reference(sources, pieces)
    dest = np.full(len(want), 0xAA, np.uint8)
    # Sources as bytes, and as read-only numpy views (a frame's, at any offset).
    views = [np.frombuffer(source, np.uint8) for source in sources]
    for given_sources in (sources, views):
        dest[:] = 0xAA
        assert gather(dest, given_sources, np.array(pieces, np.int64).reshape(-1, 3)) is True
        assert dest.tobytes() == want
    whole = b"".join(sources)
    dest = np.empty(len(whole), np.uint8)
    assert gather(dest, sources, None) is True
    assert dest.tobytes() == whole


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_pieces_that_do_not_fit_are_refused_and_copy_nothing(data: st.DataObject) -> None:
    sources = data.draw(SOURCES)
    pieces = data.draw(pieces_of(sources))
    spoiled = data.draw(st.integers(0, len(pieces)))
    huge = st.integers(-(1 << 63), (1 << 63) - 1)
    wrong = data.draw(st.sampled_from(["source", "offset", "count", "dest"]))
    bad = list(pieces)
    if wrong == "dest" or spoiled == len(bad):
        # The pieces hold one byte more or less than the destination.
        size = len(_reference(sources, pieces)) + data.draw(st.sampled_from([-1, 1]))
        if size < 0:
            size = 1
    else:
        index, offset, count = bad[spoiled]
        length = len(sources[index])
        if wrong == "source":
            index = data.draw(st.one_of(st.integers(len(sources), len(sources) + 3), huge))
            if 0 <= index < len(sources):
                index = -1
        elif wrong == "offset":
            offset = data.draw(
                st.one_of(st.integers(length + 1, length + 9), st.integers(-9, -1), huge)
            )
            if 0 <= offset <= length:
                offset = length + 1
        else:
            count = data.draw(
                st.one_of(st.integers(length - offset + 1, length + 9), st.integers(-9, -1), huge)
            )
            if 0 <= count <= length - offset:
                count = -1
        bad[spoiled] = (index, offset, count)
        size = len(_reference(sources, pieces))
    dest = np.full(size, 0xAA, np.uint8)
    with pytest.raises(InvalidValueError, match="gather's piece"):
        gather(dest, sources, np.array(bad, np.int64).reshape(-1, 3))
    assert not (dest != 0xAA).any()


def test_a_copy_past_64_kib_copies_as_joining_the_slices_does() -> None:
    # Past 64 KiB the copy runs without the GIL (other threads run), its buffers held.
    rng = np.random.default_rng(5)
    sources = [rng.integers(0, 256, size, dtype=np.uint8) for size in (300_000, 70_000, 5)]
    pieces = [(1, 3, 69_990), (0, 0, 300_000), (2, 1, 4), (0, 17, 100_000)]
    want = _reference([source.tobytes() for source in sources], pieces)
    dest = np.empty(len(want), np.uint8)
    assert gather(dest, sources, np.array(pieces, np.int64)) is True
    assert dest.tobytes() == want
    dest = np.empty(sum(map(len, sources)), np.uint8)
    assert gather(dest, sources, None) is True
    assert dest.tobytes() == b"".join(source.tobytes() for source in sources)


def test_whole_sources_that_do_not_fill_the_destination_are_refused() -> None:
    for size in (5, 7):
        with pytest.raises(InvalidValueError, match="must fill it exactly"):
            gather(np.empty(size, np.uint8), [b"abc", b"def"], None)


def test_pieces_must_be_int64_rows() -> None:
    dest = np.empty(2, np.uint8)
    rows = r"int64 \(source, byte offset, byte count\) rows"
    for pieces in (np.array([0, 0, 2], np.int32), np.array([0, 0, 2, 0], np.int64)):
        with pytest.raises(InvalidValueError, match=rows):
            gather(dest, [b"ab"], pieces)


def test_sources_of_other_rows_or_not_contiguous_are_left_to_the_caller() -> None:
    # False, dest untouched: the caller copies another way (numpy's).
    dest = np.zeros((2, 3), np.float32)
    rows = np.ones((4, 3), np.float32)
    pieces = np.array([[0, 0, 24]], np.int64)
    assert gather(dest, [rows], pieces, True) is True
    dest[:] = 0
    others: list[Any] = [
        rows.reshape(2, 6),
        np.ones((4, 3), np.int64),
        np.ones((4, 3), np.int32),  # rows of the same size, of another dtype
        rows.view(np.uint32),
        rows[::2],
        rows.T,
        "text",
    ]
    for other in others:
        assert gather(dest, [rows, other], pieces, True) is False
        assert not dest.any()
    # As bytes, any contiguous buffer will do; one that is not is left too.
    assert gather(dest, [rows.reshape(2, 6)], pieces) is True
    assert gather(dest, [rows[::2]], pieces) is False


def test_a_source_sharing_memory_with_the_destination_is_refused() -> None:
    memory = np.arange(8, dtype=np.uint8)
    with pytest.raises(InvalidValueError, match="source 1 shares memory with dest"):
        gather(memory[:4], [b"abcd", memory[3:]], np.array([[1, 0, 4]], np.int64))
    assert memory.tolist() == list(range(8))


def test_a_destination_that_is_not_writable_or_contiguous_is_refused() -> None:
    with pytest.raises((BufferError, TypeError)):
        gather(b"ab", [b"ab"], None)
    with pytest.raises((BufferError, ValueError)):
        gather(np.zeros(4, np.uint8)[::2], [b"ab"], None)
