"""The lease face's translation: leases.proto messages to and from rlfleet types.

Step-level env leases (protos/rlfleet/v1/leases.proto) cross three parts: the
learner's LeaseStream, the coordinator's relay and the worker's LeaseHost.
This module is where their messages become rlfleet types and back, so that
the code that hosts, steps and answers envs holds none. The coordinator's
relay has its own side, rlfleet.coordinator.leases.translation, which
forwards the workers' replies as bytes and shares this module's types.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlfleet._util.values import json_value
from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, ProtocolError, RlfleetError, UsageError, WrongTypeError
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import leases_pb2, tensor_pb2, worker_pb2
from rlfleet.v1.updates_pb2 import EnvUpdate as EnvUpdateMessage
from rlfleet.wire import (
    decode_env_spec,
    decode_tensor,
    decode_tensor_list,
    encode_env_spec,
    encode_tensor,
    encode_tensor_into,
)
from rlfleet.wire.lease_values import (
    PICKLES_HINT,
    Pickler,
    ReplyCheck,
    add_infos,
    add_observations,
    decode_observations,
    infos_of,
    load_values,
    plain_json,
)

#: Op names by LeaseOp (the vector-env command names of rlfleet.envs, and CREATE).
OP_NAMES: dict[leases_pb2.LeaseOp, str] = {
    leases_pb2.LEASE_OP_CREATE: "create",
    leases_pb2.LEASE_OP_RESET: "reset",
    leases_pb2.LEASE_OP_STEP: "step",
    leases_pb2.LEASE_OP_RENDER: "render",
    leases_pb2.LEASE_OP_GET_ATTR: "get_attr",
    leases_pb2.LEASE_OP_SET_ATTR: "set_attr",
    leases_pb2.LEASE_OP_CALL: "call",
    leases_pb2.LEASE_OP_CLASS_NAMES: "class_names",
}
#: LeaseOp by op name.
OP_CODES: dict[str, leases_pb2.LeaseOp] = {name: op for op, name in OP_NAMES.items()}
#: A STEP reply's per-env columns: field, name in errors, Python type, and
#: dtype (leases.proto: rewards float64, terminated and truncated bool;
#: others are converted).
_STEP_COLUMNS = (
    ("rewards", "LeaseReply.rewards", float, tensor_pb2.DTYPE_FLOAT64),
    ("terminated", "LeaseReply.terminated", bool, tensor_pb2.DTYPE_BOOL),
    ("truncated", "LeaseReply.truncated", bool, tensor_pb2.DTYPE_BOOL),
)
#: Ops whose answers carry JSON values (LeaseReply.values_json).
_JSON_OPS = ("get_attr", "call", "class_names")


# --- commands: coordinator -> worker ---------------------------------------------


@dataclass(frozen=True)
class LeasedEnvSource:
    """What to build leased envs from (LeaseCreate.env, an EnvUpdate)."""

    env_id: str
    kwargs_json: str
    max_episode_length: int | None
    #: EnvUpdate.pickled_env_factory: b"" or the cloudpickled list of one
    #: factory per env of the lease (only where pickles are allowed).
    pickled: bytes
    vectorization: str = ""  # EnvUpdate.vectorization: leases refuse native vector envs


@dataclass(frozen=True)
class LeaseCreateOrder:
    """Build envs ``env_ids`` of a lease (LeaseCreate)."""

    lease_id: int
    env: LeasedEnvSource
    env_ids: list[int]
    replaces_lost: bool


@dataclass(slots=True)  # not frozen: a frozen one took 4 us to build, twice per call
class LeaseCallOrder:
    """Run ``op`` on envs ``env_ids`` of a lease (LeaseCall); read-only by convention.

    Attributes:
        seeds: RESET: one per env (negative: none), or empty.
        actions: STEP: the actions, one row per env; None if they did not
            decode (``bad_actions`` says why).
    """

    lease_id: int
    call_id: int
    op: str
    env_ids: list[int]
    seeds: list[int] = field(default_factory=list)
    options_json: str = ""
    actions: np.ndarray | None = None
    bad_actions: RlfleetError | None = None
    name: str = ""
    value_json: str = ""
    prefetch_reset: bool = False
    whole_reply: bool = False


@dataclass(frozen=True)
class LeaseReleaseOrder:
    """Close envs ``env_ids`` of a lease (all of them if empty)."""

    lease_id: int
    env_ids: list[int]


LeaseOrder = LeaseCreateOrder | LeaseCallOrder | LeaseReleaseOrder | None


def decode_lease_command(command: leases_pb2.LeaseCommand) -> LeaseOrder:
    """The order a LeaseCommand carries; None for an empty one."""
    body = command.WhichOneof("body")
    if body == "create":
        create = command.create
        env = create.env
        source = LeasedEnvSource(
            env.env_id,
            env.kwargs_json,
            env.max_episode_length if env.HasField("max_episode_length") else None,
            env.pickled_env_factory,
            env.vectorization,
        )
        return LeaseCreateOrder(
            command.lease_id, source, list(create.env_ids), create.replaces_lost
        )
    if body == "call":
        return decode_lease_call(command.lease_id, command.call)
    if body == "release":
        return LeaseReleaseOrder(command.lease_id, list(command.release.env_ids))
    return None


def decode_lease_call(lease_id: int, call: leases_pb2.LeaseCall) -> LeaseCallOrder:
    """The order a LeaseCall carries (a worker's command, or a learner's request
    the coordinator relays); actions that do not decode are kept as ``bad_actions``."""
    op = OP_NAMES.get(call.op, f"op {call.op}")
    actions, bad = None, None
    if op == "step":
        try:
            actions = decode_tensor(call.actions, name="LeaseCall.actions")
        except RlfleetError as exc:
            bad = exc
    return LeaseCallOrder(
        lease_id,
        call.call_id,
        op,
        list(call.env_ids),
        list(call.seeds),
        call.options_json,
        actions,
        bad,
        call.name,
        call.value_json,
        call.prefetch_reset,
        call.whole_reply,
    )


# --- replies: worker -> coordinator ------------------------------------------------


@dataclass
class LeaseAnswer:
    """One env's answer to a call: its fields, or the exception it raised."""

    env_id: int
    observation: Any = None
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)
    error: BaseException | None = None
    value: Any = None  # the answer of RENDER, GET_ATTR, CALL, CLASS_NAMES
    reset: tuple[Any, dict[str, Any]] | None = None  # a prefetched reset (obs, info)


