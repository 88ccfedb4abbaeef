"""rlfleet's wire codec: numpy arrays, spaces and batches as protocol messages.

This package and the faces' translation modules (one per face and side,
tests/test_layering.py) are the only parts of rlfleet that touch protobuf;
the messages every face carries (tensors, spaces, batches, agent and env
updates, error details) are converted here once. The batch codec, chunking
and envelopes read and write the wire format by hand so that tensor data is
copied once when sending and never when receiving; spaces, EnvSpecs, updates
and small tensors go through the generated classes.
Everything is byte-compatible with ``protos/rlfleet/v1``.

Every malformed input raises :class:`rlfleet.errors.WireFormatError`.
"""

from rlfleet.wire._chunk import Chunk
from rlfleet.wire.batches import decode_batch, encode_batch
from rlfleet.wire.chunks import (
    DEFAULT_CHUNK_BYTES,
    ChunkAssembler,
    chunk_payload,
    decode_batch_chunks,
    encode_batch_chunks,
    serialize_batch_messages,
)
from rlfleet.wire.envelope import parse_chunk, parse_with_chunk, serialize_with_chunk
from rlfleet.wire.join import (
    decode_heartbeat,
    decode_hello,
    decode_task,
    decode_welcome,
    encode_heartbeat,
    encode_hello,
    encode_task,
    encode_welcome,
)
from rlfleet.wire.spaces import (
    decode_env_spec,
    decode_space,
    encode_env_spec,
    encode_space,
    parse_env_spec,
)
from rlfleet.wire.tensor_messages import (
    decode_tensor,
    decode_tensor_list,
    decode_tensor_map,
    encode_tensor,
    encode_tensor_into,
    encode_tensor_map,
)
from rlfleet.wire.tensors import MAX_ELEMENTS
from rlfleet.wire.updates import (
    decode_agent_update,
    decode_env_update,
    decode_error_detail,
    encode_agent_change,
    encode_env_change,
    encode_error_report,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "MAX_ELEMENTS",
    "Chunk",
    "ChunkAssembler",
    "chunk_payload",
    "decode_agent_update",
    "decode_batch",
    "decode_batch_chunks",
    "decode_env_spec",
    "decode_env_update",
    "decode_error_detail",
    "decode_heartbeat",
    "decode_hello",
    "decode_space",
    "decode_tensor",
    "decode_tensor_list",
    "decode_tensor_map",
    "decode_task",
    "decode_welcome",
    "encode_batch",
    "encode_agent_change",
    "encode_batch_chunks",
    "encode_env_change",
    "encode_env_spec",
    "encode_error_report",
    "encode_heartbeat",
    "encode_hello",
    "encode_space",
    "encode_tensor",
    "encode_tensor_into",
    "encode_task",
    "encode_tensor_map",
    "encode_welcome",
    "parse_chunk",
    "parse_env_spec",
    "parse_with_chunk",
    "serialize_batch_messages",
    "serialize_with_chunk",
]
