"""A worker's result message read by hand: its header and chunk, no protobuf objects.

Every result a worker sends crosses the coordinator as a ``WorkerMessage``
holding an ``EpisodeResult`` (worker.proto) whose chunk is most of its
bytes. :func:`~rlfleet.wire.envelope.parse_with_chunk` walks the message
down to the chunk, rebuilds the rest without it and lets protobuf parse
that: about 20 Python calls and two protobuf objects per result.
:func:`read_result_message` reads the same message in one walk when it is
written the way protobuf (and every rlfleet worker) writes it: fields in
ascending order, each once, none at its default, the episode columns packed,
every varint in its shortest form. Those bytes mean exactly what the general
path reads from them, and the header's ``wire`` (the ``EpisodeResult``
without its chunk, passed on to the learner) is then a slice of them, as
protobuf would write it again. Anything else (other fields, another order,
unknown fields, anything malformed) returns None, and the caller takes the
general path, which reads it or raises with its own text
(``tests/test_result_message.py`` holds both to the same answers).
"""

from __future__ import annotations

import re
from typing import TypeAlias

import numpy as np
from google.protobuf.message import DecodeError

from rlfleet._util.prebuilt import prebuilt
from rlfleet.v1 import worker_pb2
from rlfleet.wire._chunk import Chunk
from rlfleet.wire._protowire import (
    as_byte_source,
    encode_varint,
    len_prefix,
    packed_varints,
    to_int64,
)
from rlfleet.wire.results import ResultHeader

#: What a result is read from: a worker's message (bytes, or a view of a data
#: frame's receive buffer), a learner's frame (a view).
_Bytes: TypeAlias = "bytes | bytearray | memoryview"
_RESULT_NUMBER = 4  # WorkerMessage.result
_RESULT_TAG = _RESULT_NUMBER << 3 | 2  # length-delimited
_TASK_ID_KEY = b"\x08"  # EpisodeResult.task_id (1), a varint
_AGENT_VERSION_KEY = b"\x20"  # EpisodeResult.agent_version (4), a varint
_ENV_GENERATION_KEY = b"\x28"  # EpisodeResult.env_generation (5), a varint
_SAMPLE_RESULT_TAG = 2 << 3 | 2  # SampleResponse.result, length-delimited
_RESULT_CALL_KEY = b"\xc8\x02"  # SampleResponse.result_call (41), a varint
_CHUNK_NUMBER = 7  # EpisodeResult.chunk
_DATA_NUMBER = 6  # BatchChunk.data
# EpisodeResult's fields by number: varints (1, 4, 5, 6) and packed int64 columns (2, 3).
_VARINT_FIELDS = frozenset((1, 4, 5, 6))
_PACKED_FIELDS = frozenset((2, 3))
_UINT32_LIMIT = 1 << 32
_INT32_LIMIT = 1 << 31
# Packed columns this long are read by protobuf's parser (from the header
# without the chunk, a few hundred bytes); shorter ones in a Python loop.
_PROTOBUF_COLUMN_BYTES = 48
# A varint's last byte after a continuation byte is never 0 in its shortest form.
_LONGER_THAN_NEEDED = re.compile(rb"[\x80-\xff]\x00")


def result_fields(
    task_id: int,
    episode_indices: np.ndarray,
    lengths: np.ndarray,
    agent_version: int,
    env_generation: int,
) -> bytes:
    """An ``EpisodeResult``'s fields before its chunk, written as protobuf writes them.

    The form :func:`read_result_message` reads: fields in ascending order,
    none at its default, the columns packed, every varint shortest
    (tests/test_result_message.py holds it to protobuf's own bytes).
    """
    out: list[bytes] = []
    if task_id:
        out += (_TASK_ID_KEY, encode_varint(task_id))
    for number, column in ((2, episode_indices), (3, lengths)):
        packed = packed_varints(column)
        if packed:
            out += (len_prefix(number, len(packed)), packed)
    if agent_version:
        out += (_AGENT_VERSION_KEY, encode_varint(agent_version))
    if env_generation:
        out += (_ENV_GENERATION_KEY, encode_varint(env_generation))
    return b"".join(out)


def result_head(fields: bytes, chunk_size: int) -> bytes:
    """A ``WorkerMessage``'s bytes before its result's chunk of ``chunk_size`` bytes.

    ``fields`` are the result's other fields (:func:`result_fields`); the
    chunk, the last field, follows.
    """
    chunk_key = len_prefix(_CHUNK_NUMBER, chunk_size)
    size = len(fields) + len(chunk_key) + chunk_size
    return len_prefix(_RESULT_NUMBER, size) + fields + chunk_key


