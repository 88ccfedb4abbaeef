"""A worker's result message read by hand: its header and chunk, no protobuf objects.

Every result a worker sends crosses the coordinator as a ``WorkerMessage``
holding an ``EpisodeResult`` (worker.proto) whose chunk is most of its
bytes. :func:`~rlfleet.wire.envelope.parse_with_chunk` walks the message
down to the chunk, rebuilds the rest without it and lets protobuf parse
that: about 20 Python calls and two protobuf objects per result.
:func:`read_result_message` reads the same message in one call into a C
extension (``rlfleet/wire/_result_reader.c``) when it is written the way
protobuf (and every rlfleet worker) writes it: fields in ascending order,
each once, none at its default, the episode columns packed, every varint in
its shortest form, no column value negative. Those bytes mean exactly what
the general path reads from them, and the header's ``wire`` (the
``EpisodeResult`` without its chunk, passed on to the learner) is then a
slice of them, as protobuf would write it again. Anything else (other
fields, another order, unknown fields, anything malformed) returns None, and
the caller takes the general path, which reads it or raises with its own
text (``tests/test_result_message.py`` holds both to the same answers).
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet._util.prebuilt import prebuilt_of
from rlfleet.wire._chunk import Chunk
from rlfleet.wire._protowire import as_byte_source, encode_varint, len_prefix, packed_varints
from rlfleet.wire.results import ResultHeader

with compiled("result reader", "rlfleet/wire/_result_reader.c"):
    from rlfleet.wire import _result_reader

#: What a result is read from: a worker's message (bytes, or a view of a data
#: frame's receive buffer), a learner's frame (a view).
_Bytes: TypeAlias = "bytes | bytearray | memoryview"
_RESULT_NUMBER = 4  # WorkerMessage.result
_TASK_ID_KEY = b"\x08"  # EpisodeResult.task_id (1), a varint
_AGENT_VERSION_KEY = b"\x20"  # EpisodeResult.agent_version (4), a varint
_ENV_GENERATION_KEY = b"\x28"  # EpisodeResult.env_generation (5), a varint
_CHUNK_NUMBER = 7  # EpisodeResult.chunk


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
    """A serialized ``WorkerMessage`` holding only a result, read in one call.

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
    try:
        # The header and chunk made in the reader's call, their fields their dicts.
        made = _result_reader.read_message_made(data, ResultHeader, Chunk)
        if made is not NotImplemented:
            return made
        read = _result_reader.read_message(data)  # a view of other items: cast as Chunk casts it
    except (TypeError, BufferError):
        as_byte_source(data)  # raises WireFormatError, saying what the buffer is
        raise
    return None if read is None else _parts(data, read)


def read_result_frame(
    data: bytes | bytearray | memoryview,
) -> tuple[int, ResultHeader, Chunk] | None:
    """A learner's results-connection frame holding a result, read in one call.

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
    # The header and chunk made in the same call, their fields their dicts.
    made = _result_reader.read_frame_made(data, ResultHeader, Chunk)
    if made is not NotImplemented:
        return made
    read = _result_reader.read_frame(data)  # a view of other items: cast as Chunk casts it
    if read is None:
        return None
    return (read[4], *_parts(data, read))


#: :func:`read_result_frame`'s one call, for a reader of many frames (the learner's
#: results connection): ``read_frame_made(data, ResultHeader, Chunk)`` returns its
#: answer, or NotImplemented for a view of other items than bytes (then
#: :func:`read_result_frame` reads it).
read_frame_made = _result_reader.read_frame_made


def read_result_frame_pieces(
    head: _Bytes, data: _Bytes, tail: _Bytes
) -> tuple[int, ResultHeader, Chunk] | None:
    """:func:`read_result_frame` of the frame ``head + data + tail``, not joined.

    A frame handed over in memory (``Fleet.local``) comes in these pieces,
    ``data`` being its chunk's data, a view of the buffer the worker's
    message was received into: the pieces are read where they lie, and the
    chunk's data stays a view of ``data``, with no copy of it.

    Returns:
        What :func:`read_result_frame` returns for the joined frame, or None
        when it returns None or ``data`` is not exactly the chunk's data
        (the joined frame is then for the general path).
    """
    read = _result_reader.read_frame_pieces(head, data, tail)
    if read is None:
        return None
    return (read[4], *_parts(data, read))


def _parts(
    data: _Bytes, read: _result_reader.MessageRead | _result_reader.FrameRead
) -> tuple[ResultHeader, Chunk]:
    """The header and chunk the reader read (and checked), the chunk's data a
    read-only view of ``data``."""
    chunk = read[1]
    start, end = read[2], read[3]
    chunk["data"] = b""  # a chunk without data holds b"", as protobuf's
    if end > start:
        # A frame off the results connection is a memoryview already: sliced
        # as it is (sharing its buffer as a memoryview of it would), no
        # memoryview more, about 500 instructions.
        view = data if type(data) is memoryview else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")  # as Chunk's constructor leaves it
        chunk["data"] = view[start:end].toreadonly()  # as the general path's
    # The constructors' checks are the reader's: they would make them again.
    return prebuilt_of(ResultHeader, read[0]), prebuilt_of(Chunk, chunk)


__all__ = [
    "read_frame_made",
    "read_result_frame",
    "read_result_frame_pieces",
    "read_result_message",
    "result_fields",
    "result_head",
]
