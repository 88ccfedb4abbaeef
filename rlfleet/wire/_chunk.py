"""The Chunk type: one piece of a serialized batch (``rlfleet.v1.BatchChunk``)."""

from __future__ import annotations

from dataclasses import dataclass

from rlfleet.errors import WireFormatError
from rlfleet.v1 import batch_pb2
from rlfleet.wire._protowire import VARINT, encode_varint, len_prefix, tag

_UINT32_MAX = (1 << 32) - 1
_UINT64_MAX = (1 << 64) - 1
_INT32_RANGE = range(-(1 << 31), 1 << 31)

# BatchChunk field numbers.
_BATCH_ID, _INDEX, _COUNT, _TOTAL_BYTES, _KIND, _DATA = 1, 2, 3, 4, 5, 6
_HEADER_TAGS = tuple(tag(number, VARINT) for number in range(_BATCH_ID, _KIND + 1))


@dataclass(frozen=True)
class Chunk:
    """One piece of a serialized batch (``rlfleet.v1.BatchChunk``).

    Attributes:
        batch_id: The batch this piece belongs to (unique per sender and
            stream).
        index: 0-based position of the piece.
        count: Number of pieces of the batch, >= 1.
        total_bytes: Size of the whole serialized batch.
        kind: A ``PayloadKind`` value: what the joined bytes decode to.
        data: The piece's bytes; a memoryview into the serialized batch when
            made by :func:`encode_batch_chunks` or parsed by
            :func:`rlfleet.wire.parse_with_chunk` (no copies).

    Raises:
        WireFormatError: If a field is out of its protobuf range, ``index``
            is not below ``count``, or ``data`` is longer than
            ``total_bytes``.
    """

    batch_id: int
    index: int
    count: int
    total_bytes: int
    kind: int
    data: memoryview | bytes

    def __post_init__(self) -> None:
        if isinstance(self.data, memoryview) and (self.data.ndim != 1 or self.data.format != "B"):
            object.__setattr__(self, "data", self.data.cast("B"))
        if not 0 <= self.batch_id <= _UINT64_MAX or not 0 <= self.total_bytes <= _UINT64_MAX:
            raise WireFormatError(f"{self._where}: batch_id and total_bytes must fit in uint64")
        if not 1 <= self.count <= _UINT32_MAX:
            raise WireFormatError(f"{self._where}: count must be in 1..2**32-1, got {self.count}")
        if not 0 <= self.index < self.count:
            raise WireFormatError(f"{self._where}: index must be in 0..{self.count - 1}")
        if self.kind not in _INT32_RANGE:
            raise WireFormatError(f"{self._where}: kind {self.kind} is not an int32 enum value")
        if len(self.data) > self.total_bytes:
            raise WireFormatError(
                f"{self._where}: holds {len(self.data)} bytes, more than the batch's "
                f"total_bytes {self.total_bytes}"
            )

    @property
    def _where(self) -> str:
        # Worded only for an error: every chunk passes these checks.
        return f"chunk {self.index} of batch {self.batch_id}"

    def header(self) -> bytes:
        """The serialized BatchChunk up to its data (exclusive), as protobuf writes it."""
        return chunk_header(
            self.batch_id,
            self.index,
            self.count,
            self.total_bytes,
            self.kind,
            data_size=len(self.data),
        )

    def byte_size(self) -> int:
        """Size of the serialized BatchChunk message."""
        return len(self.header()) + len(self.data)

    def to_bytes(self) -> bytes:
        """The serialized BatchChunk (the data copied once, as by protobuf)."""
        return b"".join((self.header(), self.data))

    def to_proto(self) -> batch_pb2.BatchChunk:
        """The BatchChunk message (copies the data into a protobuf object)."""
        return batch_pb2.BatchChunk(
            batch_id=self.batch_id,
            index=self.index,
            count=self.count,
            total_bytes=self.total_bytes,
            kind=self.kind,  # type: ignore[arg-type]
            data=bytes(self.data),
        )

    @classmethod
    def from_proto(cls, msg: batch_pb2.BatchChunk) -> Chunk:
        """Wraps a BatchChunk message (protobuf copies its data out once)."""
        return cls(msg.batch_id, msg.index, msg.count, msg.total_bytes, msg.kind, msg.data)


def chunk_header(
    batch_id: int, index: int, count: int, total_bytes: int, kind: int, *, data_size: int
) -> bytes:
    """The serialized BatchChunk up to ``data_size`` bytes of data (exclusive).

    Exactly what protobuf writes before the data: fields 1-5 when not zero,
    then the data field's tag and length when there is data.
    """
    parts = [
        _HEADER_TAGS[i] + encode_varint(value)
        for i, value in enumerate((batch_id, index, count, total_bytes, kind))
        if value
    ]
    if data_size:
        parts.append(len_prefix(_DATA, data_size))
    return b"".join(parts)
