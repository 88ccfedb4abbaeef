"""Tensors and tensor maps: exact bytes, round trips, both decode paths, errors.

Every tensor is decoded two ways, through protobuf's classes
(``decode_tensor``) and by hand (``read_tensor``), and both must agree.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.errors import WireFormatError
from rlfleet.v1 import tensor_pb2
from rlfleet.wire import (
    MAX_ELEMENTS,
    decode_tensor,
    decode_tensor_list,
    decode_tensor_map,
    encode_tensor,
    encode_tensor_map,
)
from rlfleet.wire._protowire import read_varint
from rlfleet.wire._tensor_header import rows_header, tensor_header
from rlfleet.wire.tensors import (
    Part,
    gathered,
    read_tensor,
    read_tensor_map,
    write_tensor,
    write_tensor_map,
)

WIRE_DTYPES = ("?", "i1", "<i2", "<i4", "<i8", "u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8")

# int16 [[1, 2, 3], [4, 5, -1]], by hand: dtype INT16 (3); packed shape 2, 3;
# 12 bytes of little-endian data.
INT16_ARRAY = np.array([[1, 2, 3], [4, 5, -1]], dtype=np.int16)
INT16_BYTES = (
    b"\x08\x03" + b"\x12\x02\x02\x03" + b"\x1a\x0c\x01\x00\x02\x00\x03\x00\x04\x00\x05\x00\xff\xff"
)


def hand_encode(array: Any) -> bytes:
    """The Tensor bytes written by hand (without the enclosing field prefix)."""
    return without_prefix(write_tensor, array)


def without_prefix(write: Callable[..., int], value: Any) -> bytes:
    """Writes ``value`` as field 1 and strips the field's tag and length."""
    out: list[Part] = []
    size = write(value, 1, out, "m")
    data = b"".join(gathered(out))
    assert size == len(data)
    length, start = read_varint(data, 1, len(data), "test")
    assert start + length == len(data)
    return data[start:]


def hand_decode(data: bytes, where: str = "t") -> np.ndarray:
    return read_tensor(data, 0, len(data), where)


def decoders() -> list[Callable[[bytes], np.ndarray]]:
    """Both decode paths, taking the serialized Tensor."""
    return [
        lambda data: decode_tensor(tensor_pb2.Tensor.FromString(data), name="t"),
        hand_decode,
    ]


