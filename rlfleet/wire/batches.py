"""EpisodeBatch and TimeStepBatch on the wire, written and read by hand.

This is the hot path of the fleet: every sampled step crosses it twice
(worker to coordinator, coordinator to learner). protobuf's Python objects
would copy each tensor's bytes when a field is set and again when the
message is serialized; here instead

* :func:`encode_batch` builds a list of small header ``bytes`` and the
  arrays themselves, and joins them once: the data is copied exactly once;
* :func:`decode_batch` walks the fields of the message and views every
  tensor in the input buffer (``np.ndarray(buffer=...)``): no copy at all.

The bytes are exactly those protobuf writes for the same
``rlfleet.v1.EpisodeBatch`` / ``TimeStepBatch`` message (fields in number
order, empty fields omitted), and the reader takes any valid encoding of it
(any field order, packed or unpacked shapes, unknown fields skipped), so
senders in other languages can use their generated code.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from google.protobuf.message import DecodeError

from rlfleet.core import EpisodeBatch, TimeStepBatch
from rlfleet.core._pieces import EpisodePieces
from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import WireFormatError, WrongTypeError
from rlfleet.v1 import batch_pb2, spaces_pb2
from rlfleet.wire._protowire import (
    LEN,
    as_byte_source,
    duplicate_error,
    iter_fields,
    len_prefix,
    wire_type_error,
)
from rlfleet.wire.spaces import decode_env_spec, encode_env_spec
from rlfleet.wire.tensors import (
    Part,
    gathered,
    read_tensor,
    read_tensor_map,
    write_tensor,
    write_tensor_map,
)

#: Either batch type.
Batch: TypeAlias = EpisodeBatch | TimeStepBatch
#: What the writers take: a batch, or a worker's EpisodeBatch not joined yet.
WritableBatch: TypeAlias = Batch | EpisodePieces

_ENV_SPEC = 1


@dataclass(frozen=True)
class _Field:
    number: int
    name: str
    is_map: bool = False
    # The dtype batch.proto fixes for this field, if any.
    dtype: np.dtype | None = None
    where: str = ""  # "<Message>.<field>", filled in by _Schema


@dataclass(frozen=True, eq=False)
class _Schema:
    message: str
    batch_type: type
    payload_kind: int
    fields: tuple[_Field, ...]
    by_number: dict[int, _Field] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        fields = tuple(
            dataclasses.replace(field, where=f"{self.message}.{field.name}")
            for field in self.fields
        )
        object.__setattr__(self, "fields", fields)
        object.__setattr__(self, "by_number", {field.number: field for field in fields})


_UINT8 = np.dtype("u1")
_INT64 = np.dtype("<i8")

_SCHEMAS = (
    _Schema(
        "EpisodeBatch",
        EpisodeBatch,
        batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
        (
            _Field(2, "episode_infos", is_map=True),
            _Field(3, "observations"),
            _Field(4, "last_observations"),
            _Field(5, "actions"),
            _Field(6, "rewards"),
            _Field(7, "env_infos", is_map=True),
            _Field(8, "agent_infos", is_map=True),
            _Field(9, "step_types", dtype=_UINT8),
            _Field(10, "lengths", dtype=_INT64),
        ),
    ),
    _Schema(
        "TimeStepBatch",
        TimeStepBatch,
        batch_pb2.PAYLOAD_KIND_TIME_STEP_BATCH,
        (
            _Field(2, "episode_infos", is_map=True),
            _Field(3, "observations"),
            _Field(4, "actions"),
            _Field(5, "rewards"),
            _Field(6, "next_observations"),
            _Field(7, "env_infos", is_map=True),
            _Field(8, "agent_infos", is_map=True),
            _Field(9, "step_types", dtype=_UINT8),
        ),
    ),
)
_BY_TYPE = {schema.batch_type: schema for schema in _SCHEMAS}
# Written exactly as the EpisodeBatch its pieces join into.
_BY_TYPE[EpisodePieces] = _BY_TYPE[EpisodeBatch]
_BY_KIND = {schema.payload_kind: schema for schema in _SCHEMAS}


def encode_batch(batch: Batch, *, include_env_spec: bool = True) -> bytes:
    """Serializes a batch as a ``rlfleet.v1.EpisodeBatch`` / ``TimeStepBatch``.

    The array data is copied once, into the returned bytes; arrays that are
    not C-contiguous or not little-endian are converted first. step_types
    travel as uint8 and lengths as int64, as batch.proto requires. Empty
    info dicts are omitted (protobuf reads them back as empty).

    Args:
        batch: The batch.
        include_env_spec: Whether to embed the batch's EnvSpec. The worker
            stream and sample responses leave it out (the spec travels once
            per stream); standalone files keep it.

    Returns:
        The serialized message, byte-identical to protobuf's serialization
        of the same message.

    Raises:
        WireFormatError: If an array's dtype or an info key cannot travel,
            or a space of the EnvSpec cannot travel.
    """
    return b"".join(gathered(batch_parts(batch, include_env_spec=include_env_spec)))


def batch_parts(batch: WritableBatch, *, include_env_spec: bool = True) -> list[Part]:
    """The pieces whose ``b"".join`` is :func:`encode_batch`'s bytes.

    Small header ``bytes`` and the arrays' own memory (byte memoryviews):
    nothing of the data is copied yet, except arrays that must be
    converted (see :func:`encode_batch`). An :class:`EpisodePieces` gives
    the parts of the EpisodeBatch it joins into, each piece's memory a part.

    Raises:
        WireFormatError: As :func:`encode_batch`.
    """
    schema = _schema_of(type(batch))
    parts: list[Part] = []
    if include_env_spec:
        spec = encode_env_spec(batch.env_spec).SerializeToString()
        parts.append(len_prefix(_ENV_SPEC, len(spec)) + spec)
    for field in schema.fields:
        value = getattr(batch, field.name)
        if field.is_map:
            write_tensor_map(value, field.number, parts, field.where)
            continue
        if field.dtype is not None and value.dtype != field.dtype:
            value = value.astype(field.dtype)
        write_tensor(value, field.number, parts, field.where)
    return parts


def decode_batch(
    data: bytes | bytearray | memoryview,
    *,
    env_spec: EnvSpec | None = None,
    kind: type = EpisodeBatch,
) -> Batch:
    """Parses a serialized ``rlfleet.v1.EpisodeBatch`` / ``TimeStepBatch``.

    Every array of the result (observations, actions, infos, ...) is a
    read-only numpy view of ``data``: nothing is copied, and the batch keeps
    ``data`` alive. Call ``.copy()`` on an array to modify it.

    Any valid protobuf encoding is accepted: fields in any order, packed or
    unpacked shapes, unknown fields skipped. Not accepted: a tensor, map or
    env_spec field that occurs twice (protobuf would merge the two; no
    rlfleet sender splits a field), and an entry setting both a tensor and
    a map.

    Args:
        data: The serialized message.
        env_spec: The EnvSpec of the batch. When given, it is used and an
            env_spec in the message is ignored (not even parsed); when None,
            the message must carry one.
        kind: ``EpisodeBatch`` or ``TimeStepBatch``: the message type.

    Returns:
        The batch, of type ``kind``.

    Raises:
        WireFormatError: If the bytes are malformed, a tensor is missing or
            inconsistent, there is no env_spec anywhere, or the arrays do not
            form a valid batch (the message includes the batch type's own
            complaint).
        WrongTypeError: If ``kind`` is not one of the two batch types.
    """
    schema = _schema_of(kind)
    buf = as_byte_source(data)
    spans: dict[int, tuple[int, int]] = {}
    for number, wire_type, value, next_pos in iter_fields(buf, 0, len(buf), schema.message):
        field = schema.by_number.get(number)
        if field is None and number != _ENV_SPEC:
            continue  # unknown field: skipped, as protobuf requires
        if wire_type != LEN:
            name = field.name if field else "env_spec"
            raise wire_type_error(schema.message, name, wire_type, "message")
        if number in spans:
            raise duplicate_error(schema.message, field.name if field else "env_spec")
        spans[number] = (value, next_pos)

    values: dict[str, object] = {}
    for field in schema.fields:
        where = field.where
        span = spans.get(field.number)
        if field.is_map:
            values[field.name] = read_tensor_map(buf, *span, where) if span else {}
            continue
        if span is None:
            raise WireFormatError(f"{where}: missing; every {schema.message} carries it")
        array = read_tensor(buf, *span, where)
        if field.dtype is not None and array.dtype != field.dtype:
            raise WireFormatError(
                f"{where}: expected a {field.dtype.name} tensor, got {array.dtype.name}"
            )
        values[field.name] = array

    if env_spec is None:
        env_spec = _message_env_spec(buf, spans.get(_ENV_SPEC), schema.message)
    try:
        batch: Batch = kind(env_spec=env_spec, **values)
        return batch
    except ValueError as error:
        raise WireFormatError(f"the decoded {schema.message} is inconsistent: {error}") from error


def _message_env_spec(
    buf: bytes | memoryview, span: tuple[int, int] | None, message: str
) -> EnvSpec:
    if span is None:
        raise WireFormatError(
            f"{message}: the message carries no env_spec and none was given; pass "
            "env_spec= (on streams it travels once, in EnvReady or SampleHeader)"
        )
    try:
        msg = spaces_pb2.EnvSpec.FromString(bytes(buf[span[0] : span[1]]))
    except DecodeError as error:
        raise WireFormatError(f"{message}.env_spec: malformed EnvSpec message: {error}") from None
    return decode_env_spec(msg)


def payload_kind(batch_type: type) -> int:
    """The ``PayloadKind`` value of a batch type (for chunk headers).

    Raises:
        WrongTypeError: If ``batch_type`` is neither batch type.
    """
    return _schema_of(batch_type).payload_kind


def batch_type_of(kind: int) -> type:
    """The batch type a ``PayloadKind`` value decodes to.

    Raises:
        WireFormatError: For PAYLOAD_KIND_UNSPECIFIED or an unknown value.
    """
    schema = _BY_KIND.get(kind)
    if schema is None:
        raise WireFormatError(
            f"unknown payload kind {kind}; expected PAYLOAD_KIND_EPISODE_BATCH (1) "
            "or PAYLOAD_KIND_TIME_STEP_BATCH (2)"
        )
    return schema.batch_type


def _schema_of(batch_type: type) -> _Schema:
    schema = _BY_TYPE.get(batch_type)
    if schema is None:
        for known, candidate in _BY_TYPE.items():
            if isinstance(batch_type, type) and issubclass(batch_type, known):
                return candidate
        name = getattr(batch_type, "__name__", repr(batch_type))
        raise WrongTypeError(f"expected EpisodeBatch or TimeStepBatch, got {name}")
    return schema


__all__ = ["Batch", "batch_type_of", "decode_batch", "encode_batch", "payload_kind"]
