"""The worker face, worker side: Join stream messages in and out of rlfleet types.

The one module of the remote worker that holds generated messages
(tests/test_layering.py). The coordinator's messages are read into
:data:`CoordinatorEvent`\\ s by the Join call's deserializer
(:func:`parse_coordinator_message`), and what the worker sends is written
by its serializer (:func:`serialize_outgoing`), so the connection, the
session loop and the worker's life speak rlfleet types only. A batch is
serialized once, straight into its chunk messages (:func:`result_messages`);
lease commands and replies are the lease face's (``rlfleet.wire.leases``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeAlias

import numpy as np
from google.protobuf.message import DecodeError

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.core._pieces import EpisodePieces
from rlfleet.errors import WireFormatError, WrongTypeError
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.join import (
    AgentApplied,
    DrainOrder,
    EnvBuilt,
    ResultsSwitch,
    TaskAssignment,
    TaskCancel,
    WorkerBeat,
    WorkerHello,
    WorkerLeaving,
    WorkerWelcome,
)
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.v1 import leases_pb2, worker_pb2
from rlfleet.wire import (
    DEFAULT_CHUNK_BYTES,
    decode_agent_update,
    decode_env_update,
    decode_task,
    decode_welcome,
    encode_env_spec,
    encode_error_report,
    encode_heartbeat,
    encode_hello,
)
from rlfleet.wire.chunks import DATA_CHANNEL_CHUNK_BYTES, serialize_batch_behind
from rlfleet.wire.leases import (
    LeaseOrder,
    LeaseReport,
    decode_lease_command,
    lease_report_message,
)
from rlfleet.wire.result_message import result_fields, result_head

#: Room left in a message for the EpisodeResult envelope around a chunk.
_ENVELOPE_ALLOWANCE = 64
_NONE = np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class UnreadableAgentUpdate:
    """An AgentUpdate whose parameters did not decode: the worker refuses its version.

    Attributes:
        version: The version it would have created.
        error: Why its parameters did not decode.
    """

    version: int
    error: WireFormatError


@dataclasses.dataclass(frozen=True)
class LeaseCommandIn:
    """A lease command for the LeaseHost (``rlfleet.wire.leases``' order).

    Attributes:
        lease_id: The lease it belongs to.
        order: What to do; None for an empty command.
    """

    lease_id: int
    order: LeaseOrder


@dataclasses.dataclass(frozen=True)
class LeaseDataSwitch:
    """The marker after which lease commands come on the lease data connection."""


@dataclasses.dataclass(frozen=True)
class DataChannelWork:
    """A Task or Cancel that came on the lease data connection (``rlfleet.data-tasks``):
    the worker runs such a Task only once it runs the Task's agent version and
    env generation, whose updates come on the Join stream.

    Attributes:
        work: The Task or Cancel.
    """

    work: TaskAssignment | TaskCancel


@dataclasses.dataclass(frozen=True)
class EmptyCoordinatorMessage:
    """A CoordinatorMessage without a body (gRPC takes a deserializer's None for a failure)."""


#: What one message of the coordinator holds.
CoordinatorEvent: TypeAlias = (
    WorkerWelcome
    | EnvChange
    | AgentChange
    | UnreadableAgentUpdate
    | TaskAssignment
    | TaskCancel
    | DrainOrder
    | LeaseCommandIn
    | LeaseDataSwitch
    | DataChannelWork
    | EmptyCoordinatorMessage
)
#: What the worker sends: a message to build, or one serialized already
#: (a result's chunk messages, a lease reply).
Outgoing: TypeAlias = (
    WorkerHello
    | EnvBuilt
    | AgentApplied
    | WorkerBeat
    | ErrorReport
    | WorkerLeaving
    | ResultsSwitch
    | bytes
    | memoryview
)

_BODY_NAMES: dict[type, str] = {
    WorkerWelcome: "welcome",
    EnvChange: "env_update",
    AgentChange: "agent_update",
    UnreadableAgentUpdate: "agent_update",
    TaskAssignment: "task",
    TaskCancel: "cancel",
    DrainOrder: "drain",
    LeaseCommandIn: "lease",
    LeaseDataSwitch: "lease",
    DataChannelWork: "task or cancel",
    EmptyCoordinatorMessage: "None",
}


def body_name(event: CoordinatorEvent) -> str:
    """The worker.proto name of the message an event came in, for logs and errors."""
    return _BODY_NAMES[type(event)]


# --- from the coordinator ------------------------------------------------------------


def parse_coordinator_message(data: bytes) -> CoordinatorEvent:
    """Reads one CoordinatorMessage (the Join call's deserializer).

    A task's replays and an update's parameters are decoded here; what does
    not decode is kept for the session to refuse (its error names the task
    or the version).

    Raises:
        DecodeError: If the bytes do not parse.
        WireFormatError: If a lease command is malformed.
    """
    message = worker_pb2.CoordinatorMessage.FromString(data)
    body = message.WhichOneof("body")
    if body == "task":
        return decode_task(message.task)
    if body == "agent_update":
        update = message.agent_update
        try:
            return decode_agent_update(update)
        except WireFormatError as exc:
            return UnreadableAgentUpdate(update.version, exc)
    if body == "env_update":
        return decode_env_update(message.env_update)
    if body == "cancel":
        return _cancel(message.cancel)
    if body == "lease":
        return _lease(message.lease)
    if body == "drain":
        return DrainOrder(message.drain.reason, message.drain.grace_seconds)
    if body == "welcome":
        return decode_welcome(message.welcome)
    return EmptyCoordinatorMessage()


def parse_lease_frame(
    payload: bytes, *, tasks: bool = False
) -> LeaseCommandIn | LeaseDataSwitch | DataChannelWork:
    """Reads a frame of the lease data connection: a CoordinatorMessage holding a
    lease command, or with ``tasks`` (``rlfleet.data-tasks`` agreed) a Task or Cancel.

    Raises:
        WireFormatError: If it is anything else (the connection then ends).
    """
    try:
        message = worker_pb2.CoordinatorMessage.FromString(payload)
    except DecodeError as exc:
        raise WireFormatError(f"a lease data frame did not parse: {exc}") from None
    body = message.WhichOneof("body")
    if tasks and body == "task":
        return DataChannelWork(decode_task(message.task))
    if tasks and body == "cancel":
        return DataChannelWork(_cancel(message.cancel))
    if body != "lease":
        raise WireFormatError(
            f"a lease data frame held {body or 'nothing'}, not a "
            f"{'lease command, task or cancel' if tasks else 'lease command'}"
        )
    return _lease(message.lease)


def _cancel(cancel: worker_pb2.Cancel) -> TaskCancel:
    return TaskCancel(cancel.task_id, tuple(cancel.episode_indices))


def _lease(command: leases_pb2.LeaseCommand) -> LeaseCommandIn | LeaseDataSwitch:
    if command.WhichOneof("body") == "data_switch":
        return LeaseDataSwitch()
    return LeaseCommandIn(command.lease_id, decode_lease_command(command))


# --- to the coordinator ------------------------------------------------------------


def serialize_outgoing(item: Outgoing) -> bytes:
    """The serialized WorkerMessage of an item (the Join call's serializer)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, memoryview):  # a result's message: gRPC sends bytes
        return item.tobytes()
    return _worker_message(item).SerializeToString()


def _worker_message(item: Outgoing) -> worker_pb2.WorkerMessage:
    if isinstance(item, WorkerBeat):
        return worker_pb2.WorkerMessage(heartbeat=encode_heartbeat(item))
    if isinstance(item, ErrorReport):
        error = worker_pb2.WorkerError(detail=encode_error_report(item))
        return worker_pb2.WorkerMessage(error=error)
    if isinstance(item, AgentApplied):
        return worker_pb2.WorkerMessage(agent_ready=worker_pb2.AgentReady(version=item.version))
    if isinstance(item, EnvBuilt):
        ready = worker_pb2.EnvReady(generation=item.generation)
        ready.env_spec.MergeFromString(item.env_spec_wire)
        return worker_pb2.WorkerMessage(env_ready=ready)
    if isinstance(item, WorkerLeaving):
        return worker_pb2.WorkerMessage(leaving=worker_pb2.Leaving(reason=item.reason))
    if isinstance(item, ResultsSwitch):
        return worker_pb2.WorkerMessage(results_switch=leases_pb2.LeaseDataSwitch())
    if isinstance(item, WorkerHello):
        return worker_pb2.WorkerMessage(hello=encode_hello(item))
    raise WrongTypeError(f"a worker does not send a {type(item).__name__}")


def env_built(generation: int, spec: EnvSpec) -> EnvBuilt:
    """The EnvReady of a generation whose envs have ``spec``.

    Raises:
        WireFormatError: If a space cannot travel.
    """
    return EnvBuilt(generation, encode_env_spec(spec).SerializeToString())


def result_messages(
    batch: EpisodeBatch | EpisodePieces,
    *,
    task_id: int,
    episode_indices: np.ndarray,
    env_generation: int,
    batch_id: int,
    max_message_bytes: int,
    allocate: Callable[[int], memoryview] | None = None,
    on_data_channel: bool = False,
) -> tuple[list[memoryview], int]:
    """A batch as one EpisodeResult, cut into messages below the message limit.

    Written by hand, as protobuf writes it (``rlfleet.wire.result_message``):
    no protobuf object. The step data is copied once, from the ring into
    the messages (:func:`rlfleet.wire.chunks.serialize_batch_behind`),
    written into ``allocate(size)`` if given (a session's reused memory).
    Chunks hold up to ``DEFAULT_CHUNK_BYTES`` on the Join stream and up to
    ``DATA_CHANNEL_CHUNK_BYTES`` when ``on_data_channel`` (framed TCP: one
    frame per chunk, each with its cost on the coordinator).

    Returns:
        The serialized WorkerMessages, and the serialized batch's size.
    """
    fields = result_fields(
        task_id,
        episode_indices,
        batch.lengths,
        # Updates are applied only after a flush, so one version made them all.
        int(batch.episode_infos["agent_version"][0]),
        env_generation,
    )
    rest = result_fields(task_id, _NONE, _NONE, 0, 0)
    chunk_bytes = DATA_CHANNEL_CHUNK_BYTES if on_data_channel else DEFAULT_CHUNK_BYTES
    max_bytes = min(chunk_bytes, max_message_bytes - len(fields) - _ENVELOPE_ALLOWANCE)
    return serialize_batch_behind(
        batch,
        lambda index, size: result_head(fields if index == 0 else rest, size),
        max_bytes=max_bytes,
        batch_id=batch_id,
        include_env_spec=False,
        allocate=allocate,
    )


def lease_reply(report: LeaseReport, worker: str) -> bytes:
    """The serialized WorkerMessage of a lease report (``rlfleet.wire.leases``)."""
    return lease_report_message(report, worker).SerializeToString()
