"""The learner face, client side: LearnerService calls in rlfleet's own types.

The one module of the client library that holds generated messages
(tests/test_layering.py). :class:`LearnerStubs` makes the calls a sampler
needs with the types of :mod:`rlfleet.protocol.learner_calls` in and out: requests
are built from them in the calls' serializers, and every response is read
into one (:func:`parse_response`) before the sampler sees it. Result
chunks stay out of protobuf objects (``rlfleet.wire.parse_with_chunk``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import grpc

from rlfleet._util.prebuilt import prebuilt
from rlfleet.client._errors import call_error
from rlfleet.client._updates import (
    AgentUpdateForm,
    EnvUpdateForm,
    agent_change,
    env_change,
    env_config_of,
)
from rlfleet.client.status import FleetStatus, WorkerStatus
from rlfleet.errors import ConfigError
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.learner_calls import (
    CallHeader,
    ResultPart,
    SampleAsk,
    StatusAsk,
    SubscribeAsk,
    UpdatePush,
    UpdateReceipt,
)
from rlfleet.protocol.modes import Footer
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.frame_pieces import FramePieces
from rlfleet.v1 import learner_pb2
from rlfleet.v1.updates_pb2 import AgentUpdate as AgentUpdateMessage
from rlfleet.v1.updates_pb2 import EnvUpdate as EnvUpdateMessage
from rlfleet.wire import (
    decode_agent_update,
    decode_env_spec,
    decode_env_update,
    decode_error_detail,
    encode_agent_change,
    encode_env_change,
    parse_with_chunk,
)
from rlfleet.wire.chunks import Chunk
from rlfleet.wire.result_message import read_result_frame, read_result_frame_pieces
from rlfleet.wire.results import ResultHeader

#: What ``agent_update`` arguments may be: the forms of
#: :func:`~rlfleet.client._updates.agent_change`, or an ``AgentUpdate``
#: message (e.g. one carrying a pickled policy, docs/security.md).
AgentUpdateLike: TypeAlias = AgentUpdateForm | AgentUpdateMessage
#: What ``env_update`` arguments may be: an EnvConfig, a gymnasium id, or an
#: ``EnvUpdate`` message.
EnvUpdateLike: TypeAlias = EnvUpdateForm | EnvUpdateMessage


@dataclass(frozen=True)
class EmptyResponse:
    """A SampleResponse without a body (gRPC takes a deserializer's None for a failure)."""


class ResultChannel(NamedTuple):
    """An OpenResultChannel answer: a results connection to dial.

    Attributes:
        channel: Its id (``SampleRequest.result_channel``).
        port: The coordinator's data port.
        ticket: The ticket to dial it with.
        requests: The coordinator takes Sample requests on the connection
            (``ResultChannelOpened.requests_on_data``; False from an older one).
        max_request_bytes: The longest request frame the coordinator reads
            there (``ResultChannelOpened.max_request_bytes``; 0: not said).
    """

    channel: int
    port: int
    ticket: bytes
    requests: bool = False
    max_request_bytes: int = 0


#: What one response of a Sample or Subscribe call holds.
ResponsePart: TypeAlias = CallHeader | ResultPart | Footer | EmptyResponse


def agent_change_of(update: AgentUpdateLike) -> AgentChange:
    """The AgentChange an ``agent_update`` argument stands for.

    Raises:
        ConfigError: As :func:`~rlfleet.client._updates.agent_change`.
        WireFormatError: If a parameter cannot travel (or, in a message, is
            malformed).
    """
    if isinstance(update, AgentUpdateMessage):
        return decode_agent_update(update).renumbered(0)
    return agent_change(update)


def env_change_of(update: EnvUpdateLike) -> EnvChange:
    """The EnvChange an ``env_update`` argument stands for.

    Raises:
        ConfigError: As :func:`~rlfleet.client._updates.env_change`.
    """
    if isinstance(update, EnvUpdateMessage):
        return decode_env_update(update).renumbered(0)
    return env_change(update)


class LearnerStubs:
    """The LearnerService calls a sampler makes, on one channel.

    Failed calls raise ``grpc.RpcError`` (the caller maps it to rlfleet's
    errors, ``rlfleet.client._errors``).

    Args:
        channel: The channel to the coordinator.
    """

    def __init__(self, channel: grpc.Channel) -> None:
        self._sample = channel.unary_stream(
            _rpc.SAMPLE, request_serializer=sample_request, response_deserializer=parse_response
        )
        self._update_agent = channel.unary_unary(
            _rpc.UPDATE_AGENT,
            request_serializer=_update_request,
            response_deserializer=_update_receipt,
        )
        self._update_env = channel.unary_unary(
            _rpc.UPDATE_ENV,
            request_serializer=_update_request,
            response_deserializer=_update_receipt,
        )
        self._open_result_channel = channel.unary_unary(
            _rpc.OPEN_RESULT_CHANNEL,
            request_serializer=_result_channel_request,
            response_deserializer=_result_channel_opened,
        )
        self._get_status = channel.unary_unary(
            _rpc.GET_STATUS,
            request_serializer=_status_request,
            response_deserializer=_rpc.plain_deserializer(learner_pb2.FleetStatus),
        )

    def sample(self, ask: SampleAsk, *, timeout: float | None) -> grpc.CallIterator[ResponsePart]:
        """Starts a Sample call; iterate it for its responses, cancel it to end it."""
        return self._sample(ask, timeout=timeout)

    def update_agent(self, push: UpdatePush, *, timeout: float | None) -> UpdateReceipt:
        """UpdateAgent."""
        return self._update_agent(push, timeout=timeout)

    def update_env(self, push: UpdatePush, *, timeout: float | None) -> UpdateReceipt:
        """UpdateEnv."""
        return self._update_env(push, timeout=timeout)

    def open_result_channel(self, *, timeout: float | None) -> ResultChannel | None:
        """OpenResultChannel: the new connection; None without a data channel, and
        from a coordinator that does not know the method (UNIMPLEMENTED).

        Raises:
            RlfleetError: The typed error of another failure.
        """
        try:
            return self._open_result_channel(None, timeout=timeout)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # an older coordinator
                return None
            raise call_error(exc, what="OpenResultChannel", timeout=timeout) from None

    def status(self, *, timeout: float | None) -> FleetStatus:
        """GetStatus.

        Raises:
            WireFormatError: If the env spec in the answer does not decode.
        """
        return fleet_status_of(self._get_status(StatusAsk(), timeout=timeout))


def subscribe(
    channel: grpc.Channel, ask: SubscribeAsk, *, timeout: float | None
) -> grpc.CallIterator[ResponsePart]:
    """Starts a Subscribe call on ``channel`` (one of its own: see RemoteSampler.stream)."""
    call = channel.unary_stream(
        _rpc.SUBSCRIBE, request_serializer=_subscribe_request, response_deserializer=parse_response
    )
    return call(ask, timeout=timeout)


# --- requests -----------------------------------------------------------------------


def sample_request(ask: SampleAsk) -> bytes:
    """The serialized SampleRequest of ``ask`` (a Sample call's, or a frame on the
    results connection: learner.proto, "Requests on a learner's results connection")."""
    request = learner_pb2.SampleRequest(
        mode=ask.mode,  # type: ignore[arg-type]
        amount=ask.amount,
        fragment_length=ask.fragment_length,
        request_index=ask.request_index,
        wait_for_workers_seconds=ask.wait_for_workers_seconds,
        itr=ask.itr,
        coordinator_id=ask.coordinator_id,
        first_episode=ask.first_episode,
        result_channel=ask.result_channel,
        result_call=ask.result_call,
        footer_on_data=ask.footer_on_data,
    )
    if ask.seed is not None:
        request.seed = ask.seed
    if ask.agent_update is not None:
        request.agent_update.CopyFrom(encode_agent_change(ask.agent_update))
    if ask.env_update is not None:
        request.env_update.CopyFrom(encode_env_change(ask.env_update))
    return request.SerializeToString()


def _subscribe_request(ask: SubscribeAsk) -> bytes:
    request = learner_pb2.SubscribeRequest(
        mode=ask.mode,  # type: ignore[arg-type]
        fragment_length=ask.fragment_length,
        max_buffered_steps=ask.max_buffered_steps,
    )
    if ask.seed is not None:
        request.seed = ask.seed
    return request.SerializeToString()


def _result_channel_request(_: None) -> bytes:
    return learner_pb2.ResultChannelRequest().SerializeToString()


def _result_channel_opened(data: bytes) -> ResultChannel | None:
    opened = learner_pb2.ResultChannelOpened.FromString(data)
    if not opened.HasField("data"):
        return None
    return ResultChannel(
        opened.channel_id,
        opened.data.port,
        opened.data.ticket,
        opened.requests_on_data,
        opened.max_request_bytes,
    )


def _status_request(ask: StatusAsk) -> bytes:
    return learner_pb2.StatusRequest().SerializeToString()


def _update_request(push: UpdatePush) -> bytes:
    if isinstance(push.change, AgentChange):
        agent = encode_agent_change(push.change)
        agent.coordinator_id = push.coordinator_id
        return agent.SerializeToString()
    env = encode_env_change(push.change)
    env.coordinator_id = push.coordinator_id
    return env.SerializeToString()


# --- responses ----------------------------------------------------------------------


def parse_response(data: bytes) -> ResponsePart:
    """Reads one SampleResponse (a result's chunk stays a view of ``data``).

    Raises:
        WireFormatError: If the bytes are malformed.
    """
    message, chunk = parse_with_chunk(learner_pb2.SampleResponse, data, _rpc.RESPONSE_CHUNK_PATH)
    body = message.WhichOneof("body")
    if body == "result":
        return ResultPart(ResultHeader.of(message.result), chunk)
    if body == "header":
        return _call_header(message.header)
    if body == "footer":
        return _footer(message.footer)
    return EmptyResponse()


def _call_header(header: learner_pb2.SampleHeader) -> CallHeader:
    spec = None
    if header.HasField("env_spec"):
        spec = header.env_spec.SerializeToString(deterministic=True)
    return CallHeader(
        header.request_id,
        header.agent_version,
        header.env_generation,
        header.coordinator_id,
        spec,
        header.results_on_data,
        header.footer_on_data,
    )


def _footer(footer: learner_pb2.SampleFooter) -> Footer:
    return Footer(
        footer.num_episodes,
        footer.total_steps,
        footer.workers_used,
        footer.reassigned_units,
        footer.data_results,
    )


@dataclass(frozen=True)
class CallFailed:
    """A request sent on a results connection failed (``SampleResponse.failure``):
    what its Sample call's status would have said.

    Attributes:
        code: The gRPC status code's number.
        message: The status message.
        detail: The structured error sent with it, if any.
    """

    code: int
    message: str
    detail: ErrorReport | None


@dataclass(frozen=True)
class ResultsEnd:
    """A results connection's end marker of a call: ``results`` result frames came."""

    results: int


def read_coordinator_result(
    data: bytes | bytearray | memoryview | FramePieces,
) -> tuple[int, ResultHeader, Chunk] | None:
    """A results-connection frame holding a result as the coordinator writes it,
    read in one call: its call's number, header and chunk (a view of ``data``,
    or of its data piece when the frame was handed over in memory by
    ``Fleet.local``); None for anything else, left to :func:`parse_result_frame`.
    """
    if isinstance(data, FramePieces):
        return read_result_frame_pieces(data.head, data.data, data.tail)
    return read_result_frame(data)


#: What a results connection's frame holds.
ResultFrame: TypeAlias = ResultPart | ResultsEnd | Footer | CallHeader | CallFailed | EmptyResponse


def parse_result_frame(
    data: bytes | bytearray | memoryview | FramePieces,
) -> tuple[int, ResultFrame]:
    """Reads one frame of a results connection: its call's number and what it holds
    (a result message's chunk stays a view of ``data``, or of its data piece; a
    footer when the call's footer travels there: ``SampleRequest.footer_on_data``;
    a header or failure when the request itself travelled there).

    Raises:
        WireFormatError: If the bytes are malformed.
    """
    read = read_coordinator_result(data)  # as the coordinator writes it: no protobuf object
    if read is not None:  # its header and chunk checked already
        return read[0], prebuilt(ResultPart, header=read[1], chunk=read[2])
    # Anything else is read as a frame off a socket is, with the same errors.
    frame = data.joined() if isinstance(data, FramePieces) else data
    message, chunk = parse_with_chunk(learner_pb2.SampleResponse, frame, _rpc.RESPONSE_CHUNK_PATH)
    body = message.WhichOneof("body")
    if body == "result":
        return message.result_call, ResultPart(ResultHeader.of(message.result), chunk)
    if body == "results_end":
        return message.result_call, ResultsEnd(message.results_end.results)
    if body == "footer":
        return message.result_call, _footer(message.footer)
    if body == "header":
        return message.result_call, _call_header(message.header)
    if body == "failure":
        failure = message.failure
        detail = decode_error_detail(failure.detail) if failure.HasField("detail") else None
        return message.result_call, CallFailed(failure.code, failure.message, detail)
    return message.result_call, EmptyResponse()


def _update_receipt(data: bytes) -> UpdateReceipt:
    ack = learner_pb2.UpdateAck.FromString(data)
    return UpdateReceipt(
        ack.agent_version, ack.env_generation, ack.workers_updated, ack.coordinator_id
    )


def fleet_status_of(message: learner_pb2.FleetStatus) -> FleetStatus:
    """The GetStatus answer as a FleetStatus.

    Raises:
        WireFormatError: If the env spec cannot be decoded.
    """
    try:
        env = env_config_of(decode_env_update(message.env)) if message.env.env_id else None
    except ConfigError:
        env = None
    spec = decode_env_spec(message.env_spec) if message.HasField("env_spec") else None
    return FleetStatus(
        coordinator_id=message.coordinator_id,
        implementation=message.implementation,
        workers=tuple(_worker_status(w) for w in message.workers),
        steps_per_second=message.steps_per_second,
        steps_total=message.steps_total,
        agent_version=message.agent_version,
        env=env,
        env_generation=message.env.generation,
        env_spec=spec,
        draining=message.draining,
        requests_in_flight=message.requests_in_flight,
        subscribers=message.subscribers,
        leases=message.leases,
        leased_envs=message.leased_envs,
    )


def _worker_status(message: learner_pb2.WorkerStatus) -> WorkerStatus:
    error = None
    if message.HasField("last_error") and message.last_error.message:
        error = message.last_error.message
    return WorkerStatus(
        worker_id=message.worker_id,
        name=message.name,
        host=message.host,
        pid=message.pid,
        envs=message.num_envs,
        state=message.state,
        steps_per_second=message.steps_per_second,
        steps_total=message.steps_total,
        agent_version=message.agent_version,
        env_generation=message.env_generation,
        seconds_since_heartbeat=message.seconds_since_heartbeat,
        units_in_flight=message.units_in_flight,
        implementation=message.implementation,
        peer=message.peer,
        last_error=error,
    )


__all__ = [
    "AgentUpdateLike",
    "EnvUpdateLike",
    "LearnerStubs",
    "ResponsePart",
    "agent_change_of",
    "env_change_of",
    "fleet_status_of",
    "parse_response",
    "parse_result_frame",
    "subscribe",
]
