"""worker.proto (and learner.proto's results connection) as the conformance kit
writes and reads it.

The kit plays the coordinator's side of a worker's Join stream, so it is a
protocol peer of its own, and this is the one module of it that holds
generated messages (tests/test_layering.py). It stays closer to the wire
than the coordinator's translation (``rlfleet.coordinator.worker_messages``)
on purpose: the kit checks a worker's messages as they were sent (a missing
``EnvReady.env_spec`` is not an empty one, each message's size counts, bytes
that do not parse are reported as such), and it scripts what a coordinator
sends by hand, in situations a real coordinator never creates. The
scripted coordinator hands each message over as it came
(:func:`parse_worker_message`); the link and the checks read it through the
functions here, into rlfleet types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
from google.protobuf.message import Message

from rlfleet.errors import WrongTypeError
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.join import (
    DrainOrder,
    TaskAssignment,
    TaskCancel,
    WorkerBeat,
    WorkerHello,
    WorkerWelcome,
)
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, leases_pb2, worker_pb2
from rlfleet.wire import (
    Chunk,
    decode_error_detail,
    decode_heartbeat,
    decode_hello,
    decode_tensor,
    encode_agent_change,
    encode_env_change,
    encode_task,
    encode_tensor,
    encode_welcome,
    parse_with_chunk,
)
from rlfleet.wire.results import ResultHeader

#: The kind of a WorkerMessage with no body set.
EMPTY = "empty"


# --- what a worker sends -------------------------------------------------------------


def parse_worker_message(data: bytes) -> tuple[str, Message, Chunk | None]:
    """A worker's message as sent: its body's name, the message, and a result's chunk.

    Raises:
        WireFormatError: If the bytes are not a WorkerMessage.
    """
    message, chunk = parse_with_chunk(worker_pb2.WorkerMessage, data, _rpc.WORKER_CHUNK_PATH)
    return message.WhichOneof("body") or EMPTY, message, chunk


def hello_of(message: Message) -> WorkerHello:
    """The Hello a WorkerMessage holds."""
    return decode_hello(_worker_message(message).hello)


def env_ready_of(message: Message) -> tuple[int, bytes | None]:
    """The EnvReady a WorkerMessage holds: its generation and its serialized spec (None: unset)."""
    ready = _worker_message(message).env_ready
    spec = ready.env_spec.SerializeToString() if ready.HasField("env_spec") else None
    return ready.generation, spec


def agent_ready_of(message: Message) -> int:
    """The version of the AgentReady a WorkerMessage holds."""
    return int(_worker_message(message).agent_ready.version)


def heartbeat_of(message: Message) -> WorkerBeat:
    """The Heartbeat a WorkerMessage holds."""
    return decode_heartbeat(_worker_message(message).heartbeat)


def error_of(message: Message) -> ErrorReport:
    """The error of the WorkerError a WorkerMessage holds."""
    return decode_error_detail(_worker_message(message).error.detail)


def result_header_of(message: Message) -> ResultHeader:
    """The metadata of the EpisodeResult a WorkerMessage holds."""
    return ResultHeader.of(_worker_message(message).result)


def body_text(message: Message, kind: str) -> str:
    """A message's body as protobuf's text format on one line, for failure messages."""
    body = getattr(_worker_message(message), kind, None)
    return str(body).strip().replace("\n", ", ") if body is not None else ""


def _worker_message(message: Message) -> worker_pb2.WorkerMessage:
    if not isinstance(message, worker_pb2.WorkerMessage):  # the scripted coordinator's
        raise WrongTypeError(f"expected a WorkerMessage, got {type(message).__name__}")
    return message


@dataclasses.dataclass(frozen=True)
class LeaseRows:
    """A worker's LeaseReply, read (leases.proto).

    Attributes:
        lease_id: The lease.
        call_id: The call it answers.
        step: Whether it answers a STEP call (else RESET or CREATE).
        env_ids: The envs it answers for, in its rows' order.
        error: The message of its error, or None.
        env_spec: A CREATE reply's serialized EnvSpec, or None if unset.
        observations: One row per env (None: unset).
        rewards: STEP: one per env (None: unset).
        terminated: STEP: one per env (None: unset).
        truncated: STEP: one per env (None: unset).
        infos: How many infos it carries.
        text: The reply as protobuf's text format, for failure messages.
    """

    lease_id: int
    call_id: int
    step: bool
    env_ids: tuple[int, ...]
    error: str | None = None
    env_spec: bytes | None = None
    observations: np.ndarray | None = None
    rewards: np.ndarray | None = None
    terminated: np.ndarray | None = None
    truncated: np.ndarray | None = None
    infos: int = 0
    text: str = ""


def lease_rows_of(message: Message) -> LeaseRows:
    """The LeaseReply a WorkerMessage holds.

    Raises:
        WireFormatError: If a tensor of it is malformed.
    """
    reply = _worker_message(message).lease_reply

    def rows(name: str) -> np.ndarray | None:
        return decode_tensor(getattr(reply, name)) if reply.HasField(name) else None

    return LeaseRows(
        lease_id=reply.lease_id,
        call_id=reply.call_id,
        step=reply.op == leases_pb2.LEASE_OP_STEP,
        env_ids=tuple(reply.env_ids),
        error=reply.error.message if reply.HasField("error") else None,
        env_spec=reply.env_spec.SerializeToString() if reply.HasField("env_spec") else None,
        observations=rows("observations"),
        rewards=rows("rewards"),
        terminated=rows("terminated"),
        truncated=rows("truncated"),
        infos=len(reply.infos),
        text=str(reply).strip().replace("\n", ", "),
    )


# --- what the kit sends ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeaseCreate:
    """A LeaseCommand building envs ``env_ids`` of ``env_id`` for lease ``lease_id``."""

    lease_id: int
    env_id: str
    env_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class LeaseCall:
    """A LeaseCommand calling RESET (``seeds``) or STEP (``actions``) on envs of a lease."""

    lease_id: int
    call_id: int
    env_ids: tuple[int, ...]
    seeds: tuple[int, ...] = ()
    actions: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class LeaseRelease:
    """A LeaseCommand releasing every env of a lease."""

    lease_id: int


#: What the kit sends a worker.
KitCommand = (
    WorkerWelcome
    | EnvChange
    | AgentChange
    | TaskAssignment
    | TaskCancel
    | DrainOrder
    | LeaseCreate
    | LeaseCall
    | LeaseRelease
)


def command_bytes(command: KitCommand, *, unit_columns: bool = False) -> tuple[str, bytes]:
    """A command's CoordinatorMessage: the body's name and the serialized message.

    Args:
        command: What to send.
        unit_columns: A task's units go as columns (the worker was granted
            ``rlfleet.unit-columns``).
    """
    message = _coordinator_message(command, unit_columns=unit_columns)
    return message.WhichOneof("body") or EMPTY, message.SerializeToString()


# --- unit columns a worker must refuse ------------------------------------------------


def switch_marker() -> bytes:
    """The lease switch marker: a CoordinatorMessage holding ``lease.data_switch``."""
    switch = leases_pb2.LeaseCommand(data_switch=leases_pb2.LeaseDataSwitch())
    return worker_pb2.CoordinatorMessage(lease=switch).SerializeToString()


def _cut_column(task: worker_pb2.Task) -> str:
    task.unit_columns.episode_indices = task.unit_columns.episode_indices[:-3]
    return "whose episode_indices lack their last 3 bytes (not a whole number of int64)"


def _longer_column(task: worker_pb2.Task) -> str:
    columns = task.unit_columns
    columns.env_seeds += (7).to_bytes(4, "little")
    count = len(columns.env_seeds) // 4
    return f"whose env_seeds hold {count} values and the others {count - 1}"


def _wide_column(task: worker_pb2.Task) -> str:
    seeds = task.unit_columns.policy_seeds
    task.unit_columns.policy_seeds = b"".join(
        int.from_bytes(seeds[k : k + 4], "little").to_bytes(8, "little")
        for k in range(0, len(seeds), 4)
    )
    return "whose policy_seeds are int64 (8 bytes each) instead of uint32"


def _negative_index(task: worker_pb2.Task) -> str:
    columns = task.unit_columns
    columns.episode_indices = (-1).to_bytes(8, "little", signed=True) + columns.episode_indices[8:]
    return "whose first episode index is -1 (each index is >= 0)"


def _both_forms(task: worker_pb2.Task) -> str:
    task.units.add(episode_index=0, env_seed=1, policy_seed=2)
    return "that also carries Task.units (a Task carries its units in one form)"


#: How the kit breaks a task's unit columns; each says what it did, for messages.
_COLUMN_FAULTS: tuple[Callable[[worker_pb2.Task], str], ...] = (
    _cut_column,
    _longer_column,
    _wide_column,
    _negative_index,
    _both_forms,
)
#: Ways :func:`malformed_task` breaks a task's unit columns.
UNIT_COLUMN_FAULTS = len(_COLUMN_FAULTS)


def malformed_task(task: TaskAssignment, fault: int) -> tuple[str, bytes]:
    """``task``'s CoordinatorMessage with its unit columns broken in way ``fault``
    (of :data:`UNIT_COLUMN_FAULTS`; worker.proto ``EpisodeUnitColumns``): what was
    broken, for messages, and the serialized message."""
    message = encode_task(task, unit_columns=True)
    what = _COLUMN_FAULTS[fault](message)
    return what, worker_pb2.CoordinatorMessage(task=message).SerializeToString()


def _coordinator_message(
    command: KitCommand, *, unit_columns: bool
) -> worker_pb2.CoordinatorMessage:
    message = worker_pb2.CoordinatorMessage
    if isinstance(command, TaskAssignment):
        return message(task=encode_task(command, unit_columns=unit_columns))
    if isinstance(command, EnvChange):
        return message(env_update=encode_env_change(command))
    if isinstance(command, AgentChange):
        return message(agent_update=encode_agent_change(command))
    if isinstance(command, TaskCancel):
        cancel = worker_pb2.Cancel(task_id=command.task_id, episode_indices=command.episode_indices)
        return message(cancel=cancel)
    if isinstance(command, DrainOrder):
        drain = worker_pb2.Drain(reason=command.reason, grace_seconds=command.grace_seconds)
        return message(drain=drain)
    if isinstance(command, LeaseCreate | LeaseCall | LeaseRelease):
        return message(lease=_lease(command))
    return message(welcome=encode_welcome(command))


def _lease(command: LeaseCreate | LeaseCall | LeaseRelease) -> leases_pb2.LeaseCommand:
    if isinstance(command, LeaseRelease):
        return leases_pb2.LeaseCommand(lease_id=command.lease_id, release=leases_pb2.LeaseRelease())
    if isinstance(command, LeaseCreate):
        env = encode_env_change(EnvChange(env_id=command.env_id))
        create = leases_pb2.LeaseCreate(env=env, env_ids=command.env_ids)
        return leases_pb2.LeaseCommand(lease_id=command.lease_id, create=create)
    call = leases_pb2.LeaseCall(
        call_id=command.call_id,
        op=leases_pb2.LEASE_OP_RESET if command.actions is None else leases_pb2.LEASE_OP_STEP,
        env_ids=command.env_ids,
        seeds=command.seeds,
    )
    if command.actions is not None:
        call.actions.CopyFrom(encode_tensor(command.actions))
    return leases_pb2.LeaseCommand(lease_id=command.lease_id, call=call)


def merged_rows(parts: Sequence[LeaseRows], env_ids: Sequence[int]) -> LeaseRows:
    """The replies of one call as one, rows in the call's env order.

    Args:
        parts: The replies (together they answer each env once).
        env_ids: The call's envs, in its order.
    """
    answered = [env_id for part in parts for env_id in part.env_ids]
    order = [answered.index(env_id) for env_id in env_ids]

    def rows(name: str) -> np.ndarray | None:
        arrays = [getattr(part, name) for part in parts]
        if any(array is None for array in arrays):
            return None
        return np.concatenate(arrays)[order]

    first = parts[0]
    return LeaseRows(
        lease_id=first.lease_id,
        call_id=first.call_id,
        step=first.step,
        env_ids=tuple(env_ids),
        observations=rows("observations"),
        rewards=rows("rewards") if first.step else None,
        terminated=rows("terminated") if first.step else None,
        truncated=rows("truncated") if first.step else None,
        infos=sum(part.infos for part in parts),
        text="; ".join(part.text for part in parts),
    )


# --- a learner's results connection (the coordinator checks) -------------------------


@dataclasses.dataclass(frozen=True)
class ResultsConnection:
    """An OpenResultChannel answer: the connection to dial, and what it serves.

    Attributes:
        channel: ``channel_id``.
        port: ``data.port`` (0: no data channel).
        ticket: ``data.ticket``.
        requests: ``requests_on_data``.
    """

    channel: int
    port: int
    ticket: bytes
    requests: bool


def result_channel_request(_: None) -> bytes:
    """A serialized ResultChannelRequest (no fields)."""
    return learner_pb2.ResultChannelRequest().SerializeToString()


def results_connection_of(data: bytes) -> ResultsConnection:
    """Reads a ResultChannelOpened."""
    opened = learner_pb2.ResultChannelOpened.FromString(data)
    port = opened.data.port if opened.HasField("data") else 0
    return ResultsConnection(opened.channel_id, port, opened.data.ticket, opened.requests_on_data)


def episodes_request(episodes: int, call: int, *, wait_for_workers_seconds: float) -> bytes:
    """A serialized SampleRequest for ``episodes`` episodes, sent as call ``call``
    on a results connection."""
    return learner_pb2.SampleRequest(
        mode=worker_pb2.SAMPLE_MODE_EPISODES,
        amount=episodes,
        result_call=call,
        wait_for_workers_seconds=wait_for_workers_seconds,
    ).SerializeToString()


@dataclasses.dataclass(frozen=True)
class ResultsFrame:
    """One frame of a results connection, as sent (a SampleResponse).

    Attributes:
        call: ``result_call``.
        kind: The body set: ``header``, ``result``, ``footer``,
            ``results_end``, ``failure``, or :data:`EMPTY`.
        on_data: A header's ``results_on_data`` and ``footer_on_data``.
        data_results: A footer's ``data_results``.
        code: A failure's status code.
        message: A failure's message.
    """

    call: int
    kind: str
    on_data: tuple[bool, bool] = (False, False)
    data_results: int = 0
    code: int = 0
    message: str = ""


def results_frame_of(data: bytes) -> ResultsFrame:
    """Reads a frame of a results connection.

    Raises:
        DecodeError: If it is no SampleResponse.
    """
    response = learner_pb2.SampleResponse.FromString(data)
    kind = response.WhichOneof("body") or EMPTY
    header, footer, failure = response.header, response.footer, response.failure
    return ResultsFrame(
        response.result_call,
        kind,
        on_data=(header.results_on_data, header.footer_on_data),
        data_results=footer.data_results,
        code=failure.code,
        message=failure.message,
    )
