"""The Join stream's messages on the wire (worker.proto), each converted once.

A worker writes Hello and Heartbeat and reads Welcome and Task; the
coordinator, and the conformance kit that plays one, do the opposite. Their
translation modules (``rlfleet.coordinator.worker_messages``,
``rlfleet.worker._join_messages``, ``rlfleet.conformance.kit_messages``)
compose the messages from these conversions to and from
:mod:`rlfleet.protocol.join`'s types.
"""

from __future__ import annotations

import numpy as np

from rlfleet.errors import WireFormatError
from rlfleet.protocol.join import TaskAssignment, WorkerBeat, WorkerHello, WorkerWelcome
from rlfleet.protocol.stream_replay import StreamReplay
from rlfleet.protocol.unit_columns import EMPTY_UNITS, UnitColumns
from rlfleet.v1 import leases_pb2, worker_pb2
from rlfleet.wire.tensor_messages import decode_tensor, encode_tensor


def encode_hello(hello: WorkerHello) -> worker_pb2.Hello:
    """The Hello message of a worker's hello."""
    return worker_pb2.Hello(
        protocol_version=hello.protocol_version,
        capabilities=hello.capabilities,
        num_envs=hello.num_envs,
        name=hello.name,
        host=hello.host,
        pid=hello.pid,
        implementation=hello.implementation,
        lease_slots=hello.lease_slots,
    )


def decode_hello(hello: worker_pb2.Hello) -> WorkerHello:
    """The hello a Hello message holds."""
    return WorkerHello(
        protocol_version=hello.protocol_version,
        capabilities=tuple(hello.capabilities),
        num_envs=hello.num_envs,
        name=hello.name,
        host=hello.host,
        pid=hello.pid,
        implementation=hello.implementation,
        lease_slots=hello.lease_slots,
    )


def encode_welcome(welcome: WorkerWelcome) -> worker_pb2.Welcome:
    """The Welcome message of a welcome."""
    data = None
    if welcome.lease_data is not None:
        port, ticket = welcome.lease_data
        data = leases_pb2.LeaseDataAddress(port=port, ticket=ticket)
    return worker_pb2.Welcome(
        protocol_version=welcome.protocol_version,
        worker_id=welcome.worker_id,
        name=welcome.name,
        heartbeat_interval_seconds=welcome.heartbeat_interval_seconds,
        heartbeat_timeout_seconds=welcome.heartbeat_timeout_seconds,
        max_message_bytes=welcome.max_message_bytes,
        capabilities=welcome.capabilities,
        first_stream=welcome.first_stream,
        coordinator_id=welcome.coordinator_id,
        lease_data=data,
    )


def decode_welcome(welcome: worker_pb2.Welcome) -> WorkerWelcome:
    """The welcome a Welcome message holds."""
    lease_data = None
    if welcome.HasField("lease_data"):
        lease_data = (welcome.lease_data.port, welcome.lease_data.ticket)
    return WorkerWelcome(
        protocol_version=welcome.protocol_version,
        worker_id=welcome.worker_id,
        name=welcome.name,
        heartbeat_interval_seconds=welcome.heartbeat_interval_seconds,
        heartbeat_timeout_seconds=welcome.heartbeat_timeout_seconds,
        max_message_bytes=welcome.max_message_bytes,
        capabilities=tuple(welcome.capabilities),
        first_stream=welcome.first_stream,
        coordinator_id=welcome.coordinator_id,
        lease_data=lease_data,
    )


def encode_heartbeat(beat: WorkerBeat) -> worker_pb2.Heartbeat:
    """The Heartbeat message of a heartbeat."""
    return worker_pb2.Heartbeat(
        steps_total=beat.steps_total,
        steps_per_second=beat.steps_per_second,
        active_envs=beat.active_envs,
        queued_units=beat.queued_units,
    )


def decode_heartbeat(beat: worker_pb2.Heartbeat) -> WorkerBeat:
    """The heartbeat a Heartbeat message holds."""
    return WorkerBeat(beat.steps_total, beat.steps_per_second, beat.active_envs, beat.queued_units)


