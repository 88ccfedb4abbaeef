"""The hand-written protobuf primitives against the protobuf encoding spec.

Expected bytes come from https://protobuf.dev/programming-guides/encoding/
(e.g. 150 is ``96 01``, a tag is ``field << 3 | wire_type``) and are
cross-checked against protobuf's own serializer where one applies.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import WireFormatError
from rlfleet.v1 import batch_pb2
from rlfleet.wire._protowire import (
    I32,
    I64,
    LEN,
    SGROUP,
    VARINT,
    as_byte_source,
    encode_varint,
    iter_fields,
    len_prefix,
    read_varint,
    tag,
    to_int64,
    varint_size,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (150, b"\x96\x01"),
        (300, b"\xac\x02"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
        (-1, b"\xff" * 9 + b"\x01"),  # int64 -1: ten bytes, two's complement
        (-2, b"\xfe" + b"\xff" * 8 + b"\x01"),
    ],
)
def test_encode_varint_matches_the_spec(value: int, expected: bytes) -> None:
    assert encode_varint(value) == expected
    assert varint_size(value) == len(expected)


def test_encode_varint_matches_protobuf_for_uint64_fields() -> None:
    for value in (0, 1, 2**7, 2**14 - 1, 2**14, 2**21 - 1, 2**21, 2**35, 2**63, 2**64 - 1):
        msg = batch_pb2.BatchChunk(batch_id=value)
        expected = msg.SerializeToString()
        assert (tag(1, VARINT) + encode_varint(value) if value else b"") == expected


def test_tags_and_length_prefixes() -> None:
    assert tag(1, VARINT) == b"\x08"
    assert tag(2, LEN) == b"\x12"
    assert tag(16, LEN) == b"\x82\x01"  # field 16 needs a two-byte tag
    assert len_prefix(3, 200) == b"\x1a\xc8\x01"


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.binary(max_size=3))
def test_read_varint_round_trips_at_any_offset(value: int, prefix: bytes) -> None:
    data = prefix + encode_varint(value) + b"\x55"
    decoded, pos = read_varint(data, len(prefix), len(data), "test")
    assert decoded == value
    assert pos == len(data) - 1


def test_to_int64_reinterprets_the_sign_bit() -> None:
    assert to_int64(2**64 - 1) == -1
    assert to_int64(2**63) == -(2**63)
    assert to_int64(2**63 - 1) == 2**63 - 1


def test_read_varint_rejects_truncation_and_overlong_varints() -> None:
    with pytest.raises(WireFormatError, match="truncated varint at byte 0"):
        read_varint(b"\x80\x80", 0, 2, "test")
    with pytest.raises(WireFormatError, match="truncated varint"):
        # The varint is complete in the buffer but not within `end`.
        read_varint(b"\x96\x01", 0, 1, "test")
    with pytest.raises(WireFormatError, match="longer than 10 bytes"):
        read_varint(b"\xff" * 11, 0, 11, "test")


def test_iter_fields_walks_every_wire_type() -> None:
    data = (
        b"\x08\x96\x01"  # field 1 varint 150
        + b"\x12\x03abc"  # field 2 length-delimited "abc"
        + b"\x19"
        + bytes(range(8))  # field 3 fixed64
        + b"\x25\x01\x02\x03\x04"  # field 4 fixed32
        + b"\x2b\x08\x01\x2c"  # field 5 group holding field 1 varint 1
        + b"\x30\x00"  # field 6 varint 0
    )
    fields = list(iter_fields(data, 0, len(data), "test"))
    assert fields == [
        (1, VARINT, 150, 3),
        (2, LEN, 5, 8),
        (3, I64, 9, 17),
        (4, I32, 18, 22),
        (5, SGROUP, 23, 26),
        (6, VARINT, 0, 28),
    ]


def test_iter_fields_skips_nested_groups() -> None:
    # group 5 { group 6 { field 1 = "x" } }, then field 2 varint 7
    data = b"\x2b\x33\x0a\x01x\x34\x2c\x10\x07"
    assert [f[:2] for f in iter_fields(data, 0, len(data), "t")] == [(5, SGROUP), (2, VARINT)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x01", "invalid field number 0"),
        (b"\x0e", "invalid wire type 6"),
        (b"\x0f", "invalid wire type 7"),
        (b"\x0c", "unexpected end-group"),
        (b"\x12\x05ab", "runs past the end"),
        (b"\x19\x00\x00", "runs past the end"),
        (b"\x25\x00", "runs past the end"),
        (b"\x12", "truncated varint"),
        (b"\x08", "truncated varint"),
        (b"\x2b\x08\x01", "group 5 is not closed"),
        (b"\x2b\x34", "closed by end-group tag of field 6"),
        (b"\x2b\x0f", "invalid wire type 7 inside group 5"),
    ],
)
def test_iter_fields_rejects_malformed_records(data: bytes, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        list(iter_fields(data, 0, len(data), "test"))


def test_iter_fields_stays_within_the_given_range() -> None:
    data = b"\x08\x01" + b"\x12\x03abc"
    assert list(iter_fields(data, 0, 2, "t")) == [(1, VARINT, 1, 2)]
    with pytest.raises(WireFormatError, match="runs past the end"):
        list(iter_fields(data, 2, 6, "t"))


def test_as_byte_source_views_without_copying() -> None:
    data = b"abc"
    assert as_byte_source(data) is data
    mutable = bytearray(b"abcd")
    view = as_byte_source(mutable)
    assert isinstance(view, memoryview)
    assert view.readonly
    mutable[0] = ord("z")
    assert bytes(view) == b"zbcd"  # a view, not a copy
    floats = np.arange(3, dtype=np.float32)
    assert bytes(as_byte_source(floats.data)) == floats.tobytes()


def test_as_byte_source_rejects_non_buffers_and_strided_views() -> None:
    with pytest.raises(WireFormatError, match="expected bytes"):
        as_byte_source("text")  # type: ignore[arg-type]
    with pytest.raises(WireFormatError, match="contiguous"):
        as_byte_source(memoryview(b"abcdef")[::2])