@dataclass(frozen=True)
class LeaseCreated:
    """Envs of a lease were built (``spec``), or could not be (``error``)."""

    lease_id: int
    env_ids: list[int]
    spec: EnvSpec | None = None
    error: BaseException | None = None
    #: One spec per env of ``env_ids`` when they differ (envs from different factories).
    specs: list[EnvSpec] | None = None


@dataclass(frozen=True)
class LeaseAnswers:
    """Successful answers of some envs to one call."""

    lease_id: int
    call_id: int
    op: str
    answers: Sequence[LeaseAnswer]
    #: The lease's envs came from pickled factories: what the plain fields
    #: cannot carry travels pickled with it (rlfleet.wire.lease_values).
    pickler: Pickler | None = None


@dataclass(frozen=True)
class LeaseCallFailed:
    """Envs ``env_ids`` could not answer a call: ``error`` says why."""

    lease_id: int
    call_id: int
    op: str
    env_ids: list[int]
    error: BaseException


LeaseReport = LeaseCreated | LeaseAnswers | LeaseCallFailed


def lease_report_message(report: LeaseReport, worker: str) -> worker_pb2.WorkerMessage:
    """The WorkerMessage of a report of worker ``worker``.

    Raises:
        ConfigError: If an answer holds a value that cannot travel (an info
            value neither numeric nor JSON); nothing is sent then.
    """
    if isinstance(report, LeaseCreated):
        reply = leases_pb2.LeaseReply(lease_id=report.lease_id, op=leases_pb2.LEASE_OP_CREATE)
        reply.env_ids.extend(report.env_ids)
        if report.error is not None:
            reply.error.CopyFrom(_rpc.detail_from_exception(report.error, worker=worker))
        elif report.spec is not None:
            reply.env_spec.CopyFrom(encode_env_spec(report.spec))
            if report.specs is not None:
                reply.env_specs.extend(encode_env_spec(spec) for spec in report.specs)
    elif isinstance(report, LeaseCallFailed):
        op = OP_CODES.get(report.op, leases_pb2.LEASE_OP_UNSPECIFIED)
        reply = leases_pb2.LeaseReply(lease_id=report.lease_id, call_id=report.call_id, op=op)
        reply.env_ids.extend(report.env_ids)
        reply.error.CopyFrom(_rpc.detail_from_exception(report.error, worker=worker))
        if len(report.env_ids) == 1:
            reply.error.env_index = report.env_ids[0]
    else:
        message = worker_pb2.WorkerMessage()
        _fill_answers(message.lease_reply, report)  # in place: the tensors are not copied again
        return message
    return worker_pb2.WorkerMessage(lease_reply=reply)


