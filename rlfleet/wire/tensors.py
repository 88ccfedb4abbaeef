"""Tensors and tensor maps on the wire (``rlfleet.v1.Tensor`` / ``TensorMap``).

Two paths share one set of checks (the dtypes and keys of
:mod:`rlfleet.wire._tensor_header`, this module's shapes and sizes):

* :func:`write_tensor` / :func:`read_tensor` and :func:`write_tensor_map` /
  :func:`read_tensor_map` write and read the wire format by hand, for the
  batch codec's hot path: writing yields the array's own memory as a part
  to join (no copy until the single join), reading views the input buffer
  (no copy at all).
* :mod:`rlfleet.wire.tensor_messages` (``encode_tensor``, ``decode_tensor``
  and the ``*_tensor_map`` functions) goes through protobuf's generated
  classes, for small tensors in control messages (policy parameters, space
  bounds).

A tensor's data is prod(shape) * itemsize bytes, C order, little-endian
(tensor.proto). Decoded arrays are read-only numpy views of the bytes they
were decoded from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from rlfleet.core._pieces import RowPieces, TakenRows
from rlfleet.errors import WireFormatError
from rlfleet.v1 import tensor_pb2
from rlfleet.wire._protowire import (
    LEN,
    VARINT,
    ByteSource,
    iter_fields,
    len_prefix,
    read_varint,
    to_int64,
    wire_type_error,
)
from rlfleet.wire._tensor_header import (
    _CODES,
    _ENTRY_KEY,
    _ENTRY_MAP,
    _ENTRY_TENSOR,
    _MAP_ENTRIES,
    _TENSOR_CODEC,
    _TENSOR_DATA,
    _TENSOR_DTYPE,
    _TENSOR_SHAPE,
    DTYPES,
    dtype_of_code,
    encode_key_field,
    tensor_header,
    wire_array,
)

#: Bytes of a message being written: small headers and array memory.
BytePart: TypeAlias = bytes | memoryview
#: One piece of a message being written: bytes, or rows still to gather
#: (:func:`join_parts` gathers them; :func:`gathered` makes them bytes).
Part: TypeAlias = BytePart | TakenRows
#: A decoded tensor map: names to arrays or nested maps, in wire order.
TensorDict: TypeAlias = dict[str, "np.ndarray | TensorDict"]
#: Reads the Tensor message in ``buf[pos:end]`` (:func:`read_tensor`'s signature).
TensorReader: TypeAlias = "Callable[[ByteSource, int, int, str], Any]"

#: Most elements a decoded tensor may have. Checked before anything is
#: allocated, so a hostile shape cannot make numpy reserve memory or overflow.
MAX_ELEMENTS = 1 << 40
#: Most dimensions a tensor may have (numpy < 2 supports 32).
MAX_NDIM = 32

_CODEC_NONE = tensor_pb2.CODEC_NONE
_DTYPE_BOOL = tensor_pb2.DTYPE_BOOL
_DTYPE_KEY = _TENSOR_DTYPE << 3 | VARINT
_SHAPE_KEY = _TENSOR_SHAPE << 3 | LEN
_DATA_KEY = _TENSOR_DATA << 3 | LEN
_KEY_KEY = _ENTRY_KEY << 3 | LEN


def write_tensor(
    array: np.ndarray | RowPieces | TakenRows,
    field_number: int,
    out: list[Part],
    where: str = "tensor",
) -> int:
    """Appends a Tensor, as field ``field_number`` of its parent, to ``out``.

    Writes exactly the bytes protobuf's ``SerializeToString`` writes for the
    same Tensor: dtype, packed shape, then data (empty fields omitted). The
    array's memory is appended as is, so it is copied only by the final join.

    Args:
        array: The array, or its pieces (written as their join along axis 0,
            each piece's memory a part of its own), or rows still to take
            (a part of their own, which :func:`join_parts` gathers into the
            message); converted by :func:`wire_array` if needed.
        field_number: Field number of the Tensor in the enclosing message.
        out: The list of parts being built.
        where: Name of the tensor, for error messages.

    Returns:
        The number of bytes appended.
    """
    if isinstance(array, TakenRows):
        if array.dtype in _CODES and array.source.flags.c_contiguous:
            header = tensor_header(_CODES[array.dtype], array.shape, array.nbytes)
            prefix = len_prefix(field_number, len(header) + array.nbytes)
            out.append(prefix + header)
            if array.nbytes:
                out.append(array)
            return len(prefix) + len(header) + array.nbytes
        array = array.array()  # converted below, as any array
    if isinstance(array, RowPieces):
        pieces = array.arrays
        first = pieces[0]
        if first.dtype not in _CODES or not all(piece.flags.c_contiguous for piece in pieces):
            # RowPieces share one dtype: converted alike, they still join.
            pieces = tuple(wire_array(piece, where) for piece in pieces)
            first = pieces[0]
        shape = (sum([len(piece) for piece in pieces]), *first.shape[1:])
        nbytes = sum([piece.nbytes for piece in pieces])
    else:
        first = wire_array(array, where)
        pieces, shape, nbytes = (first,), first.shape, first.nbytes
    header = tensor_header(_CODES[first.dtype], shape, nbytes)
    body_size = len(header) + nbytes
    prefix = len_prefix(field_number, body_size)
    out.append(prefix + header)
    # Byte views: len() is their size.
    out.extend(piece.data.cast("B") for piece in pieces if piece.nbytes)
    return len(prefix) + body_size


def join_parts(
    parts: Sequence[Part], size: int | None = None, buffer: memoryview | None = None
) -> memoryview:
    """The parts written into one buffer: bytes copied, :class:`TakenRows` gathered into it.

    ``b"".join`` of parts holding no TakenRows gives the same bytes.

    Args:
        parts: The parts, in order.
        size: Their total length, if known.
        buffer: A writable byte view of their length to write into; None:
            a new one (not zeroed first: every byte is a part's).

    Returns:
        The buffer.
    """
    if size is None:
        size = sum([len(part) for part in parts])
    if buffer is None:
        buffer = memoryview(np.empty(size, np.uint8))  # type: ignore[arg-type]  # a buffer
    pos = 0
    for part in parts:
        end = pos + len(part)
        if isinstance(part, TakenRows):
            part.take_into(buffer, pos)
        else:
            buffer[pos:end] = part
        pos = end
    return buffer


def gathered(parts: Sequence[Part]) -> list[BytePart]:
    """The parts with rows still to take taken, as byte views (for ``b"".join``)."""
    return [
        memoryview(part.array()).cast("B")  # type: ignore[arg-type]  # ndarray: a buffer
        if isinstance(part, TakenRows)
        else part
        for part in parts
    ]


def read_tensor(buf: ByteSource, pos: int, end: int, where: str) -> np.ndarray:
    """Decodes the Tensor message in ``buf[pos:end]`` as a read-only view.

    Accepts any valid encoding: fields in any order, shape packed (in one or
    several runs) or not, unknown fields skipped; a repeated scalar field
    keeps its last value, as in protobuf.

    Args:
        buf: Bytes or a read-only byte memoryview.
        pos: Offset of the Tensor message.
        end: Offset after it.
        where: Name of the tensor, for error messages.

    Returns:
        A read-only array viewing ``buf`` (no copy).

    Raises:
        WireFormatError: If the tensor is malformed (see :func:`view_tensor`).
    """
    data_start, nbytes, dtype_code, shape, codec = tensor_fields(buf, pos, end, where)
    return view_tensor(buf, data_start, nbytes, dtype_code, shape, codec=codec, where=where)


def tensor_fields(
    buf: ByteSource, pos: int, end: int, where: str
) -> tuple[int, int, int, list[int], int]:
    """Where the Tensor message in ``buf[pos:end]`` keeps its data, and what it says.

    Reads only the fields around the data, never the data itself.

    Returns:
        ``(data offset, data length, dtype code, shape, codec)``, unchecked
        (:func:`tensor_layout` checks them).

    Raises:
        WireFormatError: If the message is malformed.
    """
    canonical = _read_canonical_tensor(buf, pos, end, where)
    if canonical is not None:
        dtype_code, shape, data_start = canonical
        return data_start, end - data_start, dtype_code, shape, _CODEC_NONE
    dtype_code = 0
    codec = 0
    shape = []
    data_start = data_end = pos
    for number, wire_type, value, next_pos in iter_fields(buf, pos, end, where):
        if number == _TENSOR_DATA:
            if wire_type != LEN:
                raise wire_type_error(where, "data", wire_type, "bytes")
            data_start, data_end = value, next_pos
        elif number == _TENSOR_DTYPE:
            if wire_type != VARINT:
                raise wire_type_error(where, "dtype", wire_type, "varint")
            dtype_code = value
        elif number == _TENSOR_SHAPE:
            if wire_type == LEN:
                _read_packed_int64(buf, value, next_pos, shape, where)
            elif wire_type == VARINT:
                shape.append(to_int64(value))
            else:
                raise wire_type_error(where, "shape", wire_type, "varint or packed")
        elif number == _TENSOR_CODEC:
            if wire_type != VARINT:
                raise wire_type_error(where, "codec", wire_type, "varint")
            codec = value
    return data_start, data_end - data_start, dtype_code, shape, codec


def _read_canonical_tensor(
    buf: ByteSource, pos: int, end: int, where: str
) -> tuple[int, list[int], int] | None:
    # The layout protobuf writers produce: dtype (one byte), packed shape
    # (if any), then data running to the end of the message. Recognising it
    # costs a few byte comparisons; any other layout returns None and goes
    # through the general field walker, which gives the same result.
    if end - pos < 2 or buf[pos] != _DTYPE_KEY or buf[pos + 1] >= 0x80:
        return None
    dtype_code = buf[pos + 1]
    pos += 2
    shape: list[int] = []
    if pos + 1 < end and buf[pos] == _SHAPE_KEY and buf[pos + 1] < 0x80:
        start = pos + 2
        pos = start + buf[pos + 1]
        if pos > end:
            return None
        dims = bytes(buf[start:pos])
        if dims.isascii():  # every dimension below 128: one byte each
            shape = list(dims)
        else:
            _read_packed_int64(buf, start, pos, shape, where)
    if pos == end:
        return dtype_code, shape, end
    if buf[pos] != _DATA_KEY:
        return None
    length, start = read_varint(buf, pos + 1, end, where)
    return (dtype_code, shape, start) if start + length == end else None


def _read_packed_int64(buf: ByteSource, pos: int, end: int, out: list[int], where: str) -> None:
    while pos < end:
        value, pos = read_varint(buf, pos, end, where)
        out.append(to_int64(value))


def view_tensor(
    buf: ByteSource,
    offset: int,
    nbytes: int,
    dtype_code: int,
    shape: list[int],
    *,
    codec: int = _CODEC_NONE,
    where: str,
) -> np.ndarray:
    """Checks a tensor's fields and views its data in ``buf`` without a copy.

    Args:
        buf: The buffer holding the data.
        offset: Offset of the data in ``buf``.
        nbytes: Length of the data.
        dtype_code: The DType enum value.
        shape: The dimensions.
        codec: The Codec enum value.
        where: Name of the tensor, for error messages.

    Returns:
        An array of ``shape`` viewing ``buf[offset:offset + nbytes]``;
        read-only when ``buf`` is.

    Raises:
        WireFormatError: For an unknown dtype or codec, a negative or huge
            shape, a data length other than prod(shape) * itemsize, or a
            bool tensor holding bytes other than 0 and 1.
    """
    dtype, count = tensor_layout(nbytes, dtype_code, shape, codec, where)
    array = np.ndarray(shape, dtype, buffer=buf, offset=offset)
    if dtype_code == _DTYPE_BOOL and count and not _small_bools_ok(buf, offset, count):
        error = bad_bool(np.ndarray(count, np.uint8, buffer=buf, offset=offset), where)
        if error is not None:
            raise error
    return array


def tensor_layout(
    nbytes: int, dtype_code: int, shape: list[int], codec: int, where: str
) -> tuple[np.dtype, int]:
    """Checks a tensor's fields against its data length: its dtype and element count.

    Raises:
        WireFormatError: As :func:`view_tensor` (the bool values aside).
    """
    dtype = DTYPES.get(dtype_code) or dtype_of_code(dtype_code, where)
    if codec != _CODEC_NONE:
        raise WireFormatError(
            f"{where}: unknown codec {codec}; protocol v1 only has CODEC_NONE (0)"
        )
    if len(shape) == 1 and 0 < shape[0] <= MAX_ELEMENTS:  # most tensors: one C-level check
        count = shape[0]
    else:
        count = element_count(shape, where)
    expected = count * dtype.itemsize
    if nbytes != expected:
        raise WireFormatError(
            f"{where}: {nbytes} bytes of data, expected {expected} for "
            f"{dtype.name} shape {tuple(shape)}"
        )
    return dtype, count


def bad_bool(raw: np.ndarray, where: str, first: int = 0) -> WireFormatError | None:
    """The error for a bool tensor's bytes ``raw`` (element ``first`` on) if one is not 0 or 1."""
    if not (raw > 1).any():
        return None
    index = int(np.argmax(raw > 1))
    return WireFormatError(
        f"{where}: bool tensor holds byte {raw[index]} at element {first + index}; "
        "bools must be 0 or 1"
    )


def _small_bools_ok(buf: ByteSource, offset: int, count: int) -> bool:
    """Whether a short bool tensor's bytes are all 0 or 1, checked without numpy
    (a step reply's terminated/truncated: ~0.2 us instead of ~2); False for a
    long one or a bad byte (numpy checks it then)."""
    if count > _SMALL_BOOLS:
        return False
    return not bytes(memoryview(buf)[offset : offset + count]).translate(None, b"\x00\x01")


#: Bool tensors up to this many bytes are checked by _small_bools_ok.
_SMALL_BOOLS = 4096


def element_count(shape: list[int], where: str) -> int:
    """prod(shape), after checking every dimension; nothing is allocated.

    Raises:
        WireFormatError: For a negative dimension, more than :data:`MAX_NDIM`
            dimensions, or more than :data:`MAX_ELEMENTS` elements (zero
            dimensions aside, so that numpy cannot overflow either).
    """
    if len(shape) <= MAX_NDIM and (not shape or min(shape) > 0):
        count = math.prod(shape)
        if count <= MAX_ELEMENTS:
            return count
    if len(shape) > MAX_NDIM:
        raise WireFormatError(f"{where}: {len(shape)} dimensions, at most {MAX_NDIM} are supported")
    nonzero = 1
    for dim in shape:
        if dim < 0:
            raise WireFormatError(f"{where}: negative dimension in shape {tuple(shape)}")
        if dim:
            nonzero *= dim
            if nonzero > MAX_ELEMENTS:
                raise WireFormatError(
                    f"{where}: shape {tuple(shape)} is too large "
                    f"(more than {MAX_ELEMENTS} elements)"
                )
    return nonzero if all(shape) else 0


def write_tensor_map(
    tree: Mapping[str, Any],
    field_number: int,
    out: list[Part],
    where: str,
    *,
    omit_empty: bool = True,
) -> int:
    """Appends a TensorMap, as field ``field_number`` of its parent, to ``out``.

    Byte-identical to protobuf's serialization of the same map.

    Args:
        tree: Names to arrays or nested mappings, in the order to send.
        field_number: Field number of the TensorMap in the enclosing message.
        out: The list of parts being built.
        where: Name of the map, for error messages.
        omit_empty: Write nothing for an empty map (a batch's info dict:
            absent reads back as empty). Nested maps are always written,
            since an entry needs a value.

    Returns:
        The number of bytes appended.

    Raises:
        WireFormatError: For a key that is not a non-empty string or an
            array whose dtype cannot travel.
    """
    if omit_empty and not tree:
        return 0
    body: list[Part] = []
    size = 0
    for key, value in tree.items():
        path = f"{where}[{key!r}]"
        key_field = encode_key_field(key, where)
        entry: list[Part] = [key_field]
        if isinstance(value, Mapping):
            value_size = write_tensor_map(value, _ENTRY_MAP, entry, path, omit_empty=False)
        else:
            value_size = write_tensor(value, _ENTRY_TENSOR, entry, path)
        size += _write_message(_MAP_ENTRIES, entry, len(key_field) + value_size, body)
    return _write_message(field_number, body, size, out)


def _write_message(field_number: int, body: list[Part], size: int, out: list[Part]) -> int:
    # Appends a message field whose serialized body (`size` bytes) is `body`.
    prefix = len_prefix(field_number, size)
    out.append(prefix)
    out.extend(body)
    return len(prefix) + size


def read_tensor_map(
    buf: ByteSource, pos: int, end: int, where: str, read: TensorReader | None = None
) -> TensorDict:
    """Decodes the TensorMap in ``buf[pos:end]``; arrays are read-only views.

    ``read`` reads each tensor (default :func:`read_tensor`); the map's
    structure is checked the same whatever it returns.

    Raises:
        WireFormatError: For a malformed entry, an empty or duplicate key, an
            entry with no value or with both a tensor and a nested map, or a
            malformed tensor.
    """
    result: TensorDict = {}
    for number, wire_type, value, next_pos in iter_fields(buf, pos, end, where):
        if number != _MAP_ENTRIES:
            continue
        if wire_type != LEN:
            raise wire_type_error(where, "entries", wire_type, "message")
        key, item = _read_entry(buf, value, next_pos, where, read or read_tensor)
        if key in result:
            raise WireFormatError(f"{where}: duplicate key {key!r}; keys must be unique")
        result[key] = item
    return result


def _read_entry(
    buf: ByteSource, pos: int, end: int, where: str, read: TensorReader
) -> tuple[str, np.ndarray | TensorDict]:
    fields = _read_canonical_entry(buf, pos, end, where) or _read_any_entry(buf, pos, end, where)
    key_span, value_field, value_start, value_end = fields
    key = _decode_key(buf, key_span, where)
    path = f"{where}[{key!r}]"
    if value_field == _ENTRY_TENSOR:
        return key, read(buf, value_start, value_end, path)
    if value_field == _ENTRY_MAP:
        return key, read_tensor_map(buf, value_start, value_end, path, read)
    raise WireFormatError(f"{path}: the entry has neither a tensor nor a map")


# (key span, value field number or 0, value start, value end)
_EntryFields: TypeAlias = tuple[tuple[int, int] | None, int, int, int]


def _read_canonical_entry(buf: ByteSource, pos: int, end: int, where: str) -> _EntryFields | None:
    # protobuf's layout: the key (shorter than 128 bytes), then the value
    # running to the end of the entry. Anything else returns None.
    if end - pos < 2 or buf[pos] != _KEY_KEY or buf[pos + 1] >= 0x80:
        return None
    key_end = pos + 2 + buf[pos + 1]
    if key_end >= end:
        return None
    value_field = buf[key_end] >> 3
    if buf[key_end] & 7 != LEN or value_field not in (_ENTRY_TENSOR, _ENTRY_MAP):
        return None
    length, start = read_varint(buf, key_end + 1, end, where)
    if start + length != end:
        return None
    return (pos + 2, key_end), value_field, start, end


def _read_any_entry(buf: ByteSource, pos: int, end: int, where: str) -> _EntryFields:
    key_span: tuple[int, int] | None = None
    value_field = value_start = value_end = 0
    for number, wire_type, value, next_pos in iter_fields(buf, pos, end, where):
        if number not in _ENTRY_NAMES:
            continue
        if wire_type != LEN:
            raise wire_type_error(where, _ENTRY_NAMES[number], wire_type, "length-delimited")
        if number == _ENTRY_KEY:
            key_span = (value, next_pos)
        elif value_field:
            # A oneof set twice: protobuf would keep (or merge into) the last
            # one; no rlfleet sender does that, so it is a corrupt message.
            raise WireFormatError(
                f"{where}: an entry sets its value more than once "
                f"({_ENTRY_NAMES[value_field]} then {_ENTRY_NAMES[number]})"
            )
        else:
            value_field, value_start, value_end = number, value, next_pos
    return key_span, value_field, value_start, value_end


_ENTRY_NAMES = {_ENTRY_KEY: "key", _ENTRY_TENSOR: "tensor", _ENTRY_MAP: "map"}


def _decode_key(buf: ByteSource, span: tuple[int, int] | None, where: str) -> str:
    if span is None or span[0] == span[1]:
        raise WireFormatError(f"{where}: an entry has an empty key; keys must be non-empty")
    try:
        return str(buf[span[0] : span[1]], "utf-8")
    except UnicodeDecodeError as error:
        raise WireFormatError(f"{where}: an entry key is not valid UTF-8 ({error})") from None


__all__ = [
    "MAX_ELEMENTS",
    "MAX_NDIM",
    "BytePart",
    "Part",
    "TensorDict",
    "gathered",
    "join_parts",
    "read_tensor",
    "read_tensor_map",
    "tensor_fields",
    "tensor_layout",
    "view_tensor",
    "write_tensor",
    "write_tensor_map",
]
