"""The worker face, coordinator side: Join stream messages in and out of rlfleet types.

The one module of the coordinator's worker face that holds generated
messages (tests/test_layering.py). A worker's messages are read into the
types of :mod:`rlfleet.protocol.join` as they arrive (:func:`parse_worker_message`,
the Join call's deserializer), and what the coordinator sends a worker
(:data:`~rlfleet.coordinator.registry.WorkerCommand`) is written out by the
call's serializer (:func:`serialize_command`). A result's chunk stays out of
protobuf objects (a result written as protobuf writes it is read without
any, :mod:`rlfleet.wire.result_message`), and chunk 0's metadata is kept as
it came: the learner gets it whole, with fields this version does not know.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TypeAlias

from google.protobuf.message import Message

from rlfleet._util.prebuilt import prebuilt
from rlfleet.coordinator.leases.translation import RelayReply
from rlfleet.coordinator.registry import TaskDispatch, WorkerCommand
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.join import (
    AgentApplied,
    DrainOrder,
    EnvBuilt,
    ResultsSwitch,
    TaskAssignment,
    WorkerBeat,
    WorkerHello,
    WorkerLeaving,
)
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.scheduling.scheduler import CancelOrder
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import (
    Chunk,
    decode_error_detail,
    decode_heartbeat,
    decode_hello,
    encode_agent_change,
    encode_env_change,
    encode_task,
    encode_welcome,
    parse_with_chunk,
)
from rlfleet.wire._protowire import LEN, tag
from rlfleet.wire.result_message import read_result_message
from rlfleet.wire.results import ResultHeader

#: The first byte of a WorkerMessage holding a heartbeat as protobuf writes
#: it: a lease data frame that starts with it may be one (WorkerDataPeer).
HEARTBEAT_TAG = tag(worker_pb2.WorkerMessage.HEARTBEAT_FIELD_NUMBER, LEN)


@dataclasses.dataclass(frozen=True)
class ResultPiece:
    """One message of a worker's result: its metadata and its chunk.

    Attributes:
        header: The message's metadata (the result's on chunk 0, with the
            ``EpisodeResult`` as received in ``wire``, for the learner).
        chunk: The batch chunk (None: the message carried none).
    """

    header: ResultHeader
    chunk: Chunk | None


@dataclasses.dataclass(frozen=True)
class LeaseReplyBody:
    """A lease reply that came with other fields in its message (the lease relay reads it)."""

    body: bytes


@dataclasses.dataclass(frozen=True)
class EmptyWorkerMessage:
    """A WorkerMessage without a body (gRPC takes a deserializer's None for a failure)."""


#: What one message of a worker holds.
WorkerEvent: TypeAlias = (
    WorkerHello
    | EnvBuilt
    | AgentApplied
    | WorkerBeat
    | ErrorReport
    | WorkerLeaving
    | ResultsSwitch
    | ResultPiece
    | LeaseReplyBody
    | EmptyWorkerMessage
)

#: The WorkerMessage body each event comes from (worker.proto), for errors.
_BODY_NAMES: dict[type, str] = {
    WorkerHello: "hello",
    EnvBuilt: "env_ready",
    AgentApplied: "agent_ready",
    WorkerBeat: "heartbeat",
    ErrorReport: "error",
    WorkerLeaving: "leaving",
    ResultsSwitch: "results_switch",
    ResultPiece: "result",
    LeaseReplyBody: "lease_reply",
    RelayReply: "lease_reply",
    EmptyWorkerMessage: "an empty WorkerMessage",
}


def body_name(event: WorkerEvent | RelayReply) -> str:
    """The worker.proto name of the message an event came in, for error messages."""
    return _BODY_NAMES[type(event)]


# --- from the worker ----------------------------------------------------------------


def parse_worker_message(data: bytes | bytearray | memoryview) -> WorkerEvent:
    """Reads one WorkerMessage (a result's chunk stays a view of ``data``).

    A result written as protobuf writes it is read in one walk, whatever
    holds its bytes: a Join stream's message (``bytes``) or a lease data
    frame (a view of a receive buffer); anything else by
    :func:`parse_worker_message_by_protobuf`.

    Raises:
        WireFormatError: If the bytes are malformed.
    """
    if (read := read_result_message(data)) is not None:
        # Read and checked already: made without the frozen __init__.
        header, chunk = read
        return prebuilt(ResultPiece, header=header, chunk=chunk)
    return parse_worker_message_by_protobuf(data)


def parse_worker_message_by_protobuf(data: bytes | bytearray | memoryview) -> WorkerEvent:
    """Reads one WorkerMessage with protobuf's parser (the chunk stays a view of
    ``data``): what :func:`parse_worker_message` does with any message a worker
    did not write in protobuf's own form.

    Raises:
        WireFormatError: If the bytes are malformed.
    """
    message, chunk = parse_with_chunk(worker_pb2.WorkerMessage, data, _rpc.WORKER_CHUNK_PATH)
    body = message.WhichOneof("body")
    if body == "result":
        return ResultPiece(_result_header(message.result, chunk), chunk)
    if body == "heartbeat":
        return decode_heartbeat(message.heartbeat)
    if body == "env_ready":
        ready = message.env_ready
        return EnvBuilt(ready.generation, ready.env_spec.SerializeToString(deterministic=True))
    if body == "agent_ready":
        return AgentApplied(message.agent_ready.version)
    if body == "error":
        return decode_error_detail(message.error.detail)
    if body == "lease_reply":
        return LeaseReplyBody(message.lease_reply.SerializeToString())
    if body == "leaving":
        return WorkerLeaving(message.leaving.reason)
    if body == "results_switch":
        return ResultsSwitch()
    if body == "hello":
        return decode_hello(message.hello)
    return EmptyWorkerMessage()


def _result_header(meta: worker_pb2.EpisodeResult, chunk: Chunk | None) -> ResultHeader:
    # Only chunk 0's metadata goes to the learner: it is kept whole.
    wire = meta.SerializeToString() if chunk is not None and chunk.index == 0 else b""
    return ResultHeader(
        task_id=meta.task_id,
        worker_id=meta.worker_id,
        episode_indices=tuple(meta.episode_indices),
        lengths=tuple(meta.lengths),
        agent_version=meta.agent_version,
        env_generation=meta.env_generation,
        wire=wire,
    )


# --- to the worker ------------------------------------------------------------------


def serialize_command(command: WorkerCommand) -> bytes:
    """The serialized CoordinatorMessage of a command (the Join call's serializer).

    An update broadcast to every worker is encoded once.
    """
    if isinstance(command, AgentChange | EnvChange):
        return _update_bytes(command)
    return coordinator_message(command).SerializeToString()


@functools.lru_cache(maxsize=4)
def _update_bytes(update: AgentChange | EnvChange) -> bytes:
    return coordinator_message(update).SerializeToString()


def coordinator_message(command: WorkerCommand) -> worker_pb2.CoordinatorMessage:
    """The CoordinatorMessage of a command (a lease command is one already)."""
    if isinstance(command, Message):
        return command  # type: ignore[return-value]
    if isinstance(command, TaskDispatch):
        return task_message(command)
    if isinstance(command, CancelOrder):
        cancel = worker_pb2.Cancel(task_id=command.task_id, episode_indices=command.episode_indices)
        return worker_pb2.CoordinatorMessage(cancel=cancel)
    if isinstance(command, AgentChange):
        return worker_pb2.CoordinatorMessage(agent_update=encode_agent_change(command))
    if isinstance(command, EnvChange):
        return worker_pb2.CoordinatorMessage(env_update=encode_env_change(command))
    if isinstance(command, DrainOrder):
        drain = worker_pb2.Drain(reason=command.reason, grace_seconds=command.grace_seconds)
        return worker_pb2.CoordinatorMessage(drain=drain)
    return worker_pb2.CoordinatorMessage(welcome=encode_welcome(command))


def work_frame(command: TaskDispatch | CancelOrder) -> bytes:
    """A Task or Cancel as a frame's payload on the worker's lease data connection:
    the CoordinatorMessage the Join stream would carry (``rlfleet.data-tasks``)."""
    return coordinator_message(command).SerializeToString()


def task_message(dispatch: TaskDispatch) -> worker_pb2.CoordinatorMessage:
    """The Task message of a scheduler order, with the replays of the streams it takes over."""
    order = dispatch.order
    task = TaskAssignment(
        task_id=order.task_id,
        request_id=order.request_id,
        mode=order.mode.value,
        agent_version=order.agent_version,
        env_generation=order.env_generation,
        units=order.units,
        fragment_length=order.fragment_length,
        rounds=order.rounds,
        base_seed=order.base_seed,
        streams=order.streams,
        replays=dispatch.replays,
    )
    return worker_pb2.CoordinatorMessage(task=encode_task(task, unit_columns=dispatch.unit_columns))
