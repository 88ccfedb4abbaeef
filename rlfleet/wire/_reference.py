"""The batch codec through protobuf's generated classes: the reference.

Slow (protobuf copies every tensor's bytes when a field is set and again
when the message is serialized), and kept only as the yardstick: tests
check that the hand-written codec and this path agree byte for byte, and
``benchmarks/codec.py`` times both.
"""

from __future__ import annotations

from rlfleet.core import EpisodeBatch, TimeStepBatch
from rlfleet.core.env_spec import EnvSpec
from rlfleet.v1 import batch_pb2
from rlfleet.wire.batches import Batch, _schema_of
from rlfleet.wire.spaces import decode_env_spec, encode_env_spec
from rlfleet.wire.tensor_messages import (
    decode_tensor,
    decode_tensor_map,
    encode_tensor,
    encode_tensor_map,
)

_BATCH_TYPES: dict[type, type] = {
    batch_pb2.EpisodeBatch: EpisodeBatch,
    batch_pb2.TimeStepBatch: TimeStepBatch,
}


def batch_to_proto(
    batch: Batch, *, include_env_spec: bool = True
) -> batch_pb2.EpisodeBatch | batch_pb2.TimeStepBatch:
    """Builds the protobuf message of a batch (empty info dicts left unset)."""
    schema = _schema_of(type(batch))
    msg = getattr(batch_pb2, schema.message)()
    if include_env_spec:
        msg.env_spec.CopyFrom(encode_env_spec(batch.env_spec))
    for field in schema.fields:
        value = getattr(batch, field.name)
        if field.is_map:
            if value:
                getattr(msg, field.name).CopyFrom(encode_tensor_map(value))
            continue
        if field.dtype is not None:
            value = value.astype(field.dtype, copy=False)
        getattr(msg, field.name).CopyFrom(encode_tensor(value))
    return msg


def batch_from_proto(
    msg: batch_pb2.EpisodeBatch | batch_pb2.TimeStepBatch, *, env_spec: EnvSpec | None = None
) -> Batch:
    """Rebuilds a batch from its protobuf message."""
    schema = _schema_of(_BATCH_TYPES[type(msg)])
    values: dict[str, object] = {}
    for field in schema.fields:
        where = f"{schema.message}.{field.name}"
        if field.is_map:
            values[field.name] = decode_tensor_map(getattr(msg, field.name), name=where)
        else:
            values[field.name] = decode_tensor(getattr(msg, field.name), name=where)
    spec = env_spec if env_spec is not None else decode_env_spec(msg.env_spec)
    batch: Batch = schema.batch_type(env_spec=spec, **values)
    return batch
