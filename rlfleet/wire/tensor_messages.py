"""Tensors and tensor maps as protobuf objects (``rlfleet.v1.Tensor`` / ``TensorMap``).

For small tensors in control messages (policy parameters, space bounds,
lease calls); batches use the hand-written codec of
:mod:`rlfleet.wire.tensors`, whose checks these share (dtypes and keys
of :mod:`rlfleet.wire._tensor_header`, shapes, sizes, bool bytes).
Decoded arrays are read-only numpy views of the message's bytes.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.errors import WireFormatError
from rlfleet.v1 import tensor_pb2
from rlfleet.wire._tensor_header import DTYPES, dtype_code, encode_key_field, wire_array
from rlfleet.wire.tensors import TensorDict, view_tensor


def encode_tensor(array: np.ndarray) -> tensor_pb2.Tensor:
    """Builds a ``rlfleet.v1.Tensor`` message from an array.

    For small tensors in control messages; batches use the hand-written
    codec (:func:`rlfleet.wire.encode_batch`), which does not copy the data
    through protobuf objects. Non-contiguous arrays are made C-contiguous and
    big-endian ones little-endian; any shape works, including 0-d and empty.

    Args:
        array: An array of one of tensor.proto's DType types (bool, int8 to
            int64, uint8 to uint64, float16, float32, float64).

    Returns:
        The Tensor message (its data is a copy of the array's bytes).

    Raises:
        WireFormatError: If the dtype cannot travel.
    """
    tensor = tensor_pb2.Tensor()
    encode_tensor_into(tensor, array)
    return tensor


def encode_tensor_into(tensor: tensor_pb2.Tensor, array: np.ndarray) -> None:
    """Sets an empty Tensor message's fields from an array, as :func:`encode_tensor` builds them.

    For a Tensor field of a message being built (``encode_tensor_into(call.actions,
    a)``): no Tensor is built apart and copied in (``CopyFrom``).

    Raises:
        WireFormatError: If the dtype cannot travel.
    """
    array = wire_array(array)
    tensor.dtype = dtype_code(array.dtype)  # type: ignore[assignment]
    tensor.shape.extend(array.shape)
    tensor.data = array.tobytes()


def decode_tensor(msg: tensor_pb2.Tensor, *, name: str = "Tensor") -> np.ndarray:
    """Decodes a ``rlfleet.v1.Tensor`` message into an array.

    The result is a read-only view of the message's data bytes
    (``np.frombuffer`` semantics, no copy): call ``.copy()`` to modify it.

    Args:
        msg: The Tensor message.
        name: What the tensor is, for error messages.

    Returns:
        A read-only array with the tensor's dtype (little-endian) and shape.

    Raises:
        WireFormatError: If the tensor is malformed: unknown dtype or codec,
            negative or huge dimensions, a data length other than
            prod(shape) * itemsize, or a bool byte other than 0 and 1.
    """
    data = msg.data
    return view_tensor(data, 0, len(data), msg.dtype, list(msg.shape), codec=msg.codec, where=name)


def _cast(view: memoryview, fmt: str) -> memoryview:
    """``view.cast(fmt)`` (typeshed types only the "c" format)."""
    return view.cast(fmt)  # type: ignore[call-overload]


def _list_formats() -> dict[int, str]:
    # struct formats (memoryview.cast) of the dtypes, on a little-endian host,
    # where the wire's byte order is the native one; none elsewhere (numpy then).
    formats: dict[int, str] = {}
    for code, dtype in DTYPES.items():
        fmt = str(dtype.char)
        try:
            if _cast(memoryview(bytes(dtype.itemsize)), fmt).itemsize == dtype.itemsize:
                formats[code] = fmt
        except ValueError:  # a format memoryview does not cast to (float16)
            pass
    return formats if sys.byteorder == "little" else {}


_LIST_FORMATS = _list_formats()
#: Longest tensor decode_tensor_list reads without numpy.
_SHORT_LIST = 4096


def decode_tensor_list(msg: tensor_pb2.Tensor, *, name: str = "Tensor") -> tuple[int, list[Any]]:
    """A 1-D tensor's length and values as Python numbers (``tolist`` of :func:`decode_tensor`).

    A short per-env column (a step's rewards or flags) is read with
    ``memoryview.cast``, without numpy (~1 us instead of ~2-2.5); anything
    else, and every malformed tensor, goes through :func:`decode_tensor`,
    with its checks and errors.

    Returns:
        ``(length, values)``; ``length`` is -1 for a tensor that is not 1-D
        (its values are then the flattened ones).

    Raises:
        WireFormatError: As :func:`decode_tensor`.
    """
    data = msg.data
    shape = msg.shape
    fmt = _LIST_FORMATS.get(msg.dtype)
    if fmt is not None and len(shape) == 1 and msg.codec == tensor_pb2.CODEC_NONE:
        count = shape[0]
        if (
            0 < count <= _SHORT_LIST
            and len(data) == count * DTYPES[msg.dtype].itemsize
            and (fmt != "?" or not data.translate(None, b"\x00\x01"))
        ):
            return count, _cast(memoryview(data), fmt).tolist()
    array = decode_tensor(msg, name=name)
    values: list[Any] = array.reshape(-1).tolist()
    return (array.shape[0] if array.ndim == 1 else -1), values


def encode_tensor_map(tree: Mapping[str, Any]) -> tensor_pb2.TensorMap:
    """Builds a ``rlfleet.v1.TensorMap`` from a (nested) dict of arrays.

    Args:
        tree: Non-empty string keys to arrays or nested mappings; their order
            is kept.

    Returns:
        The TensorMap message.

    Raises:
        WireFormatError: For an empty or non-string key or a dtype that
            cannot travel.
    """
    entries = []
    for key, value in tree.items():
        encode_key_field(key, "TensorMap")
        if isinstance(value, Mapping):
            entries.append(tensor_pb2.TensorMapEntry(key=key, map=encode_tensor_map(value)))
        else:
            entries.append(tensor_pb2.TensorMapEntry(key=key, tensor=encode_tensor(value)))
    return tensor_pb2.TensorMap(entries=entries)


def copy_tensor_map(tree: Mapping[str, Any]) -> TensorDict:
    """A copy of a (nested) dict of arrays, as :func:`encode_tensor_map` would send it.

    Every array is converted to the form it travels in (a wire dtype,
    little-endian, C-contiguous) and owns its data: the caller may change
    the arrays it passed, the copy stays what it was.

    Raises:
        WireFormatError: As :func:`encode_tensor_map`, for a key or a dtype
            that cannot travel.
    """
    copied: TensorDict = {}
    for key, value in tree.items():
        encode_key_field(key, "TensorMap")
        if isinstance(value, Mapping):
            copied[key] = copy_tensor_map(value)
            continue
        array = wire_array(value)
        if array is value or array.base is not None:  # not a fresh array of its own
            array = array.copy()
        copied[key] = array
    return copied


def decode_tensor_map(msg: tensor_pb2.TensorMap, *, name: str = "TensorMap") -> TensorDict:
    """Decodes a ``rlfleet.v1.TensorMap`` into a (nested) dict of arrays.

    Keys keep their wire order; arrays are read-only views (see
    :func:`decode_tensor`).

    Args:
        msg: The TensorMap message.
        name: What the map is, for error messages.

    Returns:
        A dict of arrays and nested dicts.

    Raises:
        WireFormatError: For an empty or duplicate key, an entry without a
            value, or a malformed tensor.
    """
    result: TensorDict = {}
    for entry in msg.entries:
        if not entry.key:
            raise WireFormatError(f"{name}: an entry has an empty key; keys must be non-empty")
        if entry.key in result:
            raise WireFormatError(f"{name}: duplicate key {entry.key!r}; keys must be unique")
        path = f"{name}[{entry.key!r}]"
        which = entry.WhichOneof("value")
        if which == "tensor":
            result[entry.key] = decode_tensor(entry.tensor, name=path)
        elif which == "map":
            result[entry.key] = decode_tensor_map(entry.map, name=path)
        else:
            raise WireFormatError(f"{path}: the entry has neither a tensor nor a map")
    return result


__all__ = [
    "copy_tensor_map",
    "decode_tensor",
    "decode_tensor_list",
    "decode_tensor_map",
    "encode_tensor",
    "encode_tensor_into",
    "encode_tensor_map",
]