def _fill_answers(reply: leases_pb2.LeaseReply, report: LeaseAnswers) -> None:
    op, outcomes = report.op, report.answers
    reply.lease_id = report.lease_id
    reply.call_id = report.call_id
    reply.op = OP_CODES[op]
    reply.env_ids.extend(o.env_id for o in outcomes)
    if op in ("render", "set_attr"):
        frames = [o.value for o in outcomes]
        if op == "render" and all(f is not None for f in frames):
            reply.frames.CopyFrom(encode_tensor(np.stack([np.asarray(f) for f in frames])))
        return
    pickler = report.pickler
    if op in _JSON_OPS:
        try:
            texts = [json.dumps(o.value, default=plain_json, allow_nan=True) for o in outcomes]
        except (TypeError, ValueError, ConfigError) as exc:
            if pickler is None:
                raise ConfigError(
                    f"{op}: {exc}; leases of env ids carry JSON-compatible attributes and "
                    f"return values, {PICKLES_HINT}"
                ) from exc
            where = f"lease {report.lease_id} {op} value"
            reply.values_pickle.extend(pickler(o.value, where) for o in outcomes)
            return
        reply.values_json.extend(texts)
        return
    add_observations(
        reply.observations, reply.observations_pickle, [o.observation for o in outcomes], pickler
    )
    if op == "step":
        encode_tensor_into(reply.rewards, np.array([o.reward for o in outcomes], np.float64))
        encode_tensor_into(reply.terminated, np.array([o.terminated for o in outcomes], bool))
        encode_tensor_into(reply.truncated, np.array([o.truncated for o in outcomes], bool))
    infos = [(o.env_id, o.info) for o in outcomes]
    add_infos(reply.infos, reply.infos_json, reply.infos_pickle, infos, what="", pickler=pickler)
    resets = [(o.env_id, o.reset) for o in outcomes if o.reset is not None]
    if resets:
        reply.reset_env_ids.extend(env_id for env_id, _ in resets)
        rows = [obs for _, (obs, _) in resets]
        add_observations(reply.reset_observations, reply.reset_observations_pickle, rows, pickler)
        infos = [(env_id, info) for env_id, (_, info) in resets]
        add_infos(
            reply.reset_infos,
            reply.reset_infos_json,
            reply.reset_infos_pickle,
            infos,
            what=" reset",
            pickler=pickler,
        )


# --- the learner's stream: requests out, responses in -------------------------------


@dataclass(frozen=True)
class LeaseEnvFailure:
    """An env's answer that is an error (it raised, its lease ended, it timed out)."""

    error: RlfleetError


@dataclass(frozen=True)
class LeaseOpenedEvent:
    """The lease exists (LeaseOpened): its id, env 0's spec, the hosting workers,
    the lease data channel's (port, ticket) when the coordinator serves it, and
    each env's spec (``env_specs[i]``, env 0's for all unless they differ)."""

    lease_id: int
    env_spec: EnvSpec
    env_workers: list[str]
    data: tuple[int, bytes] | None = None
    env_specs: list[EnvSpec] = field(default_factory=list)


@dataclass(frozen=True)
class LeaseRepliedEvent:
    """Answers of some envs to one call (a LeaseReply), decoded.

    Attributes:
        answers: Per env of ``env_ids``: ``(obs, info)`` for reset, ``(obs,
            reward, terminated, truncated, info)`` for step, the value for
            the other ops, or a :class:`LeaseEnvFailure`.
        resets: Resets the worker made as episodes ended (prefetch_reset),
            by env id: ``(obs, info)``.
        workers: The worker that answered, by env id (its name, as the
            coordinator set it; an env moved off a lost worker names its
            new host).
    """

    call_id: int
    env_ids: list[int]
    answers: list[Any]
    resets: dict[int, tuple[Any, dict[str, Any]]]
    workers: dict[int, str] = field(default_factory=dict)