def read_result_message(data: _Bytes) -> tuple[ResultHeader, Chunk] | None:
    """A serialized ``WorkerMessage`` holding only a result, read in one walk.

    Args:
        data: The message's bytes, or a view of them (the chunk's data stays
            a read-only view of them).

    Returns:
        The result's header (with ``wire`` on chunk 0, as
        :func:`rlfleet.coordinator.worker_messages.parse_worker_message`
        keeps it) and its chunk; None for any message not written in
        protobuf's own form, to be read by the general path.

    Raises:
        WireFormatError: If ``data`` is not a contiguous buffer.
    """
    buf = as_byte_source(data)
    read = _read_result(buf, _RESULT_TAG, keep_wire=True)
    if read is None or read[2] != len(buf):
        return None
    return read[0], read[1]


def read_result_frame(
    data: bytes | bytearray | memoryview,
) -> tuple[int, ResultHeader, Chunk] | None:
    """A learner's results-connection frame holding a result, read in one walk.

    The frame is a ``SampleResponse`` (learner.proto) as the coordinator
    writes it: its ``result`` (an ``EpisodeResult``, read as
    :func:`read_result_message` reads a worker's), then its ``result_call``.

    Args:
        data: The frame (the chunk's data stays a view of it).

    Returns:
        The call's number, the result's header (``wire`` empty, as
        ``ResultHeader.of`` leaves it) and its chunk; None for any other
        frame, or one not written in protobuf's own form, to be read by the
        general path.
    """
    read = _read_result(data, _SAMPLE_RESULT_TAG, keep_wire=False)
    if read is None:
        return None
    header, chunk, pos = read
    size = len(data)
    if data[pos : pos + 2] != _RESULT_CALL_KEY:
        return None
    call, end = _varint(data, pos + 2, size)
    if call <= 0 or end != size:
        return None  # not the shortest form, 0 (protobuf omits it), or more fields
    return call, header, chunk


def _read_result(
    data: _Bytes, tag: int, *, keep_wire: bool
) -> tuple[ResultHeader, Chunk, int] | None:
    """The ``EpisodeResult`` field at the start of ``data`` (key ``tag``): its
    header, its chunk and the offset past it; None for anything not written in
    protobuf's own form."""
    size = len(data)
    if size < 2 or data[0] != tag:
        return None
    length, pos = _varint(data, 1, size)
    if length < 0 or pos + length > size:
        return None
    body_start = pos
    size = pos + length  # the result's end: the loop reads up to it
    scalars = [0, 0, 0, 0, 0, 0, 0]  # by field number: task_id, -, -, agent_version, ...
    columns: list[tuple[int, ...]] = [(), (), (), ()]  # episode_indices (2), lengths (3)
    last = 0
    chunk: Chunk | None = None
    chunk_at = size
    long_columns = False
    while pos < size:
        key = data[pos]
        number = key >> 3
        if key >= 0x80 or number <= last or number > _CHUNK_NUMBER:
            return None
        wire_type = key & 7
        at = pos
        # A varint of one or two bytes (most of a result's) is read here, without a call.
        value = data[pos + 1] if pos + 1 < size else 0x80
        if value < 0x80:
            pos += 2
        else:
            high = data[pos + 2] if pos + 2 < size else 0
            if 0 < high < 0x80:
                value = (value & 0x7F) | high << 7
                pos += 3
            else:
                value, pos = _varint(data, pos + 1, size)
        if number in _VARINT_FIELDS:
            if wire_type != 0 or value <= 0:
                return None  # malformed, not its shortest form, or 0 (protobuf omits zeros)
            scalars[number] = value
        else:
            length, body = value, pos
            if wire_type != 2 or length <= 0 or body + length > size:
                return None
            if number == _CHUNK_NUMBER:
                chunk_at = at
                chunk = _chunk(data, body, body + length)
                if chunk is None:
                    return None
            elif length >= _PROTOBUF_COLUMN_BYTES:
                if data[body + length - 1] >= 0x80 or _LONGER_THAN_NEEDED.search(
                    data, body, body + length
                ):
                    return None  # truncated, or a varint longer than it needs
                long_columns = True  # protobuf's parser reads them below
            else:
                column = _column(data, body, body + length)
                if column is None:
                    return None
                columns[number] = column
            pos = body + length
        last = number
    if chunk is None:
        return None  # a result without its chunk: the general path says so
    # The chunk is the last field: the rest is before it.
    wire = bytes(data[body_start:chunk_at]) if keep_wire or long_columns else b""
    if long_columns:
        try:
            meta = worker_pb2.EpisodeResult.FromString(wire)
        except DecodeError:
            return None  # a varint past 10 bytes: the general path says so
        columns[2], columns[3] = tuple(meta.episode_indices), tuple(meta.lengths)
    header = prebuilt(  # every field checked above
        ResultHeader,
        task_id=scalars[1],
        worker_id=scalars[6],
        episode_indices=columns[2],
        lengths=columns[3],
        agent_version=to_int64(scalars[4]),
        env_generation=scalars[5],
        wire=wire if keep_wire and chunk.index == 0 else b"",
    )
    return header, chunk, size