def encode_task(task: TaskAssignment, *, unit_columns: bool = False) -> worker_pb2.Task:
    """The Task message of a task, its replays' tensors encoded.

    Args:
        task: The task.
        unit_columns: Its units go in ``unit_columns`` (the worker declared
            ``rlfleet.unit-columns``), else as one EpisodeUnit message each.
    """
    message = worker_pb2.Task(
        task_id=task.task_id,
        request_id=task.request_id,
        mode=task.mode,  # type: ignore[arg-type]
        agent_version=task.agent_version,
        env_generation=task.env_generation,
        fragment_length=task.fragment_length,
        rounds=task.rounds,
        base_seed=task.base_seed,
        streams=task.streams,
        replays=[_encode_replay(replay) for replay in task.replays],
    )
    units = task.units
    if not len(units):
        return message
    if unit_columns:
        columns = message.unit_columns
        columns.episode_indices = units.episode_indices.astype("<i8", copy=False).tobytes()
        columns.env_seeds = units.env_seeds.astype("<u4").tobytes()
        columns.policy_seeds = units.policy_seeds.astype("<u4").tobytes()
    else:
        message.units.extend(
            worker_pb2.EpisodeUnit(episode_index=index, env_seed=env, policy_seed=policy)
            for index, env, policy in units
        )
    return message


def decode_task(task: worker_pb2.Task) -> TaskAssignment:
    """The task a Task message holds, its units as columns whichever form they came in.

    A replay whose tensors do not decode, or unit columns that do not, are
    not an error here: the task keeps why (``unreadable``), for the worker
    to refuse it by its id.
    """
    unreadable = ""
    replays: tuple[StreamReplay, ...] = ()
    if task.replays:
        try:
            replays = tuple(_decode_replay(replay) for replay in task.replays)
        except WireFormatError as exc:
            unreadable = f"a replay it cannot decode ({exc})"
    units = EMPTY_UNITS
    if task.HasField("unit_columns"):
        try:
            units = _decode_unit_columns(task)
        except WireFormatError as exc:
            unreadable = f"units it cannot decode ({exc})"
    elif task.units:
        flat: list[int] = []  # one flat list: numpy reads it faster than rows
        for unit in task.units:
            flat += (unit.episode_index, unit.env_seed, unit.policy_seed)
        rows = np.array(flat, dtype=np.int64).reshape(-1, 3)
        units = UnitColumns(rows[:, 0], rows[:, 1], rows[:, 2])
    return TaskAssignment(
        task.task_id,
        task.request_id,
        task.mode,
        task.agent_version,
        task.env_generation,
        units,
        task.fragment_length,
        task.rounds,
        task.base_seed,
        tuple(task.streams) if task.streams else (),
        replays,
        unreadable,
    )


def _decode_unit_columns(task: worker_pb2.Task) -> UnitColumns:
    """Raises WireFormatError if the columns are malformed (worker.proto EpisodeUnitColumns)."""
    if task.units:
        raise WireFormatError(
            f"Task {task.task_id} carries both units and unit_columns; a coordinator sends one"
        )
    message = task.unit_columns
    columns = {}
    for name, dtype in (("episode_indices", "<i8"), ("env_seeds", "<u4"), ("policy_seeds", "<u4")):
        data = getattr(message, name)
        size = np.dtype(dtype).itemsize
        if len(data) % size:
            raise WireFormatError(
                f"Task.unit_columns.{name} holds {len(data)} bytes, not a whole number of "
                f"{size}-byte values"
            )
        columns[name] = np.frombuffer(data, dtype=dtype)
    counts = {name: len(column) for name, column in columns.items()}
    if len(set(counts.values())) != 1:
        raise WireFormatError(f"Task.unit_columns' columns differ in length: {counts}")
    indices = columns["episode_indices"]
    if len(indices) and int(indices.min()) < 0:
        k = int(np.argmax(indices < 0))
        raise WireFormatError(
            f"Task.unit_columns.episode_indices[{k}]: {int(indices[k])} is negative (each "
            "index is >= 0)"
        )
    return UnitColumns(**columns)


def _encode_replay(replay: StreamReplay) -> worker_pb2.ReliabilityStreamReplay:
    message = worker_pb2.ReliabilityStreamReplay(
        stream=replay.stream,
        episode_index=replay.episode_index,
        fragment_index=replay.fragment_index,
    )
    if replay.actions is not None and replay.last_observation is not None:
        message.actions.CopyFrom(encode_tensor(replay.actions))
        message.last_observation.CopyFrom(encode_tensor(replay.last_observation))
    return message


def _decode_replay(replay: worker_pb2.ReliabilityStreamReplay) -> StreamReplay:
    """Raises WireFormatError if a tensor is malformed."""
    if replay.fragment_index == 0:
        return StreamReplay(replay.stream, replay.episode_index)
    return StreamReplay(
        replay.stream,
        replay.episode_index,
        replay.fragment_index,
        decode_tensor(replay.actions, name="ReliabilityStreamReplay.actions"),
        decode_tensor(replay.last_observation, name="ReliabilityStreamReplay.last_observation"),
    )


__all__ = [
    "decode_heartbeat",
    "decode_hello",
    "decode_task",
    "decode_welcome",
    "encode_heartbeat",
    "encode_hello",
    "encode_task",
    "encode_welcome",
]
