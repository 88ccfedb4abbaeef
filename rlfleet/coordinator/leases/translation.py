"""The coordinator's side of the lease face's translation (leases.proto).

The relay (rlfleet.coordinator.leases.manager and .face) reads and builds lease
messages only here. A learner's requests become :class:`RelayOpen`, a
:class:`~rlfleet.wire.leases.LeaseCallOrder` (the worker's type too) or
:class:`RelayClose`; the commands sent to workers and the responses sent to
learners are built here.

A worker's reply travels to the learner as the bytes it came in. The Join
stream's deserializer (:func:`relay_deserializer`) cuts
``WorkerMessage.lease_reply`` out of the worker's message; protobuf parses
that copy only to read its header and check its row counts
(:func:`relay_reply`); the learner's ``LeaseResponse`` is those same bytes
behind a new length prefix, with the worker's name appended (a field
appended to a serialized message sets it, protobuf encoding rules), or
several workers' such bytes for one call (:func:`lease_response`). The relay
never decodes observations, rewards or infos into arrays nor encodes them
again; the learner checks them against the lease's observation space
(rlfleet.wire.leases.decode_lease_response).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError

from rlfleet.coordinator.failures import CallError, detail_of
from rlfleet.coordinator.updates import check_env_update
from rlfleet.errors import PermissionDeniedError, WireFormatError
from rlfleet.security.pickle import PickleGate
from rlfleet.v1 import leases_pb2, tensor_pb2, updates_pb2, worker_pb2
from rlfleet.v1.updates_pb2 import EnvUpdate as EnvUpdateMessage
from rlfleet.wire import decode_env_update, encode_tensor_into
from rlfleet.wire._protowire import LEN, len_prefix, read_varint, tag
from rlfleet.wire.leases import OP_CODES, OP_NAMES, LeaseCallOrder, decode_lease_call

T = TypeVar("T")
#: A frame's bytes: ``bytes``, or a view of the buffer a large frame was read into.
D = TypeVar("D", bound="bytes | memoryview")

#: The ops a learner may call (CREATE is the coordinator's).
LEARNER_OPS = frozenset(OP_NAMES.values()) - {"create"}

_REPLY_TAG = tag(worker_pb2.WorkerMessage.LEASE_REPLY_FIELD_NUMBER, LEN)
_RESPONSE_REPLY = leases_pb2.LeaseResponse.REPLY_FIELD_NUMBER
_RESPONSE_REPLIES = leases_pb2.LeaseResponse.REPLIES_FIELD_NUMBER
_REPLIES_REPLY = leases_pb2.LeaseReplies.REPLIES_FIELD_NUMBER
_REPLY_WORKER = leases_pb2.LeaseReply.WORKER_FIELD_NUMBER


# --- the learner's requests -------------------------------------------------------


@dataclass(frozen=True)
class LeasedEnvSpec:
    """The env a lease's envs are built from (LeaseOpen.env), kept as sent."""

    env_id: str
    update: EnvUpdateMessage

    @property
    def pickled(self) -> bool:
        """Whether the envs come from pickled factories (one per env), not an env id."""
        return bool(self.update.pickled_env_factory)

    def check(self, pickle: PickleGate) -> None:
        """Refuses envs a lease may not build.

        Args:
            pickle: This coordinator's pickle gate: pickled factories from
                the network only with ``--allow-pickle``.

        Raises:
            CallError: INVALID_ARGUMENT naming the field, PERMISSION_DENIED
                for pickled factories this coordinator does not take.
        """
        if self.pickled:
            field = "LeaseOpen.env.pickled_env_factory"
            try:
                pickle.check(field)
            except PermissionDeniedError as exc:
                raise CallError(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{exc}. Register the env on the workers instead (rlfleet worker --import "
                    "mypkg.envs, which calls gymnasium.register) and lease it by its id",
                ) from None
            return
        check_env_update(decode_env_update(self.update))

    def with_factories(self, data: bytes) -> LeasedEnvSpec:
        """This spec with pickled factories registered in this process (an embedded fleet)."""
        update = updates_pb2.EnvUpdate()
        update.CopyFrom(self.update)
        update.pickled_env_factory = data
        return LeasedEnvSpec(self.env_id, update)


@dataclass(frozen=True)
class RelayOpen:
    """LeaseRequest.open: lease ``num_envs`` envs of ``env``."""

    env: LeasedEnvSpec
    num_envs: int
    timeout: float
    learner: str


@dataclass(frozen=True)
class RelayClose:
    """LeaseRequest.close: release the envs and end the call."""


RelayRequest = RelayOpen | LeaseCallOrder | RelayClose | None


def parse_request(data: bytes) -> RelayRequest:
    """A serialized LeaseRequest, decoded; None for an empty one.

    The call's fields are checked by the lease manager, which knows the lease.

    Raises:
        DecodeError: If the bytes do not parse (the face answers INVALID_ARGUMENT).
    """
    request = leases_pb2.LeaseRequest.FromString(data)
    body = request.WhichOneof("body")
    if body == "open":
        lease = request.open
        env = LeasedEnvSpec(lease.env.env_id, lease.env)
        return RelayOpen(env, lease.num_envs, lease.timeout_seconds, lease.learner)
    if body == "call":
        return decode_lease_call(0, request.call)
    if body == "close":
        return RelayClose()
    return None


# --- commands to workers ------------------------------------------------------------


def create_command(
    lease_id: int, env: LeasedEnvSpec, env_ids: Sequence[int], *, replaces_lost: bool
) -> worker_pb2.CoordinatorMessage:
    """The CREATE command building envs ``env_ids`` of a lease."""
    create = leases_pb2.LeaseCreate(env=env.update, env_ids=env_ids, replaces_lost=replaces_lost)
    return worker_pb2.CoordinatorMessage(
        lease=leases_pb2.LeaseCommand(lease_id=lease_id, create=create)
    )


def call_command(
    lease_id: int, call: LeaseCallOrder, rows: Sequence[int]
) -> worker_pb2.CoordinatorMessage:
    """The part of a learner's call for its envs ``call.env_ids[r]``, r in ``rows``."""
    message = worker_pb2.CoordinatorMessage()
    command = message.lease  # built in place: no nested message is copied
    command.lease_id = lease_id
    part = command.call
    part.call_id = call.call_id
    part.op = OP_CODES[call.op]
    whole = len(rows) == len(call.env_ids)  # one worker hosts every env of the call
    part.env_ids.extend(call.env_ids if whole else [call.env_ids[r] for r in rows])
    if call.options_json:
        part.options_json = call.options_json
    if call.name:
        part.name = call.name
    if call.value_json:
        part.value_json = call.value_json
    part.prefetch_reset = call.prefetch_reset
    part.whole_reply = call.whole_reply  # the worker answers its part in one reply
    if call.seeds:
        part.seeds.extend(call.seeds if whole else [call.seeds[r] for r in rows])
    if call.actions is not None:
        first, last = rows[0], rows[-1]
        # Hosts hold runs of env ids, so a worker's rows are usually a slice (a view).
        contiguous = last - first + 1 == len(rows)
        actions = call.actions[first : last + 1] if contiguous else call.actions[list(rows)]
        encode_tensor_into(part.actions, actions)
    return message


def release_command(lease_id: int) -> worker_pb2.CoordinatorMessage:
    """The command closing every env of a lease on a worker."""
    return worker_pb2.CoordinatorMessage(
        lease=leases_pb2.LeaseCommand(lease_id=lease_id, release=leases_pb2.LeaseRelease())
    )


# --- the workers' replies -----------------------------------------------------------


@dataclass(slots=True)  # not frozen: a frozen one costs ~3 us more to build, per reply
class RelayReply:
    """A worker's LeaseReply: its header, read; its body, the worker's bytes.

    Attributes:
        error: The ErrorDetail of a failed call or CREATE, else None.
        error_message: Its message ("" without an error).
        spec: CREATE replies: the serialized EnvSpec of the envs built.
        body: The serialized LeaseReply, as the worker sent it.
        specs: CREATE replies of envs whose specs differ: one serialized
            EnvSpec per env id (empty: all are ``spec``).
    """

    lease_id: int
    call_id: int
    op: str
    env_ids: list[int]
    error: updates_pb2.ErrorDetail | None
    error_message: str
    spec: bytes
    body: bytes
    specs: list[bytes] = field(default_factory=list)

    def named(self, worker: str) -> bytes:
        """The serialized LeaseReply with its ``worker`` field set to ``worker``."""
        name = worker.encode()
        return b"".join((self.body, len_prefix(_REPLY_WORKER, len(name)), name))


def lease_response(replies: Sequence[bytes]) -> bytes:
    """The serialized LeaseResponse relaying serialized LeaseReplies of one call
    (:meth:`RelayReply.named`): ``reply`` for one, ``replies`` for several."""
    if len(replies) == 1:
        return len_prefix(_RESPONSE_REPLY, len(replies[0])) + replies[0]
    parts = [part for reply in replies for part in (len_prefix(_REPLIES_REPLY, len(reply)), reply)]
    size = sum(len(part) for part in parts)
    return b"".join([len_prefix(_RESPONSE_REPLIES, size), *parts])


def relay_deserializer(other: Callable[[D], T]) -> Callable[[D], T | RelayReply]:
    """Wraps the Join stream's deserializer: a WorkerMessage holding only a
    ``lease_reply`` becomes a :class:`RelayReply` of its bytes; any other
    message goes to ``other``.

    Raises (from the returned function):
        WireFormatError: For a lease reply that does not parse or whose rows
            do not match its env ids.
    """

    def deserialize(data: D) -> T | RelayReply:
        if data[: len(_REPLY_TAG)] == _REPLY_TAG:
            reply = bytes(data)  # a lease reply is read as bytes (no copy of bytes)
            where = "WorkerMessage.lease_reply"
            length, start = read_varint(reply, len(_REPLY_TAG), len(reply), where)
            if start + length == len(reply):
                return relay_reply(reply[start:])
        return other(data)

    return deserialize


def relay_reply(body: bytes) -> RelayReply:
    """Reads a serialized LeaseReply's header and checks its row counts.

    The relay checks what it needs to route a reply and what keeps one env's
    answer from being mistaken for another's: the ids are distinct and every
    per-env field has one row per env id. Dtypes, observation shapes and
    values are checked by the learner against the lease's spaces.

    Raises:
        WireFormatError: Naming the field that is wrong.
    """
    try:
        reply = leases_pb2.LeaseReply.FromString(body)
    except DecodeError as exc:
        raise WireFormatError(f"LeaseReply: malformed message: {exc}") from None
    ids = list(reply.env_ids)
    op = OP_NAMES.get(reply.op, f"op {reply.op}")
    where = f"lease {reply.lease_id} call {reply.call_id} ({op}) reply"
    if len(set(ids)) != len(ids):
        raise WireFormatError(f"{where}: env ids {ids} repeat")
    error = reply.error if reply.HasField("error") else None
    if error is None:
        _check_rows(reply, op, len(ids), where)
    return RelayReply(
        reply.lease_id,
        reply.call_id,
        op,
        ids,
        error,
        error.message if error is not None else "",
        reply.env_spec.SerializeToString() if reply.HasField("env_spec") else b"",
        body,
        [spec.SerializeToString() for spec in reply.env_specs],
    )


def _check_rows(reply: leases_pb2.LeaseReply, op: str, count: int, where: str) -> None:
    wrong: dict[str, int] = {}
    if op == "create" and reply.env_specs and len(reply.env_specs) != count:
        wrong["env_specs"] = len(reply.env_specs)
    if op in ("reset", "step"):
        for name, rows in (
            # Pickled observations (a lease of pickled factories) replace the tensor.
            ("observations", len(reply.observations_pickle) or _rows(reply.observations)),
            ("infos", len(reply.infos)),
            ("infos_json", len(reply.infos_json) or count),  # empty: none of them has any
            ("infos_pickle", len(reply.infos_pickle) or count),
        ):
            if rows != count:
                wrong[name] = rows
        if op == "step":
            for name, tensor in (
                ("rewards", reply.rewards),
                ("terminated", reply.terminated),
                ("truncated", reply.truncated),
            ):
                if (rows := _rows(tensor)) != count:
                    wrong[name] = rows
    elif op == "render":
        if reply.HasField("frames") and (rows := _rows(reply.frames)) != count:
            wrong["frames"] = rows
    elif (
        op in ("get_attr", "call", "class_names")
        and (rows := len(reply.values_json) or len(reply.values_pickle)) != count
    ):
        wrong["values_json or values_pickle"] = rows
    if wrong:
        raise WireFormatError(
            f"{where}: answers {count} envs {list(reply.env_ids)} but has rows {wrong}; "
            "each must have one row per env id"
        )
    if reply.reset_env_ids:
        resets = list(reply.reset_env_ids)
        if not set(resets) <= set(reply.env_ids) or len(set(resets)) != len(resets):
            raise WireFormatError(
                f"{where}: reset_env_ids {resets} must be distinct ids of env_ids "
                f"{list(reply.env_ids)}"
            )
        reset_rows = (
            len(reply.reset_observations_pickle) or _rows(reply.reset_observations),
            len(reply.reset_infos),
        )
        pickled_infos = len(reply.reset_infos_pickle) or len(resets)
        if reset_rows != (len(resets), len(resets)) or pickled_infos != len(resets):
            raise WireFormatError(
                f"{where}: {len(resets)} prefetched resets with {reset_rows[0]} observations "
                f"and {reset_rows[1]} infos"
            )


def _rows(tensor: tensor_pb2.Tensor) -> int:
    """A tensor's first dimension, read from its header (-1 for a scalar or none)."""
    return int(tensor.shape[0]) if tensor.shape else -1


# --- responses to the learner ------------------------------------------------------


def opened_response(
    lease_id: int,
    spec: bytes,
    workers: Sequence[str],
    data: tuple[int, bytes] | None = None,
    specs: Sequence[bytes] = (),
) -> bytes:
    """The serialized LeaseResponse.opened of a lease whose envs were built;
    ``data``: the lease data channel's (port, ticket), if it is served;
    ``specs``: each env's serialized spec when they differ (LeaseOpened.env_specs)."""
    opened = leases_pb2.LeaseOpened(lease_id=lease_id, env_workers=workers)
    opened.env_spec.ParseFromString(spec)
    for env_spec in specs:
        opened.env_specs.add().ParseFromString(env_spec)
    if data is not None:
        opened.data.port, opened.data.ticket = data
    return leases_pb2.LeaseResponse(opened=opened).SerializeToString()


# --- the lease data channel (leases.proto, "The lease data channel") ---------------


def hello_ticket(data: bytes) -> bytes:
    """The ticket of a serialized LeaseDataHello.

    Raises:
        WireFormatError: If it does not parse.
    """
    try:
        return leases_pb2.LeaseDataHello.FromString(data).ticket
    except DecodeError as exc:
        raise WireFormatError(f"a first frame that is no LeaseDataHello: {exc}") from None


def data_address(port: int, ticket: bytes) -> leases_pb2.LeaseDataAddress:
    """Where and with what a worker dials the data channel (Welcome.lease_data)."""
    return leases_pb2.LeaseDataAddress(port=port, ticket=ticket)


def data_switch_command() -> worker_pb2.CoordinatorMessage:
    """The Join-stream marker after which a worker's lease commands come on its
    data connection (LeaseCommand.data_switch)."""
    return worker_pb2.CoordinatorMessage(
        lease=leases_pb2.LeaseCommand(data_switch=leases_pb2.LeaseDataSwitch())
    )


def no_workers(message: str) -> CallError:
    """UNAVAILABLE with the NO_WORKERS kind, which the learner raises as NoWorkersError."""
    detail = detail_of(updates_pb2.ERROR_KIND_NO_WORKERS, message)
    return CallError(grpc.StatusCode.UNAVAILABLE, message, detail)