def open_request(
    env: EnvConfig, num_envs: int, timeout: float, learner: str, pickled_factories: bytes = b""
) -> bytes:
    """The first message of a Lease stream (LeaseRequest.open), serialized.

    ``pickled_factories``: the cloudpickled list of one env factory per env,
    for a coordinator and workers that take pickles (``env`` then only
    names them in messages).
    """
    update = EnvUpdateMessage(env_id=env.id, kwargs_json=json.dumps(dict(env.kwargs)))
    if pickled_factories:
        update.pickled_env_factory = pickled_factories
    if env.max_episode_length is not None:
        update.max_episode_length = env.max_episode_length
    if env.vectorization is not None:
        update.vectorization = env.vectorization  # workers refuse it, saying why
    request = leases_pb2.LeaseRequest(
        open=leases_pb2.LeaseOpen(
            env=update, num_envs=num_envs, timeout_seconds=timeout, learner=learner
        )
    )
    return request.SerializeToString()


#: The last message of a Lease stream (LeaseRequest.close), serialized.
CLOSE_REQUEST = leases_pb2.LeaseRequest(close=leases_pb2.LeaseClose()).SerializeToString()


def data_hello(ticket: bytes) -> bytes:
    """The serialized LeaseDataHello presenting ``ticket`` (the lease data channel)."""
    return leases_pb2.LeaseDataHello(ticket=ticket).SerializeToString()


def call_request(
    call_id: int,
    op: str,
    ids: Sequence[int],
    args: Sequence[Any],
    prefetch_reset: bool,
    *,
    whole_reply: bool = False,
) -> bytes:
    """The LeaseRequest.call of one vector-env command, serialized.

    ``args[k]`` is env ``ids[k]``'s argument, as rlfleet.envs' commands take
    them: reset's kwargs, step's action, ``name``, ``(name, value)`` or
    ``(name, args, kwargs)``. ``whole_reply``: answer all of them in one
    response (LeaseCall.whole_reply), for a learner that waits for all.

    Raises:
        UsageError: For arguments a lease cannot carry.
    """
    request = leases_pb2.LeaseRequest()
    call = request.call  # built in place: no nested message is copied
    call.call_id = call_id
    call.op = OP_CODES[op]
    call.env_ids.extend(ids)
    call.whole_reply = whole_reply
    if op == "reset":
        seeds = [kwargs.get("seed") for kwargs in args]
        if any(seed is not None for seed in seeds):
            call.seeds.extend(-1 if seed is None else int(seed) for seed in seeds)
        options = {json.dumps(kwargs.get("options")) for kwargs in args}
        extra = sorted({key for kwargs in args for key in kwargs} - {"seed", "options"})
        if extra or len(options) > 1:
            raise UsageError(
                f"reset() of leased envs takes seed and options (the same options for every "
                f"env of the call), got {extra or 'different options per env'}"
            )
        text = options.pop()
        if text != "null":
            call.options_json = text
    elif op == "step":
        try:  # one conversion for the batch (the rows are usually one array's)
            actions = np.asarray(args)
        except ValueError as exc:
            raise UsageError(
                f"step() of leased envs takes one action of the same shape per env: {exc}"
            ) from exc
        encode_tensor_into(call.actions, actions)
        call.prefetch_reset = prefetch_reset
    elif op in ("get_attr", "set_attr", "call"):
        first = args[0]
        call.name = first if op == "get_attr" else first[0]
        if op == "set_attr":
            call.value_json = _json_text(first[1], f"set_env_attr({call.name!r})")
        elif op == "call":
            call.value_json = _json_text([list(first[1]), first[2]], f"method {call.name!r}")
    return request.SerializeToString()


def decode_lease_response(
    data: bytes, check: ReplyCheck | None
) -> LeaseOpenedEvent | LeaseRepliedEvent | None:
    """A LeaseResponse, decoded; None for an empty one.

    Args:
        data: The serialized response.
        check: The lease's spaces and whether it carries pickles (None
            before LeaseOpened): observations are checked against them.

    Raises:
        ProtocolError: If the response does not parse, or a reply is
            inconsistent or its observations do not fit ``space``.
    """
    try:
        response = leases_pb2.LeaseResponse.FromString(data)
    except Exception as exc:  # protobuf's DecodeError
        raise ProtocolError(f"a LeaseResponse did not parse: {exc}") from exc
    body = response.WhichOneof("body")
    if body == "opened":
        opened = response.opened
        spec = decode_env_spec(opened.env_spec)
        workers = list(opened.env_workers)
        specs = [decode_env_spec(s) for s in opened.env_specs] or [spec] * len(workers)
        if len(specs) != len(workers):
            raise ProtocolError(
                f"a LeaseOpened names {len(workers)} env workers and {len(specs)} env specs"
            )
        return LeaseOpenedEvent(
            int(opened.lease_id),
            spec,
            workers,
            (opened.data.port, opened.data.ticket) if opened.HasField("data") else None,
            specs,
        )
    if body not in ("reply", "replies"):
        return None
    if check is None:
        raise ProtocolError("a LeaseReply arrived before LeaseOpened")
    replies = [response.reply] if body == "reply" else list(response.replies.replies)
    if len({reply.call_id for reply in replies}) != 1:
        raise ProtocolError(
            f"a LeaseReplies holds {len(replies)} replies of calls "
            f"{sorted({reply.call_id for reply in replies})}; it must hold one call's"
        )
    event = LeaseRepliedEvent(int(replies[0].call_id), [], [], {})
    for reply in replies:  # several workers' parts of one call
        event.env_ids.extend(reply.env_ids)
        event.answers.extend(_answers(reply, check))
        event.resets.update(_prefetched_resets(reply, check))
        if reply.worker:
            event.workers.update(dict.fromkeys(reply.env_ids, reply.worker))
    return event


