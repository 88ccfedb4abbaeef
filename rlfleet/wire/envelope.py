"""gRPC messages that carry a BatchChunk, without copying the chunk's data.

A chunk travels inside an envelope, e.g. ``WorkerMessage.result.chunk``.
Putting a 1 MiB payload into a protobuf object copies it, and serializing
copies it again; parsing copies it into the object as well. Instead:

* :func:`serialize_with_chunk` serializes the (small) envelope with
  protobuf and appends the hand-encoded chunk. Fields may come in any order
  on the wire, so appending a field to a message's bytes sets it; the
  length of every enclosing message is rewritten to match. The payload is
  copied once, into the returned bytes, which gRPC sends as they are.
* :func:`parse_with_chunk` walks the outer messages' wire format by hand
  down to the chunk, takes its data as a memoryview of the input (no copy),
  and lets protobuf parse the rest, which is small.

A *path* names the chunk field from the envelope down, e.g.
``("result", "chunk")`` for a WorkerMessage; every step is a singular
message field, the last one of type ``rlfleet.v1.BatchChunk``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, cast

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message

from rlfleet.errors import WireFormatError
from rlfleet.v1 import batch_pb2
from rlfleet.wire._chunk import Chunk
from rlfleet.wire._protowire import (
    LEN,
    ByteSource,
    as_byte_source,
    iter_fields,
    len_prefix,
    wire_type_error,
)
from rlfleet.wire.tensors import BytePart

M = TypeVar("M", bound=Message)

_CHUNK_TYPE = batch_pb2.BatchChunk.DESCRIPTOR.full_name
_DATA_NUMBER = batch_pb2.BatchChunk.DATA_FIELD_NUMBER


def serialize_with_chunk(envelope: Message, path: Sequence[str], chunk: Chunk) -> bytes:
    """Serializes ``envelope`` with ``chunk`` set at ``path``.

    The result parses (with protobuf or :func:`parse_with_chunk`) as a copy
    of ``envelope`` whose field at ``path`` holds ``chunk``. ``envelope``
    itself is not modified. When the chunk field comes after every other
    set field at each level (as for ``WorkerMessage.result.chunk``), the
    bytes are exactly protobuf's.

    Args:
        envelope: The outer message, e.g.
            ``WorkerMessage(result=EpisodeResult(task_id=3))``; the chunk
            field at ``path`` must be unset.
        path: Field names from ``envelope`` down to the BatchChunk field,
            e.g. ``("result", "chunk")``; at least one.
        chunk: The chunk to embed; its data is copied once, into the result.

    Returns:
        The serialized envelope.

    Raises:
        WireFormatError: If ``path`` is empty or does not lead to a singular
            BatchChunk field, the chunk field is already set, or a oneof on
            the path already holds another member.
    """
    return b"".join(wrap_chunk(envelope, path, [chunk.header(), chunk.data]))


def wrap_chunk(
    envelope: Message, path: Sequence[str], chunk_parts: list[BytePart]
) -> list[BytePart]:
    """The parts of ``envelope`` serialized around a chunk given as parts.

    ``b"".join`` of the result is :func:`serialize_with_chunk`'s bytes; the
    chunk's parts (its header, then its data in any number of pieces) are
    not copied here.

    Args:
        envelope: As for :func:`serialize_with_chunk`.
        path: As for :func:`serialize_with_chunk`.
        chunk_parts: The serialized BatchChunk, in pieces.

    Returns:
        ``chunk_parts`` with the envelope's bytes put before them.

    Raises:
        WireFormatError: As :func:`serialize_with_chunk`.
    """
    fields = _resolve(type(envelope), tuple(path))
    if not fields:
        raise WireFormatError(
            "serialize_with_chunk needs a non-empty path; a bare chunk serializes "
            "with Chunk.to_bytes()"
        )
    messages = [envelope]
    for field in fields[:-1]:
        messages.append(getattr(messages[-1], field.name))
    for message, field in zip(messages, fields, strict=True):
        _check_oneof(message, field)
    if messages[-1].HasField(fields[-1].name):
        raise WireFormatError(
            f"{_where(envelope, path)} is already set; leave the chunk field empty "
            "and pass the chunk separately"
        )
    size = sum(len(part) for part in chunk_parts)
    parts = list(chunk_parts)
    # Innermost first: each level is the message without the field on the
    # path, then that field with its new length.
    for level in reversed(range(len(fields))):
        message, field = messages[level], fields[level]
        if level == len(fields) - 1:
            body = message.SerializeToString()  # the chunk field is unset
        else:
            stripped = type(message)()
            stripped.CopyFrom(message)
            stripped.ClearField(field.name)
            body = stripped.SerializeToString()
        prefix = len_prefix(field.number, size)
        parts[:0] = [body, prefix]
        size += len(body) + len(prefix)
    return parts


def parse_with_chunk(
    cls: type[M], data: bytes | bytearray | memoryview, path: Sequence[str]
) -> tuple[M, Chunk | None]:
    """Parses an envelope, taking the chunk at ``path`` without a copy.

    Args:
        cls: The envelope's message class, e.g. ``worker_pb2.WorkerMessage``.
        data: The serialized envelope.
        path: Field names from ``cls`` down to the BatchChunk field, e.g.
            ``("result", "chunk")``; an empty path means ``cls`` is
            BatchChunk itself.

    Returns:
        ``(message, chunk)``. ``message`` is the envelope with the chunk
        field cleared (the chunk's data lives only in ``chunk``); ``chunk``
        is None when the envelope has no chunk at ``path`` (e.g. a
        Heartbeat), and otherwise its data is a read-only memoryview of
        ``data``.

    Raises:
        WireFormatError: If the bytes are malformed, a message on the path
            or the chunk's data occurs more than once (protobuf would merge
            them), a field on the path has the wrong wire type, or the chunk
            header is invalid.
    """
    fields = _resolve(cls, tuple(path))
    buf = as_byte_source(data)
    numbers = [field.number for field in fields] + [_DATA_NUMBER]
    spans = _locate(buf, numbers, [*path, "data"], cls.DESCRIPTOR.name)
    if len(spans) < len(fields):
        return _parse(cls, buf, path), None
    message, payload = _split(cls, buf, spans, numbers, path)
    node: Message = message
    parents: list[Message] = []
    for field in fields:
        if not node.HasField(field.name):
            return message, None  # a later oneof member replaced the path
        parents.append(node)
        node = getattr(node, field.name)
    chunk = _chunk(cast(batch_pb2.BatchChunk, node), payload)
    if parents:
        parents[-1].ClearField(fields[-1].name)
    return message, chunk


def parse_chunk(data: bytes | bytearray | memoryview) -> Chunk:
    """Parses a serialized ``rlfleet.v1.BatchChunk``; its data views ``data``.

    Raises:
        WireFormatError: If the bytes are not a valid BatchChunk.
    """
    buf = as_byte_source(data)
    numbers = [_DATA_NUMBER]
    spans = _locate(buf, numbers, ["data"], "BatchChunk")
    header, payload = _split(batch_pb2.BatchChunk, buf, spans, numbers, ())
    return _chunk(header, payload)


def _split(
    cls: type[M],
    buf: ByteSource,
    spans: list[tuple[int, int, int]],
    numbers: list[int],
    path: Sequence[str],
) -> tuple[M, bytes | memoryview]:
    # Parses everything but the chunk's data with protobuf; the data (if
    # `spans` reached it) is returned as a view of `buf`.
    if len(spans) < len(numbers):
        return _parse(cls, buf, path), b""
    start, end = spans[-1][1:]
    return _parse(cls, _without_last(buf, spans, numbers), path), memoryview(buf)[start:end]


def _chunk(header: batch_pb2.BatchChunk, payload: bytes | memoryview) -> Chunk:
    return Chunk(
        header.batch_id, header.index, header.count, header.total_bytes, header.kind, payload
    )


def _locate(
    buf: ByteSource, numbers: list[int], names: list[str], root: str
) -> list[tuple[int, int, int]]:
    # Follows `numbers` down the nested messages. Returns, per level found,
    # (start of the field's tag, start of its payload, end of its payload).
    spans: list[tuple[int, int, int]] = []
    start, end = 0, len(buf)
    for depth, number in enumerate(numbers):
        where = ".".join([root, *names[:depth]])
        found: tuple[int, int, int] | None = None
        pos = start
        for field_number, wire_type, value, next_pos in iter_fields(buf, start, end, where):
            if field_number == number:
                if wire_type != LEN:
                    raise wire_type_error(where, names[depth], wire_type, "length-delimited")
                if found is not None:
                    raise WireFormatError(
                        f"{where}.{names[depth]} occurs more than once; protobuf would merge "
                        "the occurrences, which rlfleet does not accept on the chunk's path"
                    )
                found = (pos, value, next_pos)
            pos = next_pos
        if found is None:
            break
        spans.append(found)
        start, end = found[1], found[2]
    return spans


def _without_last(buf: ByteSource, spans: list[tuple[int, int, int]], numbers: list[int]) -> bytes:
    # The bytes of `buf` minus the innermost field of `spans`, with the
    # lengths of the enclosing messages shrunk to match (innermost first,
    # since a shorter length varint shrinks the level above it too).
    removed = spans[-1][2] - spans[-1][0]
    prefixes: list[bytes] = []
    for (field_start, payload_start, payload_end), number in zip(
        reversed(spans[:-1]), reversed(numbers[: len(spans) - 1]), strict=True
    ):
        new_length = payload_end - payload_start - removed
        prefix = len_prefix(number, new_length)
        prefixes.append(prefix)
        removed = payload_end - field_start - len(prefix) - new_length
    prefixes.reverse()
    view = memoryview(buf)
    parts: list[bytes | memoryview] = []
    previous = 0
    for (field_start, payload_start, _), prefix in zip(spans[:-1], prefixes, strict=True):
        parts += [view[previous:field_start], prefix]
        previous = payload_start
    parts.append(view[previous : spans[-1][0]])
    parts.append(view[spans[-1][2] :])
    return b"".join(parts)


def _parse(cls: type[M], data: ByteSource, path: Sequence[str]) -> M:
    try:
        # protobuf parses any buffer; its stubs only say bytes.
        return cls.FromString(cast(bytes, data))
    except DecodeError as error:
        raise WireFormatError(
            f"{cls.DESCRIPTOR.name} (chunk path {'.'.join(path) or '-'}): "
            f"malformed message: {error}"
        ) from None


def _check_oneof(message: Message, field: FieldDescriptor) -> None:
    oneof = field.containing_oneof
    if oneof is None:
        return
    current = message.WhichOneof(oneof.name)
    if current not in (None, field.name):
        raise WireFormatError(
            f"{type(message).__name__}.{oneof.name} already holds {current!r}; "
            f"cannot also set {field.name!r}"
        )


def _resolve(cls: type[Message], path: tuple[str, ...]) -> tuple[FieldDescriptor, ...]:
    key = (cls.DESCRIPTOR.full_name, path)
    fields = _RESOLVED.get(key)
    if fields is None:
        fields = _RESOLVED[key] = _resolve_uncached(cls, path)
    return fields


# Envelope types and paths are few and fixed: resolved once each.
_RESOLVED: dict[tuple[str, tuple[str, ...]], tuple[FieldDescriptor, ...]] = {}


def _resolve_uncached(cls: type[Message], path: tuple[str, ...]) -> tuple[FieldDescriptor, ...]:
    descriptor: Any = cls.DESCRIPTOR
    fields: list[FieldDescriptor] = []
    for name in path:
        field = descriptor.fields_by_name.get(name)
        if field is None or field.type != FieldDescriptor.TYPE_MESSAGE or field.is_repeated:
            raise WireFormatError(
                f"chunk path {'.'.join(path)!r}: {descriptor.full_name} has no singular "
                f"message field {name!r}"
            )
        fields.append(field)
        descriptor = field.message_type
    if descriptor.full_name != _CHUNK_TYPE:
        raise WireFormatError(
            f"chunk path {'.'.join(path)!r} of {cls.DESCRIPTOR.full_name} leads to "
            f"{descriptor.full_name}, not {_CHUNK_TYPE}"
        )
    return tuple(fields)


def _where(envelope: Message, path: Sequence[str]) -> str:
    return ".".join([type(envelope).__name__, *path])


__all__ = ["parse_chunk", "parse_with_chunk", "serialize_with_chunk"]