def _varint(data: _Bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the offset after it; -1 if it is truncated,
    longer than 10 bytes or not in its shortest form."""
    if pos < end:
        first = data[pos]
        if first < 0x80:
            return first, pos + 1
        # Two bytes (a result's sizes and indices of up to 16,383), without the loop.
        second = data[pos + 1] if pos + 1 < end else 0
        if 0 < second < 0x80:
            return (first & 0x7F) | second << 7, pos + 2
    value = shift = 0
    start = pos
    while pos < end and pos - start < 10:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 or value >= 1 << 64:
                return -1, pos  # a trailing zero byte: not the shortest form
            return value, pos
        shift += 7
    return -1, pos


def _column(data: _Bytes, pos: int, end: int) -> tuple[int, ...] | None:
    """A packed column of int64 values (every varint shortest, none negative)."""
    packed = bytes(data[pos:end])
    if packed.isascii():  # every value one byte (a result's lengths of up to 127 steps)
        return tuple(packed)
    # One loop over the bytes, no call per value (a result's episode indices).
    values = []
    value = shift = 0
    for byte in packed:
        if byte < 0x80:
            if shift and not byte:
                return None  # a trailing zero byte: not the shortest form
            value |= byte << shift
            if value >= 1 << 63:
                return None  # negative: the general path reads those
            values.append(value)
            value = shift = 0
        else:
            value |= (byte & 0x7F) << shift
            shift += 7
            if shift == 70:
                return None  # longer than 10 bytes
    if shift:
        return None  # truncated
    return tuple(values)


def _chunk(data: _Bytes, pos: int, end: int) -> Chunk | None:
    """The BatchChunk in ``data[pos:end]`` (its data a view), or None."""
    values = [0, 0, 0, 0, 0]  # batch_id, index, count, total_bytes, kind
    last = 0
    payload: memoryview | bytes = b""
    while pos < end:
        key = data[pos]
        number = key >> 3
        if key >= 0x80 or number <= last or number > _DATA_NUMBER:
            return None
        if number == _DATA_NUMBER:
            length, body = _varint(data, pos + 1, end)
            if key & 7 != 2 or length <= 0 or body + length != end:
                return None
            payload = memoryview(data)[body:end].toreadonly()  # as the general path's
            if payload.format != "B":
                payload = payload.cast("B")  # as Chunk's constructor leaves it
            pos = end
        else:
            value = data[pos + 1] if pos + 1 < end else 0x80
            if value < 0x80:  # one byte or two, read without a call
                pos += 2
            else:
                high = data[pos + 2] if pos + 2 < end else 0
                if 0 < high < 0x80:
                    value = (value & 0x7F) | high << 7
                    pos += 3
                else:
                    value, pos = _varint(data, pos + 1, end)
            if key & 7 != 0 or value <= 0:
                return None
            values[number - 1] = value
        last = number
    batch_id, index, count, total_bytes, kind = values
    if index >= _UINT32_LIMIT or count >= _UINT32_LIMIT or kind >= _INT32_LIMIT:
        return None  # protobuf would cut these to 32 bits: the general path reads them
    if not 0 <= index < count or len(payload) > total_bytes:
        return None  # the general path raises with its text
    # Chunk's own checks are the ones above: its constructor would make them again.
    return prebuilt(
        Chunk,
        batch_id=batch_id,
        index=index,
        count=count,
        total_bytes=total_bytes,
        kind=kind,
        data=payload,
    )


__all__ = ["read_result_frame", "read_result_message", "result_fields", "result_head"]
