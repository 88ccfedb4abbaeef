"""Chunking: a serialized batch cut into ``rlfleet.v1.BatchChunk`` pieces.

A batch larger than the message limit is serialized once and sent as
chunks whose data are consecutive slices of that serialization
(batch.proto). Cutting makes no copies: every :class:`Chunk` holds a
memoryview of the one serialized buffer. Reassembly copies each chunk once
into a buffer of the announced size (:class:`ChunkAssembler`), or nothing
at all for a single-chunk batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeAlias, cast

import numpy as np
from google.protobuf.message import Message

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, ResourceExhaustedError, WireFormatError
from rlfleet.v1 import batch_pb2
from rlfleet.wire._chunk import Chunk, chunk_header
from rlfleet.wire._protowire import varint_size
from rlfleet.wire.batches import (
    Batch,
    WritableBatch,
    batch_parts,
    batch_type_of,
    decode_batch,
    encode_batch,
    payload_kind,
)
from rlfleet.wire.envelope import parse_chunk, wrap_chunk
from rlfleet.wire.tensors import BytePart, Part, gathered, join_parts

#: Default most bytes of one serialized BatchChunk. gRPC refuses messages
#: over 4 MiB by default, and 1-4 MiB messages stream faster than larger ones.
DEFAULT_CHUNK_BYTES = 1 << 20
#: Most bytes of one serialized BatchChunk of a result sent on the lease data
#: channel (framed TCP, no gRPC message cost): every frame costs the
#: coordinator a wake-up, a parse and a hand-off to its result lane, and
#: a result of one chunk is written, checked and placed without joining or
#: gathering, so a result of up to 8 MiB (about 280 Atari-sized frames)
#: travels as one frame (docs/protocol.md, "Chunking").
DATA_CHANNEL_CHUNK_BYTES = 8 << 20
#: Most bytes of a result message's metadata around its chunk on the lease
#: data channel (task, episode indices and lengths, versions: a few bytes
#: per episode, so about 100,000 episodes in one result message).
DATA_CHANNEL_METADATA_BYTES = 1 << 20
#: Most bytes of one result message a coordinator forwards to a learner on
#: either carrier: a data-channel chunk, its metadata, and the few fields the
#: coordinator adds (the worker's id, the call's number, the envelope). A
#: learner accepts result messages up to this size whatever its own message
#: limit (docs/protocol.md, "Chunking"); the coordinator refuses a worker's
#: data-channel result above the two bounds it is made of.
FORWARDED_RESULT_BYTES = DATA_CHANNEL_CHUNK_BYTES + DATA_CHANNEL_METADATA_BYTES + 256

_UINT32_MAX = (1 << 32) - 1

#: A finished payload: bytes, or a read-only byte memoryview.
Payload: TypeAlias = bytes | memoryview
#: A finished payload left in the pieces it came in (``keep_pieces``).
Pieces: TypeAlias = tuple[memoryview, ...]


def _header_allowance(
    total_bytes: int, max_bytes: int, batch_id: int, count: int, kind: int
) -> int:
    # An upper bound on the header of any chunk of such a batch: fields 1-5
    # (one-byte tags) at their largest (index <= count - 1), then the data
    # field's tag and a length of at most max_bytes.
    fields = (batch_id, count - 1, count, total_bytes, kind)
    return sum(1 + varint_size(value) for value in fields) + 1 + varint_size(max_bytes)


def chunk_payload(
    payload: bytes | memoryview,
    *,
    kind: int,
    max_bytes: int = DEFAULT_CHUNK_BYTES,
    batch_id: int = 0,
) -> list[Chunk]:
    """Cuts a serialized batch into chunks of at most ``max_bytes`` each.

    No copies: each chunk's data is a memoryview slice of ``payload``.

    Args:
        payload: The serialized batch.
        kind: Its ``PayloadKind`` value.
        max_bytes: Most bytes of each serialized BatchChunk message,
            header included. Leave room for the message carrying the chunk
            (e.g. EpisodeResult) below the transport's limit.
        batch_id: The id of the batch.

    Returns:
        The chunks, in order; one (possibly empty) chunk for an empty payload.

    Raises:
        ConfigError: If ``max_bytes`` leaves no room for data after the
            chunk header, or the batch would need more than 2**32-1 chunks.
    """
    view = memoryview(payload)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    total = len(view)
    count, room = _layout(total, max_bytes, batch_id, kind)
    return [
        Chunk(batch_id, index, count, total, kind, view[index * room : (index + 1) * room])
        for index in range(count)
    ]


def _layout(total: int, max_bytes: int, batch_id: int, kind: int) -> tuple[int, int]:
    """(number of chunks, data bytes per chunk) of a ``total``-byte payload."""
    # Bound the header with the largest possible count first, then tighten
    # with the count that bound gives: a smaller count never needs more room.
    count = max(total, 1)
    for _ in range(2):
        room = max_bytes - _header_allowance(total, max_bytes, batch_id, count, kind)
        if room < 1:
            raise ConfigError(
                f"max_bytes={max_bytes} is too small: a BatchChunk header alone needs "
                f"up to {max_bytes - room} bytes; use at least a few KiB "
                f"(default {DEFAULT_CHUNK_BYTES})"
            )
        count = max(-(-total // room), 1)
    if count > _UINT32_MAX:
        raise ConfigError(
            f"a {total}-byte batch in chunks of {room} bytes needs {count} chunks, "
            "more than a uint32 can count; raise max_bytes"
        )
    return count, room


def serialize_batch_messages(
    batch: WritableBatch,
    envelope: Callable[[int], Message],
    path: Sequence[str],
    *,
    max_bytes: int = DEFAULT_CHUNK_BYTES,
    batch_id: int = 0,
    include_env_spec: bool = True,
) -> tuple[list[bytes], int]:
    """Serializes a batch straight into the messages that carry its chunks.

    The bytes of message i are exactly those of
    ``serialize_with_chunk(envelope(i), path, chunks[i])`` for the chunks
    of :func:`encode_batch_chunks`, but the batch's data is copied once,
    from its arrays into each message, with no serialized payload in
    between: half the copying and the peak memory of that path.

    Args:
        batch: An EpisodeBatch or TimeStepBatch, or the
            ``EpisodePieces`` of an EpisodeBatch (rlfleet/core/_pieces.py)
            (then its pieces are copied once, into the messages, and the
            bytes are those of the joined batch).
        envelope: Returns the envelope of chunk i, its chunk field unset
            (see :func:`~rlfleet.wire.serialize_with_chunk`).
        path: Field names from the envelope down to its BatchChunk field.
        max_bytes: Most bytes of each serialized BatchChunk message.
        batch_id: The id to stamp on the chunks.
        include_env_spec: Whether to embed the EnvSpec (see
            :func:`rlfleet.wire.encode_batch`).

    Returns:
        The serialized messages, in chunk order, and the size of the whole
        serialized batch (``total_bytes`` of its chunks).

    Raises:
        ConfigError: If ``max_bytes`` is too small to carry any data.
        WireFormatError: If the batch or an envelope cannot be serialized.
    """
    parts = gathered(batch_parts(batch, include_env_spec=include_env_spec))
    chunks, total = _chunked(parts, type(batch), max_bytes, batch_id)
    messages = [
        b"".join(wrap_chunk(envelope(index), path, [header, *cast(Sequence[BytePart], data)]))
        for index, (header, data, _) in enumerate(chunks)
    ]
    return messages, total


def serialize_batch_behind(
    batch: WritableBatch,
    head: Callable[[int, int], bytes],
    *,
    max_bytes: int = DEFAULT_CHUNK_BYTES,
    batch_id: int = 0,
    include_env_spec: bool = True,
    allocate: Callable[[int], memoryview] | None = None,
) -> tuple[list[memoryview], int]:
    """:func:`serialize_batch_messages` with each message's envelope written by the caller.

    Each message is ``head(i, size)`` followed by chunk i (a serialized
    BatchChunk of ``size`` bytes): the envelope's own fields and the chunk
    field's key and length, the chunk being the envelope's last field, as
    protobuf writes it. A batch of one chunk is written straight into its
    one message, its :class:`~rlfleet.core._pieces.TakenRows` gathered
    there (:func:`rlfleet.wire.tensors.join_parts`): its step data is
    copied once, from the worker's ring into the message.

    ``allocate(size)``, if given, returns the writable byte view each
    message is written into (a sender's reused memory); else each message
    is a new buffer.

    Returns:
        The messages, in chunk order, and the size of the whole serialized batch.

    Raises:
        ConfigError: If ``max_bytes`` is too small to carry any data.
        WireFormatError: If the batch cannot be serialized.
    """
    chunks, total = _chunked(
        batch_parts(batch, include_env_spec=include_env_spec), type(batch), max_bytes, batch_id
    )
    messages = []
    for index, (header, data, size) in enumerate(chunks):
        before = head(index, len(header) + size)
        message: list[Part] = [before, header, *data]
        length = len(before) + len(header) + size
        messages.append(join_parts(message, length, None if allocate is None else allocate(length)))
    return messages, total


def _chunked(
    parts: Sequence[Part], batch_type: type, max_bytes: int, batch_id: int
) -> tuple[list[tuple[bytes, Sequence[Part], int]], int]:
    """A serialized batch's chunks: (header, data parts, data size) each, and the batch's size.

    One chunk keeps the parts as they are, so rows still to take are
    gathered straight into its message; more are cut from the parts made
    bytes (:func:`_cut`).
    """
    total = sum([len(part) for part in parts])
    kind = payload_kind(batch_type)
    count, room = _layout(total, max_bytes, batch_id, kind)
    runs: Iterable[Sequence[Part]] = [parts] if count == 1 else _cut(gathered(parts), room)
    chunks = []
    for index, data in enumerate(runs):
        size = sum([len(piece) for piece in data])
        header = chunk_header(batch_id, index, count, total, kind, data_size=size)
        chunks.append((header, data, size))
    return chunks, total


def _cut(parts: list[Payload], room: int) -> Iterator[list[Payload]]:
    """Regroups byte parts into runs of ``room`` bytes, the last one shorter.

    As many runs as :func:`_layout` counts (one, empty, for no bytes).
    Parts are sliced where a run ends: memoryview slices, no copy.
    """
    run: list[Payload] = []
    free = room
    for part in parts:
        view = part if isinstance(part, memoryview) else memoryview(part)
        while len(view) > free:
            if free:
                run.append(view[:free])
                view = view[free:]
            yield run
            run, free = [], room
        if len(view):
            run.append(view)
            free -= len(view)
    yield run


def encode_batch_chunks(
    batch: Batch,
    max_bytes: int = DEFAULT_CHUNK_BYTES,
    *,
    batch_id: int = 0,
    include_env_spec: bool = True,
) -> list[Chunk]:
    """Serializes a batch once and cuts it into chunks (no further copies).

    Args:
        batch: An EpisodeBatch or TimeStepBatch.
        max_bytes: Most bytes of each serialized BatchChunk message.
        batch_id: The id to stamp on the chunks.
        include_env_spec: Whether to embed the EnvSpec (see
            :func:`rlfleet.wire.encode_batch`).

    Returns:
        The chunks, in order.

    Raises:
        ConfigError: If ``max_bytes`` is too small to carry any data.
        WireFormatError: If the batch cannot be serialized.
    """
    payload = encode_batch(batch, include_env_spec=include_env_spec)
    return chunk_payload(
        payload, kind=payload_kind(type(batch)), max_bytes=max_bytes, batch_id=batch_id
    )


class ChunkAssembler:
    """Reassembles the chunks of one stream, one batch at a time.

    Chunks of a batch must arrive in order (0, 1, ..., count-1) and agree on
    batch_id, count, total_bytes and kind; any violation drops the partial
    batch and raises :class:`~rlfleet.errors.WireFormatError`, after which
    the assembler accepts a new batch starting at chunk 0. Batch ids are not
    required to increase.

    The payload of a multi-chunk batch is one buffer of total_bytes,
    allocated when chunk 0 arrives (after the size limit is checked) and
    filled as chunks arrive: each chunk is copied once, and no chunk needs
    to be kept. A single-chunk batch is returned without a copy.

    One assembler serves one stream and is not thread-safe.

    :meth:`keep` takes chunks as :meth:`add` does, with the same checks,
    but leaves a multi-chunk batch unjoined: its payload is the chunks'
    data as they came (a tuple of views, for
    :func:`rlfleet.wire.scattered.decode_scattered`), so nothing is copied
    and the chunks are kept instead. A stream takes all its chunks one way.

    Args:
        max_total_bytes: Largest batch accepted, or None for no limit.
    """

    def __init__(self, *, max_total_bytes: int | None = None) -> None:
        self.max_total_bytes = max_total_bytes
        self._keep_pieces = False
        self._first: Chunk | None = None
        self._buffer = np.empty(0, np.uint8)
        self._pieces: list[memoryview] = []
        self._filled = 0
        self._next_index = 0

    @property
    def in_progress(self) -> bool:
        """Whether some chunks of a batch have arrived but not the last."""
        return self._first is not None

    @property
    def buffered_bytes(self) -> int:
        """Bytes reserved for the batch being reassembled (0 between batches)."""
        if self._first is None:
            return 0
        return self._filled if self._keep_pieces else len(self._buffer)

    def reset(self) -> None:
        """Drops a partial batch (e.g. when its stream broke)."""
        self._first = None
        self._buffer = np.empty(0, np.uint8)
        self._pieces = []
        self._filled = 0
        self._next_index = 0

    def add(self, chunk: Chunk) -> Payload | None:
        """Takes the next chunk of the stream.

        Args:
            chunk: The chunk.

        Returns:
            The whole serialized batch when ``chunk`` completes it (decode it
            with :func:`rlfleet.wire.decode_batch`, the type given by
            ``chunk.kind``), else None.

        Raises:
            WireFormatError: If the chunk is out of order or disagrees with
                the earlier chunks of its batch, or the chunks' sizes do not
                add up to total_bytes. The partial batch is dropped.
            ResourceExhaustedError: If the batch is larger than
                ``max_total_bytes``.
        """
        payload = self._add(chunk, keep=False)
        return b"".join(payload) if isinstance(payload, tuple) else payload

    def keep(self, chunk: Chunk) -> Payload | Pieces | None:
        """:meth:`add`, a batch of several chunks returned as their data, not joined.

        Raises:
            WireFormatError: As :meth:`add`.
            ResourceExhaustedError: As :meth:`add`.
        """
        return self._add(chunk, keep=True)

    def _add(self, chunk: Chunk, *, keep: bool) -> Payload | Pieces | None:
        """Takes the next chunk; a batch begun by :meth:`keep` is kept in pieces.

        Raises:
            WireFormatError: If the chunk is out of order or disagrees with
                the earlier chunks of its batch, or the chunks' sizes do not
                add up to total_bytes. The partial batch is dropped.
            ResourceExhaustedError: If the batch is larger than
                ``max_total_bytes``.
        """
        try:
            if self._first is None:
                self._keep_pieces = keep
                return self._start(chunk)
            return self._continue(self._first, chunk)
        except (WireFormatError, ResourceExhaustedError):
            self.reset()
            raise

    def _start(self, chunk: Chunk) -> Payload | Pieces | None:
        if chunk.index != 0:
            raise WireFormatError(
                f"chunk {chunk.index} of batch {chunk.batch_id} arrived first: chunk 0 is missing"
            )
        limit = self.max_total_bytes
        if limit is not None and chunk.total_bytes > limit:
            raise ResourceExhaustedError(
                f"batch {chunk.batch_id} is {chunk.total_bytes} bytes, over the limit of "
                f"{limit} bytes; sample fewer steps per request or raise the limit"
            )
        if chunk.count == 1:
            _check_complete(chunk, len(chunk.data))
            return chunk.data
        if not self._keep_pieces:
            # np.empty does not zero the memory (bytearray would): every byte
            # is written by a chunk before the payload is handed out.
            self._buffer = np.empty(chunk.total_bytes, np.uint8)
        self._first = chunk
        self._store(chunk)
        return None

    def _continue(self, first: Chunk, chunk: Chunk) -> Payload | Pieces | None:
        expected = self._next_index
        if chunk.batch_id != first.batch_id:
            raise WireFormatError(
                f"batch {first.batch_id} is incomplete ({expected} of {first.count} chunks "
                f"arrived) but chunk {chunk.index} of batch {chunk.batch_id} came next"
            )
        if chunk.index != expected:
            raise WireFormatError(
                f"chunk {expected} of batch {first.batch_id} missing: got index {chunk.index}"
            )
        for name in ("count", "total_bytes", "kind"):
            if getattr(chunk, name) != getattr(first, name):
                raise WireFormatError(
                    f"chunk {chunk.index} of batch {first.batch_id} says {name}="
                    f"{getattr(chunk, name)}, chunk 0 said {getattr(first, name)}"
                )
        self._store(chunk)
        if chunk.index < first.count - 1:
            return None
        _check_complete(first, self._filled)
        payload = tuple(self._pieces) if self._keep_pieces else self._buffer.data.toreadonly()
        self.reset()
        return payload

    def _store(self, chunk: Chunk) -> None:
        end = self._filled + len(chunk.data)
        total = self._first.total_bytes if self._first is not None else chunk.total_bytes
        if end > total:
            raise WireFormatError(
                f"chunks 0..{chunk.index} of batch {chunk.batch_id} hold {end} bytes, "
                f"more than its total_bytes {total}"
            )
        if self._keep_pieces:
            self._pieces.append(memoryview(chunk.data))
        else:
            self._buffer[self._filled : end] = np.frombuffer(chunk.data, np.uint8)
        self._filled = end
        self._next_index = chunk.index + 1


def _check_complete(chunk: Chunk, size: int) -> None:
    if size != chunk.total_bytes:
        raise WireFormatError(
            f"batch {chunk.batch_id}: its {chunk.count} chunk(s) hold {size} bytes, "
            f"total_bytes says {chunk.total_bytes}"
        )


def as_chunk(item: Chunk | bytes | bytearray | memoryview | batch_pb2.BatchChunk) -> Chunk:
    """A :class:`Chunk` from a Chunk, a BatchChunk message or its serialization."""
    if isinstance(item, Chunk):
        return item
    if isinstance(item, batch_pb2.BatchChunk):
        return Chunk.from_proto(item)
    return parse_chunk(item)


def decode_batch_chunks(
    chunks: Iterable[Chunk | bytes | batch_pb2.BatchChunk],
    *,
    env_spec: EnvSpec | None = None,
) -> Batch:
    """Reassembles and decodes one chunked batch.

    Args:
        chunks: All chunks of the batch, in order: :class:`Chunk` objects,
            BatchChunk messages or serialized BatchChunk messages (parsed
            without copying their data).
        env_spec: The batch's EnvSpec, if it does not carry its own (see
            :func:`rlfleet.wire.decode_batch`).

    Returns:
        The EpisodeBatch or TimeStepBatch the chunks' kind names. Its arrays
        view the joined payload: one copy of the data for several chunks,
        none for a single chunk.

    Raises:
        WireFormatError: If there are no chunks, a chunk is missing,
            reordered, duplicated or inconsistent with the others, chunks
            follow the last one, the sizes do not add up, the kind is
            unknown, or the payload does not decode.
    """
    assembler = ChunkAssembler()
    payload: Payload | None = None
    last: Chunk | None = None
    for item in chunks:
        chunk = as_chunk(item)
        if payload is not None and last is not None:
            raise WireFormatError(
                f"chunk {chunk.index} of batch {chunk.batch_id} follows the last chunk "
                f"({last.count - 1}) of batch {last.batch_id}"
            )
        payload = assembler.add(chunk)
        last = chunk
    if last is None:
        raise WireFormatError("no chunks to decode")
    if payload is None:
        raise WireFormatError(
            f"batch {last.batch_id} ended after chunk {last.index} of {last.count}: "
            f"chunk {last.index + 1} is missing"
        )
    return decode_batch(payload, env_spec=env_spec, kind=batch_type_of(last.kind))


__all__ = [
    "DATA_CHANNEL_CHUNK_BYTES",
    "DATA_CHANNEL_METADATA_BYTES",
    "DEFAULT_CHUNK_BYTES",
    "FORWARDED_RESULT_BYTES",
    "Chunk",
    "ChunkAssembler",
    "chunk_payload",
    "decode_batch_chunks",
    "encode_batch_chunks",
    "serialize_batch_behind",
    "serialize_batch_messages",
]