def wire_bytes(array: np.ndarray) -> bytes:
    """What a tensor's data must be: C order, little-endian."""
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays of every wire dtype and any small shape, bits drawn at random.

    Float arrays hold arbitrary bit patterns (NaN payloads, infinities,
    subnormals); layouts include Fortran order, strided views and big-endian.
    """
    dtype = np.dtype(draw(st.sampled_from(WIRE_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    count = math.prod(shape)
    if dtype.kind == "b":
        array = np.array(draw(st.lists(st.booleans(), min_size=count, max_size=count)), dtype)
    else:
        raw = draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
        array = np.frombuffer(raw, dtype).copy()
    array = array.reshape(shape)
    layout = draw(st.sampled_from(["c", "fortran", "strided", "big-endian"]))
    if layout == "fortran":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = np.repeat(array, 2, axis=-1)[..., ::2]
    elif layout == "big-endian":
        array = array.astype(dtype.newbyteorder(">"))
    return array


# ----------------------------------------------------------------- bytes


def test_int16_tensor_bytes_match_the_hand_computed_encoding() -> None:
    assert encode_tensor(INT16_ARRAY).SerializeToString() == INT16_BYTES
    assert hand_encode(INT16_ARRAY) == INT16_BYTES


def test_scalar_and_empty_tensors_omit_empty_fields() -> None:
    # A 0-d float64: dtype 12, no shape, 8 bytes of data.
    scalar = np.float64(1.5)
    expected = b"\x08\x0c\x1a\x08" + np.array(1.5).tobytes()
    assert hand_encode(np.array(scalar)) == expected
    assert encode_tensor(np.array(scalar)).SerializeToString() == expected
    # A (0, 3) uint8: dtype 6, shape 0, 3, no data.
    empty = np.zeros((0, 3), np.uint8)
    assert hand_encode(empty) == b"\x08\x06\x12\x02\x00\x03"
    assert encode_tensor(empty).SerializeToString() == b"\x08\x06\x12\x02\x00\x03"


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(tensor_pb2.DType.values())[1:]),
    st.lists(st.integers(0, 2**20), max_size=3).map(tuple),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
)
def test_a_header_for_a_number_of_rows_is_the_tensor_header_of_that_shape(
    code: int, row_shape: tuple[int, ...], rows: int, nbytes: int
) -> None:
    # A result layout's headers for new numbers of rows, built from bytes
    # worked out once per dtype and row shape: what the writer writes.
    assert rows_header(code, row_shape)(rows, nbytes) == tensor_header(
        code, (rows, *row_shape), nbytes
    )


def test_big_endian_and_strided_input_travel_little_endian_in_c_order() -> None:
    big = INT16_ARRAY.astype(">i2")
    assert hand_encode(big) == INT16_BYTES
    fortran = np.asfortranarray(INT16_ARRAY)
    assert encode_tensor(fortran).SerializeToString() == INT16_BYTES
    strided = np.repeat(INT16_ARRAY, 2, axis=1)[:, ::2]
    assert not strided.flags.c_contiguous
    assert hand_encode(strided) == INT16_BYTES


@settings(max_examples=150, deadline=None)
@given(arrays())
def test_arrays_round_trip_bit_exactly_on_both_paths(array: np.ndarray) -> None:
    data = hand_encode(array)
    assert encode_tensor(array).SerializeToString() == data
    for decode in decoders():
        decoded = decode(data)
        assert decoded.dtype == array.dtype.newbyteorder("<")
        assert decoded.shape == array.shape
        assert decoded.tobytes() == wire_bytes(array)
        assert not decoded.flags.writeable


def test_hand_decoding_views_the_input_without_copying() -> None:
    data = b"\x00" * 5 + INT16_BYTES
    decoded = read_tensor(data, 5, len(data), "t")
    np.testing.assert_array_equal(decoded, INT16_ARRAY)
    assert np.shares_memory(decoded, np.frombuffer(data, np.uint8))
    assert not decoded.flags.writeable


def test_decoded_tensors_are_read_only_even_from_a_bytearray() -> None:
    from rlfleet.wire._protowire import as_byte_source

    buf = as_byte_source(bytearray(INT16_BYTES))
    decoded = read_tensor(buf, 0, len(buf), "t")
    with pytest.raises(ValueError, match="read-only"):
        decoded[0, 0] = 9


# ------------------------------------------- other valid encodings of a Tensor


@pytest.mark.parametrize(
    "data",
    [
        # unpacked shape
        b"\x08\x03\x10\x02\x10\x03" + INT16_BYTES[6:],
        # packed shape in two runs
        b"\x08\x03\x12\x01\x02\x12\x01\x03" + INT16_BYTES[6:],
        # fields in reverse order, explicit CODEC_NONE
        b"\x20\x00" + INT16_BYTES[6:] + INT16_BYTES[2:6] + INT16_BYTES[:2],
        # dtype given twice: the last one counts, as in protobuf
        b"\x08\x05" + INT16_BYTES,
        # unknown varint, fixed64, fixed32, bytes and group fields interleaved
        b"\x48\x07"
        + INT16_BYTES[:2]
        + b"\x51"
        + bytes(8)
        + INT16_BYTES[2:6]
        + b"\x5d\x00\x00\x00\x00"
        + b"\x62\x02hi"
        + b"\x6b\x08\x01\x6c"
        + INT16_BYTES[6:],
        # a non-minimal (two-byte) dtype varint
        b"\x08\x83\x00" + INT16_BYTES[2:],
    ],
    ids=["unpacked", "two-runs", "reversed", "repeated-dtype", "unknown-fields", "long-varint"],
)
def test_any_valid_encoding_decodes_to_the_same_array(data: bytes) -> None:
    for decode in decoders():
        decoded = decode(data)
        assert decoded.dtype == np.dtype("<i2")
        np.testing.assert_array_equal(decoded, INT16_ARRAY)


# ----------------------------------------------------------------- errors


def tensor_bytes(**fields: Any) -> bytes:
    return tensor_pb2.Tensor(**fields).SerializeToString()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            tensor_bytes(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[3, 4], data=bytes(40)),
            r"t: 40 bytes of data, expected 48 for float32 shape \(3, 4\)",
        ),
        (tensor_bytes(shape=[1], data=b"\x00"), r"no dtype \(DTYPE_UNSPECIFIED\)"),
        (tensor_bytes(dtype=13, shape=[1], data=b"\x00"), "unknown dtype 13"),
        (
            tensor_bytes(dtype=tensor_pb2.DTYPE_UINT8, data=b"\x00", codec=1),
            "unknown codec 1",
        ),
        (tensor_bytes(dtype=tensor_pb2.DTYPE_UINT8, shape=[-1]), "negative dimension"),
        (
            tensor_bytes(dtype=tensor_pb2.DTYPE_UINT8, shape=[2**40, 2**40]),
            "too large",
        ),
        (tensor_bytes(dtype=tensor_pb2.DTYPE_UINT8, shape=[0, 2**62]), "too large"),
        (tensor_bytes(dtype=tensor_pb2.DTYPE_UINT8, shape=[1] * 33), "33 dimensions"),
        (
            tensor_bytes(dtype=tensor_pb2.DTYPE_BOOL, shape=[3], data=b"\x01\x00\x02"),
            "holds byte 2 at element 2",
        ),
    ],
    ids=[
        "length",
        "unspecified",
        "unknown-dtype",
        "codec",
        "negative",
        "huge",
        "huge-zero-size",
        "ndim",
        "bool",
    ],
)
def test_malformed_tensors_are_rejected_on_both_paths(data: bytes, message: str) -> None:
    for decode in decoders():
        with pytest.raises(WireFormatError, match=message):
            decode(data)


@pytest.mark.parametrize("count", [1, 8, 4096, 4097, 20_000])
def test_bool_bytes_other_than_0_and_1_are_rejected_short_and_long(count: int) -> None:
    # Short bool tensors are checked without numpy, long ones with it.
    good = bytes([0, 1]) * (count // 2) + bytes(count % 2)
    for decode in decoders():
        data = tensor_bytes(dtype=tensor_pb2.DTYPE_BOOL, shape=[count], data=good)
        assert decode(data).tolist() == [bool(b) for b in good]
        for index in {0, count - 1}:
            bad = bytearray(good)
            bad[index] = 7
            data = tensor_bytes(dtype=tensor_pb2.DTYPE_BOOL, shape=[count], data=bytes(bad))
            with pytest.raises(WireFormatError, match=f"holds byte 7 at element {index}"):
                decode(data)


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
@pytest.mark.parametrize("shape", [(1,), (8,), (5000,), (0,), (2, 3), ()])
def test_decode_tensor_list_gives_what_decode_tensor_gives(
    dtype: str, shape: tuple[int, ...]
) -> None:
    # Short 1-D tensors are read without numpy; the values and their Python
    # types must be numpy's tolist() either way.
    array = (np.arange(math.prod(shape)) % 2).astype(dtype).reshape(shape)
    tensor = encode_tensor(array)
    length, values = decode_tensor_list(tensor, name="t")
    want = decode_tensor(tensor, name="t").reshape(-1).tolist()
    assert values == want and [type(v) for v in values] == [type(v) for v in want]
    assert length == (shape[0] if len(shape) == 1 else -1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dtype": tensor_pb2.DTYPE_BOOL, "shape": [3], "data": bytes([0, 2, 1])}, "holds byte 2"),
        ({"dtype": tensor_pb2.DTYPE_FLOAT64, "shape": [3], "data": bytes(16)}, "16 bytes of data"),
        ({"dtype": tensor_pb2.DTYPE_FLOAT64, "shape": [2], "data": bytes(16), "codec": 9}, "codec"),
    ],
)
def test_decode_tensor_list_refuses_what_decode_tensor_refuses(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(WireFormatError, match=message):
        decode_tensor_list(tensor_pb2.Tensor(**fields), name="t")


def test_huge_shapes_are_rejected_before_anything_is_allocated() -> None:
    # 2**40 float64 elements would be 8 TiB: the check must come first.
    data = tensor_bytes(dtype=tensor_pb2.DTYPE_FLOAT64, shape=[2**20, 2**20, 2])
    with pytest.raises(WireFormatError, match=f"more than {MAX_ELEMENTS} elements"):
        hand_decode(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x0a\x01\x03" + INT16_BYTES[2:], r"t.dtype: expected a varint field, got length"),
        (INT16_BYTES[:6] + b"\x18\x00", r"t.data: expected a bytes field, got varint"),
        (b"\x15\x00\x00\x00\x00" + INT16_BYTES[2:], r"t.shape: expected a varint or packed"),
        (INT16_BYTES + b"\x22\x00", r"t.codec: expected a varint field"),
        (INT16_BYTES[:-1], "runs past the end"),
        (INT16_BYTES[:3] + b"\x82", "truncated varint"),
        (b"\x08\x03\x12\x02\x02", "runs past the end"),
    ],
    ids=["dtype-wire", "data-wire", "shape-wire", "codec-wire", "truncated", "cut-shape", "short"],
)
def test_hand_decoding_rejects_malformed_framing(data: bytes, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        hand_decode(data)


@pytest.mark.parametrize("cut", range(len(INT16_BYTES)))
def test_every_truncation_raises_wire_format_error(cut: int) -> None:
    with pytest.raises(WireFormatError):
        hand_decode(INT16_BYTES[:cut])


@pytest.mark.parametrize(
    "value", [np.zeros(2, np.complex64), np.array(["a"]), np.array([None]), np.zeros(1, "M8[s]")]
)
def test_unsupported_dtypes_are_refused_with_their_name(value: np.ndarray) -> None:
    with pytest.raises(WireFormatError, match=re.escape(f"dtype {value.dtype} cannot travel")):
        encode_tensor(value)
    with pytest.raises(WireFormatError, match=r"infos\['x'\]: dtype"):
        write_tensor_map({"x": value}, 1, [], "infos")


# ------------------------------------------------------------- tensor maps

NESTED = {
    "zeta": np.arange(3, dtype=np.float32),
    "alpha": {"inner": np.array([True, False]), "deeper": {"x": np.int64(7)}},
    "mid": np.zeros((0, 2), np.uint16),
    "empty": {},  # an entry holding an empty map still has a value
}


def assert_trees_identical(got: Any, expected: Any) -> None:
    assert list(got) == list(expected)
    for key, value in expected.items():
        if isinstance(value, dict):
            assert_trees_identical(got[key], value)
        else:
            array = np.asarray(value)
            assert got[key].dtype == array.dtype.newbyteorder("<")
            assert got[key].shape == array.shape
            assert got[key].tobytes() == wire_bytes(array)


def test_tensor_map_bytes_match_the_hand_computed_encoding() -> None:
    # {"a": True}: entry = key "a" (0a 01 61) + tensor (12 05: 08 01 1a 01 01).
    entry = b"\x0a\x01a" + b"\x12\x05" + b"\x08\x01\x1a\x01\x01"
    expected = b"\x0a" + bytes([len(entry)]) + entry
    assert encode_tensor_map({"a": np.array(True)}).SerializeToString() == expected
    out: list[Part] = []
    write_tensor_map({"a": np.array(True)}, 7, out, "m")
    assert b"".join(gathered(out)) == b"\x3a" + bytes([len(expected)]) + expected


def test_nested_maps_round_trip_in_order_on_both_paths() -> None:
    msg = encode_tensor_map(NESTED)
    data = msg.SerializeToString()
    assert without_prefix(write_tensor_map, NESTED) == data
    assert_trees_identical(decode_tensor_map(msg), NESTED)
    assert_trees_identical(read_tensor_map(data, 0, len(data), "m"), NESTED)


def test_an_empty_map_is_written_as_nothing() -> None:
    out: list[Part] = []
    assert write_tensor_map({}, 3, out, "m") == 0
    assert out == []
    assert decode_tensor_map(encode_tensor_map({})) == {}


def entry(key: str, **value: Any) -> tensor_pb2.TensorMapEntry:
    return tensor_pb2.TensorMapEntry(key=key, **value)


SCALAR = encode_tensor(np.array(1, np.int8))


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (
            tensor_pb2.TensorMap(entries=[entry("a", tensor=SCALAR), entry("a", tensor=SCALAR)]),
            "duplicate key 'a'",
        ),
        (tensor_pb2.TensorMap(entries=[entry("", tensor=SCALAR)]), "empty key"),
        (tensor_pb2.TensorMap(entries=[entry("a")]), r"m\['a'\]: the entry has neither"),
        (
            tensor_pb2.TensorMap(
                entries=[entry("a", map=tensor_pb2.TensorMap(entries=[entry("b")]))]
            ),
            r"m\['a'\]\['b'\]: the entry has neither",
        ),
        (
            tensor_pb2.TensorMap(
                entries=[entry("a", tensor=tensor_pb2.Tensor(dtype=tensor_pb2.DTYPE_INT8))]
            ),
            r"m\['a'\]: 0 bytes of data, expected 1 for int8 shape \(\)",
        ),
    ],
    ids=["duplicate", "empty-key", "no-value", "nested-no-value", "bad-tensor"],
)
def test_malformed_maps_are_rejected_on_both_paths(msg: tensor_pb2.TensorMap, message: str) -> None:
    with pytest.raises(WireFormatError, match=message):
        decode_tensor_map(msg, name="m")
    data = msg.SerializeToString()
    with pytest.raises(WireFormatError, match=message):
        read_tensor_map(data, 0, len(data), "m")


def test_hand_decoding_rejects_an_entry_setting_two_values() -> None:
    # key "a", tensor, then map: protobuf would keep the map; rlfleet refuses.
    tensor = SCALAR.SerializeToString()
    body = b"\x0a\x01a" + b"\x12" + bytes([len(tensor)]) + tensor + b"\x1a\x00"
    data = b"\x0a" + bytes([len(body)]) + body
    with pytest.raises(WireFormatError, match=r"more than once \(tensor then map\)"):
        read_tensor_map(data, 0, len(data), "m")


def test_hand_decoding_accepts_value_before_key_and_unknown_fields() -> None:
    tensor = SCALAR.SerializeToString()
    body = b"\x12" + bytes([len(tensor)]) + tensor + b"\x28\x05" + b"\x0a\x01a"
    data = b"\x10\x01" + b"\x0a" + bytes([len(body)]) + body
    decoded = read_tensor_map(data, 0, len(data), "m")
    assert list(decoded) == ["a"]
    assert decoded["a"] == 1


def test_hand_decoding_rejects_invalid_utf8_keys() -> None:
    tensor = SCALAR.SerializeToString()
    body = b"\x0a\x01\xff" + b"\x12" + bytes([len(tensor)]) + tensor
    data = b"\x0a" + bytes([len(body)]) + body
    with pytest.raises(WireFormatError, match="not valid UTF-8"):
        read_tensor_map(data, 0, len(data), "m")


@pytest.mark.parametrize("key", ["", 3, "\udc80"])
def test_encoding_rejects_keys_that_cannot_travel(key: Any) -> None:
    with pytest.raises(WireFormatError, match="key"):
        encode_tensor_map({key: np.zeros(1)})
    with pytest.raises(WireFormatError, match="key"):
        write_tensor_map({key: np.zeros(1)}, 1, [], "m")
