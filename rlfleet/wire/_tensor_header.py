"""What a tensor is on the wire before its data (``rlfleet.v1.Tensor`` / ``TensorMap``).

tensor.proto's DType codes and the little-endian dtypes they stand for (an
array converted to one to travel), and the bytes written before a tensor's
data (its dtype, packed shape and data length) and before a TensorMap
entry's value (its key field), worked out once per shape and key. The hand
codec (:mod:`rlfleet.wire.tensors`), the protobuf path
(:mod:`rlfleet.wire.tensor_messages`), spaces and a result layout's bytes
(:mod:`rlfleet.wire._layout_frames`) share them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from rlfleet.errors import WireFormatError
from rlfleet.v1 import tensor_pb2
from rlfleet.wire._protowire import LEN, VARINT, encode_varint, len_prefix, tag

#: tensor.proto's DType values and the little-endian dtypes they stand for.
DTYPES: dict[int, np.dtype] = {
    tensor_pb2.DTYPE_BOOL: np.dtype("?"),
    tensor_pb2.DTYPE_INT8: np.dtype("i1"),
    tensor_pb2.DTYPE_INT16: np.dtype("<i2"),
    tensor_pb2.DTYPE_INT32: np.dtype("<i4"),
    tensor_pb2.DTYPE_INT64: np.dtype("<i8"),
    tensor_pb2.DTYPE_UINT8: np.dtype("u1"),
    tensor_pb2.DTYPE_UINT16: np.dtype("<u2"),
    tensor_pb2.DTYPE_UINT32: np.dtype("<u4"),
    tensor_pb2.DTYPE_UINT64: np.dtype("<u8"),
    tensor_pb2.DTYPE_FLOAT16: np.dtype("<f2"),
    tensor_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    tensor_pb2.DTYPE_FLOAT64: np.dtype("<f8"),
}
# Keyed by little-endian dtypes, which on a little-endian host are the
# native ones, so the usual lookup is one dict hit.
_CODES: dict[np.dtype, int] = {dtype: code for code, dtype in DTYPES.items()}

# Field numbers of tensor.proto.
_TENSOR_DTYPE, _TENSOR_SHAPE, _TENSOR_DATA, _TENSOR_CODEC = 1, 2, 3, 4
_MAP_ENTRIES = 1
_ENTRY_KEY, _ENTRY_TENSOR, _ENTRY_MAP = 1, 2, 3

_DTYPE_TAG = tag(_TENSOR_DTYPE, VARINT)
_DATA_TAG = tag(_TENSOR_DATA, LEN)
_SHAPE_TAG = tag(_TENSOR_SHAPE, LEN)
_DTYPE_HEADERS = {code: _DTYPE_TAG + encode_varint(code) for code in DTYPES}


def wire_dtype(dtype: np.dtype) -> np.dtype:
    """The little-endian dtype a tensor of ``dtype`` travels as.

    Raises:
        WireFormatError: If the DType enum has no such type.
    """
    little = dtype.newbyteorder("<")
    if little not in _CODES:
        supported = ", ".join(str(d.name) for d in DTYPES.values())
        raise WireFormatError(
            f"dtype {dtype} cannot travel as a tensor; supported: {supported}. "
            "Convert the array with astype first"
        )
    return little


def dtype_code(dtype: np.dtype, where: str = "") -> int:
    """The DType enum value of ``dtype`` (any byte order).

    Raises:
        WireFormatError: If the DType enum has no such type.
    """
    code = _CODES.get(dtype)
    if code is not None:
        return code
    try:
        return _CODES[wire_dtype(dtype)]
    except WireFormatError as error:
        raise WireFormatError(f"{where}: {error}" if where else str(error)) from None


def dtype_of_code(code: int, where: str) -> np.dtype:
    """The little-endian numpy dtype of a DType enum value.

    Raises:
        WireFormatError: For DTYPE_UNSPECIFIED or a value the enum lacks.
    """
    dtype = DTYPES.get(code)
    if dtype is None:
        what = "no dtype (DTYPE_UNSPECIFIED)" if code == 0 else f"unknown dtype {code}"
        raise WireFormatError(f"{where}: {what}; protocol v1 knows DType values 1..{len(DTYPES)}")
    return dtype


def wire_array(value: Any, where: str = "tensor") -> np.ndarray:
    """``value`` as a C-contiguous little-endian array of a wire dtype.

    Returns the array itself when it already is one (the usual case), else a
    converted copy.

    Args:
        value: An array, or anything ``np.asarray`` takes.
        where: Name of the value, for error messages.

    Raises:
        WireFormatError: If the dtype is not one of tensor.proto's DType enum.
    """
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.dtype not in _CODES:
        try:
            little = wire_dtype(array.dtype)
        except WireFormatError as error:
            raise WireFormatError(f"{where}: {error}") from None
        array = array.astype(little)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array


# Batches of a stream repeat the same few shapes, so headers are cached.
@lru_cache(maxsize=4096)
def tensor_header(code: int, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The bytes of a Tensor before its data: dtype ``code``, ``shape``, data length."""
    header = _DTYPE_HEADERS[code]
    if shape:
        packed = b"".join([encode_varint(dim) for dim in shape])
        header += len_prefix(_TENSOR_SHAPE, len(packed)) + packed
    if nbytes:
        header += _DATA_TAG + encode_varint(nbytes)
    return header


@lru_cache(maxsize=256)
def rows_header(code: int, row_shape: tuple[int, ...]) -> Callable[[int, int], bytes]:
    """:func:`tensor_header` of ``(rows, *row_shape)`` as a function of ``rows``
    and ``nbytes``, the bytes that depend on neither worked out once: a
    result layout asks for every new number of rows, which the cache of
    :func:`tensor_header` never holds (a per-env worker's step counts)."""
    lead, rest, data = rows_header_parts(code, row_shape)

    def header(rows: int, nbytes: int) -> bytes:
        packed = encode_varint(rows) + rest
        head = lead + encode_varint(len(packed)) + packed
        return head + data + encode_varint(nbytes) if nbytes else head

    return header


def rows_header_parts(code: int, row_shape: tuple[int, ...]) -> tuple[bytes, bytes, bytes]:
    """The fixed bytes of :func:`rows_header`'s headers: those before the packed
    shape's length, the row shape's varints after the rows', and the data's
    tag (written before the data's length when there is data)."""
    packed_rest = b"".join(map(encode_varint, row_shape))
    return _DTYPE_HEADERS[code] + _SHAPE_TAG, packed_rest, _DATA_TAG


def encode_key_field(key: object, where: str) -> bytes:
    """The encoded key field of a TensorMap entry.

    Raises:
        WireFormatError: If the key is not a non-empty string of valid UTF-8.
    """
    if not isinstance(key, str) or not key:
        raise WireFormatError(
            f"{where}: keys must be non-empty strings, got {key!r}; rename the entry"
        )
    try:
        return _encoded_key_field(key)
    except UnicodeEncodeError as error:
        raise WireFormatError(f"{where}: key {key!r} is not valid UTF-8 text ({error})") from None


@lru_cache(maxsize=4096)
def _encoded_key_field(key: str) -> bytes:
    encoded = key.encode("utf-8")
    return len_prefix(_ENTRY_KEY, len(encoded)) + encoded


__all__ = [
    "DTYPES",
    "dtype_code",
    "dtype_of_code",
    "encode_key_field",
    "rows_header",
    "rows_header_parts",
    "tensor_header",
    "wire_array",
    "wire_dtype",
]
