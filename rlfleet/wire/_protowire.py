"""The protobuf wire format by hand: varints, tags and a field walker.

The hot paths of :mod:`rlfleet.wire` read and write serialized messages
themselves, so that tensor payloads are never copied through protobuf's
Python objects. This module holds the few primitives they share. It follows
https://protobuf.dev/programming-guides/encoding/: a message is a sequence of
``tag value`` records in any order; a tag is the varint
``field_number << 3 | wire_type``; unknown fields are skipped.

Readers take ``bytes`` or a one-dimensional byte ``memoryview`` and offsets
into it, and raise :class:`~rlfleet.errors.WireFormatError` naming ``where``
(the message or field being read) for every malformed input: truncated
varints and lengths, invalid field numbers and wire types, unbalanced groups.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import TypeAlias

import numpy as np

from rlfleet.errors import WireFormatError

#: What the readers accept: bytes, or a 1-D memoryview of unsigned bytes.
ByteSource: TypeAlias = bytes | memoryview

VARINT = 0
I64 = 1
LEN = 2
SGROUP = 3
EGROUP = 4
I32 = 5

WIRE_TYPE_NAMES = {
    VARINT: "varint",
    I64: "64-bit",
    LEN: "length-delimited",
    SGROUP: "start-group",
    EGROUP: "end-group",
    I32: "32-bit",
}

_MAX_FIELD_NUMBER = (1 << 29) - 1
_UINT64_MASK = (1 << 64) - 1
_INT64_SIGN = 1 << 63
_MAX_VARINT_BYTES = 10
# Nesting of groups inside skipped unknown fields; protobuf's own limit is 100.
_MAX_GROUP_DEPTH = 100

# Varints below 128 are one byte; precomputing them makes the common case a
# list lookup instead of a loop.
_SMALL_VARINTS = [bytes((value,)) for value in range(128)]


def encode_varint(value: int) -> bytes:
    """Encodes an unsigned (or two's-complement 64-bit) integer as a varint.

    Negative values are written as their 64-bit two's complement (ten
    bytes), as protobuf does for ``int32``/``int64``/enum fields.

    Args:
        value: An integer in ``[-2**63, 2**64)``.

    Returns:
        The varint bytes.
    """
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    if 0 <= value < 1 << 21:  # two or three bytes (most lengths and counts): no loop
        low = value & 0x7F | 0x80
        if value < 1 << 14:
            return bytes((low, value >> 7))
        return bytes((low, value >> 7 & 0x7F | 0x80, value >> 14))
    value &= _UINT64_MASK
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_GROUP_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)


def packed_varints(values: np.ndarray) -> bytes:
    """A packed repeated ``int64`` field's body: each value's varint, in order.

    What protobuf writes for the values (a negative one as its 64-bit two's
    complement, ten bytes), with a few numpy calls for the whole column:
    each value's seven-bit groups side by side, the continuation bits set,
    the groups past a value's last dropped.

    Args:
        values: Integers in ``[-2**63, 2**63)``, any integer dtype.
    """
    if not len(values):
        return b""
    column = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    top = int(column.max())
    if top < 0x80:
        return column.astype(np.uint8).tobytes()
    width = (top.bit_length() + 6) // 7
    groups = column[:, None] >> _GROUP_SHIFTS[:width]
    keep = groups != 0
    keep[:, 0] = True
    data = groups.astype(np.uint8) & 0x7F
    data[:, :-1] |= keep[:, 1:].view(np.uint8) << 7
    return data[keep].tobytes()


def varint_size(value: int) -> int:
    """Number of bytes :func:`encode_varint` writes for ``value``."""
    if value < 0:
        return _MAX_VARINT_BYTES
    return max(1, (value.bit_length() + 6) // 7)


@lru_cache(maxsize=1024)
def tag(field_number: int, wire_type: int) -> bytes:
    """The encoded tag of a field (cached: there are few distinct tags)."""
    return encode_varint(field_number << 3 | wire_type)


def len_prefix(field_number: int, length: int) -> bytes:
    """Tag and length of a length-delimited field of ``length`` bytes."""
    return tag(field_number, LEN) + encode_varint(length)


def to_int64(value: int) -> int:
    """Reinterprets a decoded (unsigned 64-bit) varint as a signed int64."""
    return value - (1 << 64) if value & _INT64_SIGN else value


def read_varint(buf: ByteSource, pos: int, end: int, where: str) -> tuple[int, int]:
    """Decodes the varint at ``buf[pos]``.

    Args:
        buf: The buffer.
        pos: Offset of the varint's first byte.
        end: Offset the varint must not reach past (end of the enclosing
            message).
        where: What is being read, for error messages.

    Returns:
        ``(value, next_pos)``: the unsigned 64-bit value (bits past 64 are
        dropped, as protobuf does) and the offset after the varint.

    Raises:
        WireFormatError: If the varint is truncated or longer than 10 bytes.
    """
    if pos < end:
        byte = buf[pos]
        if byte < 0x80:
            return byte, pos + 1
    value = 0
    shift = 0
    start = pos
    while pos < end and pos - start < _MAX_VARINT_BYTES:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _UINT64_MASK, pos
        shift += 7
    if pos - start >= _MAX_VARINT_BYTES:
        raise WireFormatError(f"{where}: varint at byte {start} is longer than 10 bytes")
    raise WireFormatError(f"{where}: truncated varint at byte {start} (message ends at {end})")


def iter_fields(
    buf: ByteSource, pos: int, end: int, where: str
) -> Iterator[tuple[int, int, int, int]]:
    """Walks the fields of the message in ``buf[pos:end]``.

    Yields one tuple per field record, in wire order:
    ``(field_number, wire_type, value, next_pos)``. For a varint field,
    ``value`` is the decoded unsigned integer; for every other wire type it
    is the offset of the field's payload, which ends at ``next_pos`` (for a
    length-delimited field, the payload excludes the length; for a group it
    runs to the end of the closing tag). A field's record starts where the
    previous one ended (``pos`` for the first).

    Args:
        buf: The buffer.
        pos: Offset of the message's first byte.
        end: Offset after the message's last byte.
        where: The message being read, for error messages.

    Raises:
        WireFormatError: On a truncated record, a field number outside
            1..2**29-1, wire type 6 or 7, a length past the end of the
            message, or an unbalanced group.
    """
    while pos < end:
        # One-byte tags and lengths are the common case; inlining them
        # roughly halves the cost of a field.
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end, where)
        number = key >> 3
        wire_type = key & 7
        if not 0 < number <= _MAX_FIELD_NUMBER:
            raise WireFormatError(f"{where}: invalid field number {number} at byte {pos}")
        if wire_type == LEN:
            start = pos + 1
            if start <= end and (length := buf[pos]) < 0x80:
                pos = start + length
            else:
                length, start = read_varint(buf, pos, end, where)
                pos = start + length
        elif wire_type == VARINT:
            value, pos = read_varint(buf, pos, end, where)
            yield number, wire_type, value, pos
            continue
        elif wire_type == I64:
            start = pos
            pos += 8
        elif wire_type == I32:
            start = pos
            pos += 4
        elif wire_type == SGROUP:
            start = pos
            pos = _skip_group(buf, pos, end, where, number=number, depth=1)
        else:
            kind = WIRE_TYPE_NAMES.get(wire_type, f"invalid wire type {wire_type}")
            raise WireFormatError(f"{where}: unexpected {kind} for field {number} at byte {pos}")
        if pos > end:
            raise WireFormatError(
                f"{where}: field {number} runs past the end of the message "
                f"(needs bytes up to {pos}, message ends at {end}); the data is truncated"
            )
        yield number, wire_type, start, pos


def _skip_group(buf: ByteSource, pos: int, end: int, where: str, *, number: int, depth: int) -> int:
    # Groups are a proto2 relic, but the protobuf rules say an unknown one is
    # skipped, so a message from a proto2 sender still parses.
    if depth > _MAX_GROUP_DEPTH:
        raise WireFormatError(f"{where}: groups nested deeper than {_MAX_GROUP_DEPTH}")
    while pos < end:
        key, pos = read_varint(buf, pos, end, where)
        inner, wire_type = key >> 3, key & 7
        if wire_type == EGROUP:
            if inner != number:
                raise WireFormatError(
                    f"{where}: group {number} closed by end-group tag of field {inner}"
                )
            return pos
        if wire_type == VARINT:
            _, pos = read_varint(buf, pos, end, where)
        elif wire_type == LEN:
            length, pos = read_varint(buf, pos, end, where)
            pos += length
        elif wire_type == I64:
            pos += 8
        elif wire_type == I32:
            pos += 4
        elif wire_type == SGROUP:
            pos = _skip_group(buf, pos, end, where, number=inner, depth=depth + 1)
        else:
            raise WireFormatError(f"{where}: invalid wire type {wire_type} inside group {number}")
    raise WireFormatError(f"{where}: group {number} is not closed before the message ends")


def wire_type_error(where: str, field: str, wire_type: int, expected: str) -> WireFormatError:
    """The error for a known field that arrived with the wrong wire type."""
    got = WIRE_TYPE_NAMES.get(wire_type, f"wire type {wire_type}")
    return WireFormatError(f"{where}.{field}: expected a {expected} field, got {got}")


def duplicate_error(where: str, field: str) -> WireFormatError:
    """The error for a singular message field that occurs more than once."""
    return WireFormatError(
        f"{where}.{field} occurs more than once; protobuf would merge the occurrences, "
        "which rlfleet does not support for this field (send it once)"
    )


def as_byte_source(data: bytes | bytearray | memoryview) -> ByteSource:
    """Returns ``data`` as something the readers take, without copying.

    ``bytes`` is returned as is. Anything else becomes a read-only 1-D
    byte memoryview, so arrays viewed over it are read-only too.

    Raises:
        WireFormatError: If ``data`` is not a contiguous buffer.
    """
    if type(data) is bytes:
        return data
    try:
        view = memoryview(data)
    except TypeError:
        raise WireFormatError(
            f"expected bytes, bytearray or memoryview, got {type(data).__name__}"
        ) from None
    if not view.c_contiguous:
        raise WireFormatError("the buffer to decode must be contiguous")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view.toreadonly()