def _json_text(value: Any, where: str) -> str:
    try:
        return json.dumps(value, default=_plain_arg)
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"{where}: leased envs take plain (JSON) values, got {type(value).__name__}: {exc}"
        ) from exc


def _plain_arg(value: Any) -> Any:
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    raise WrongTypeError(f"{type(value).__name__} is not JSON")


def _answers(reply: leases_pb2.LeaseReply, check: ReplyCheck) -> list[Any]:
    """Each env's answer in a reply, decoded and its observations checked."""
    count = len(reply.env_ids)
    if reply.HasField("error"):
        error = _rpc.error_from_detail(reply.error)
        return [LeaseEnvFailure(error)] * count
    op = reply.op
    if op in (leases_pb2.LEASE_OP_RESET, leases_pb2.LEASE_OP_STEP):
        obs = decode_observations(
            reply.observations, reply.observations_pickle, reply.env_ids, check, reply.worker
        )
        infos = infos_of(reply.infos, reply.infos_json, reply.infos_pickle, "infos", check)
        if len(obs) != count or len(infos) != count:
            raise ProtocolError(
                f"a lease reply for {count} envs holds {len(obs)} observations and "
                f"{len(infos)} infos"
            )
        if op == leases_pb2.LEASE_OP_RESET:
            return list(zip(obs, infos, strict=True))
        # The hot path, inline: each column straight to Python values (the
        # wire's float64 and bool columns without numpy).
        columns = []
        for name, where, kind, dtype in _STEP_COLUMNS:
            tensor = getattr(reply, name)
            length, values = decode_tensor_list(tensor, name=where)
            if length != count:
                shape = (length,) if length >= 0 else tuple(tensor.shape)
                raise ProtocolError(
                    f"a lease reply for {count} envs holds {name} of shape {shape}; "
                    f"it must be ({count},)"
                )
            if tensor.dtype != dtype:  # other numbers: converted as numpy's astype would
                values = [kind(value) for value in values]
            columns.append(values)
        return list(zip(obs, *columns, infos, strict=True))
    if op == leases_pb2.LEASE_OP_RENDER:
        if not reply.HasField("frames"):
            return [None] * count
        frames = decode_tensor(reply.frames, name="LeaseReply.frames")
        return [frames[k] for k in range(count)]
    if op == leases_pb2.LEASE_OP_SET_ATTR:
        return [None] * count
    if reply.values_pickle:
        return load_values(reply.values_pickle, "values_pickle", check)
    return [json_value(text, "LeaseReply.values_json") for text in reply.values_json]


def _prefetched_resets(
    reply: leases_pb2.LeaseReply, check: ReplyCheck
) -> dict[int, tuple[Any, dict[str, Any]]]:
    """The resets a STEP reply carries (LeaseCall.prefetch_reset), by env id."""
    if not reply.reset_env_ids:
        return {}
    obs = decode_observations(
        reply.reset_observations,
        reply.reset_observations_pickle,
        reply.reset_env_ids,
        check,
        reply.worker,
    )
    count = len(reply.reset_env_ids)
    if len(obs) != count or len(reply.reset_infos) != count:
        raise ProtocolError(
            f"a lease reply carries {count} prefetched resets with {len(obs)} "
            f"observations and {len(reply.reset_infos)} infos"
        )
    infos = infos_of(
        reply.reset_infos, reply.reset_infos_json, reply.reset_infos_pickle, "reset_infos", check
    )
    return {int(env_id): (obs[k], infos[k]) for k, env_id in enumerate(reply.reset_env_ids)}
