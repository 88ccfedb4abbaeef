"""The learner face, coordinator side: LearnerService messages in and out of rlfleet types.

The one module of the coordinator's learner face that holds generated
messages (tests/test_layering.py; the Lease call is the lease face's,
``lease_translation``). Requests are read into :mod:`rlfleet.protocol.learner_calls`'
types by the calls' deserializers (``parse_*``); answers are written by
their serializers (``serialize_*``) and a call's events by :func:`responses`.
A worker's result goes to the learner as the chunks it came in: the first
message carries its metadata, every message the worker's id (the client
joins chunks per worker). Those messages are written as bytes around the
worker's own: its metadata as received, the id, the chunk (no protobuf
object per message).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import TypeAlias

from rlfleet.coordinator.calls import Event, Finished, Forward
from rlfleet.coordinator.failures import CallError, invalid
from rlfleet.coordinator.status import FleetSnapshot, WorkerSnapshot
from rlfleet.errors import WireFormatError
from rlfleet.protocol.learner_calls import (
    CallHeader,
    SampleAsk,
    StatusAsk,
    SubscribeAsk,
    UpdateReceipt,
)
from rlfleet.protocol.modes import Footer
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2, worker_pb2
from rlfleet.v1.updates_pb2 import AgentUpdate as AgentUpdateMessage
from rlfleet.v1.updates_pb2 import EnvUpdate as EnvUpdateMessage
from rlfleet.wire import (
    decode_agent_update,
    decode_env_update,
    encode_env_change,
    encode_error_report,
)
from rlfleet.wire._protowire import VARINT, encode_varint, len_prefix, tag

#: What a Sample or Subscribe call sends, serialized by ``_rpc.serialize``
#: (``bytes``: a message serialized already).
WireResponse: TypeAlias = learner_pb2.SampleResponse | _rpc.WithChunk | bytes

_RESULT_FIELD = learner_pb2.SampleResponse.RESULT_FIELD_NUMBER
_WORKER_ID_TAG = tag(worker_pb2.EpisodeResult.WORKER_ID_FIELD_NUMBER, VARINT)
_CHUNK_FIELD = worker_pb2.EpisodeResult.CHUNK_FIELD_NUMBER
_RESULT_CALL = learner_pb2.SampleResponse.RESULT_CALL_FIELD_NUMBER
_RESULT_CALL_TAG = tag(_RESULT_CALL, VARINT)
_RESULTS_END_FIELD = learner_pb2.SampleResponse.RESULTS_END_FIELD_NUMBER
_RESULTS_END_RESULTS = learner_pb2.ResultsEnd.RESULTS_FIELD_NUMBER
_HEADER_FIELD = learner_pb2.SampleResponse.HEADER_FIELD_NUMBER
_HEADER_REQUEST_ID = learner_pb2.SampleHeader.REQUEST_ID_FIELD_NUMBER
_HEADER_ENV_SPEC = learner_pb2.SampleHeader.ENV_SPEC_FIELD_NUMBER
_HEADER_AGENT_VERSION = learner_pb2.SampleHeader.AGENT_VERSION_FIELD_NUMBER
_HEADER_ENV_GENERATION = learner_pb2.SampleHeader.ENV_GENERATION_FIELD_NUMBER
_HEADER_COORDINATOR_ID = learner_pb2.SampleHeader.COORDINATOR_ID_FIELD_NUMBER
_RESULTS_ON_DATA = tag(learner_pb2.SampleHeader.RESULTS_ON_DATA_FIELD_NUMBER, VARINT) + b"\x01"
_FOOTER_ON_DATA = tag(learner_pb2.SampleHeader.FOOTER_ON_DATA_FIELD_NUMBER, VARINT) + b"\x01"
_FOOTER_FIELD = learner_pb2.SampleResponse.FOOTER_FIELD_NUMBER
_FOOTER_NUM_EPISODES = learner_pb2.SampleFooter.NUM_EPISODES_FIELD_NUMBER
_FOOTER_TOTAL_STEPS = learner_pb2.SampleFooter.TOTAL_STEPS_FIELD_NUMBER
_FOOTER_WORKERS_USED = learner_pb2.SampleFooter.WORKERS_USED_FIELD_NUMBER
_FOOTER_REASSIGNED_UNITS = learner_pb2.SampleFooter.REASSIGNED_UNITS_FIELD_NUMBER
_FOOTER_DATA_RESULTS = learner_pb2.SampleFooter.DATA_RESULTS_FIELD_NUMBER


# --- requests (the calls' deserializers) ---------------------------------------------


def parse_sample_request(data: bytes) -> SampleAsk | CallError:
    """Reads a SampleRequest; a malformed update in it is an INVALID_ARGUMENT failure.

    Raises:
        DecodeError: If the bytes do not parse.
    """
    return _sample_ask(learner_pb2.SampleRequest.FromString(data))


def parse_connection_request(data: bytes) -> tuple[int, SampleAsk | CallError]:
    """Reads a SampleRequest sent on a results connection: its ``result_call`` and
    the request (a malformed update in it: an INVALID_ARGUMENT failure, as on gRPC).

    Raises:
        DecodeError: If the bytes do not parse.
    """
    request = learner_pb2.SampleRequest.FromString(data)
    return request.result_call, _sample_ask(request)


def _sample_ask(request: learner_pb2.SampleRequest) -> SampleAsk | CallError:
    agent: AgentChange | CallError | None = None
    if request.HasField("agent_update"):
        agent = _agent_change(request.agent_update)
    if isinstance(agent, CallError):
        return agent
    return SampleAsk(
        mode=request.mode,
        amount=request.amount,
        fragment_length=request.fragment_length,
        seed=request.seed if request.HasField("seed") else None,
        request_index=request.request_index,
        agent_update=agent,
        env_update=(
            decode_env_update(request.env_update) if request.HasField("env_update") else None
        ),
        wait_for_workers_seconds=request.wait_for_workers_seconds,
        itr=request.itr,
        coordinator_id=request.coordinator_id,
        first_episode=request.first_episode,
        result_channel=request.result_channel,
        result_call=request.result_call,
        footer_on_data=request.footer_on_data,
    )


def parse_subscribe_request(data: bytes) -> SubscribeAsk:
    """Reads a SubscribeRequest.

    Raises:
        DecodeError: If the bytes do not parse.
    """
    request = learner_pb2.SubscribeRequest.FromString(data)
    return SubscribeAsk(
        mode=request.mode,
        fragment_length=request.fragment_length,
        seed=request.seed if request.HasField("seed") else None,
        max_buffered_steps=request.max_buffered_steps,
    )


def parse_agent_update(data: bytes) -> tuple[AgentChange, str] | CallError:
    """Reads an UpdateAgent request: the change and the coordinator id it names.

    Raises:
        DecodeError: If the bytes do not parse.
    """
    update = AgentUpdateMessage.FromString(data)
    change = _agent_change(update)
    return change if isinstance(change, CallError) else (change, update.coordinator_id)


def parse_env_update(data: bytes) -> tuple[EnvChange, str]:
    """Reads an UpdateEnv request: the change and the coordinator id it names.

    Raises:
        DecodeError: If the bytes do not parse.
    """
    update = EnvUpdateMessage.FromString(data)
    return decode_env_update(update), update.coordinator_id


def parse_status_request(data: bytes) -> StatusAsk:
    """Reads a StatusRequest (it has no fields).

    Raises:
        DecodeError: If the bytes do not parse.
    """
    learner_pb2.StatusRequest.FromString(data)
    return StatusAsk()


def _agent_change(update: AgentUpdateMessage) -> AgentChange | CallError:
    try:
        return decode_agent_update(update)
    except WireFormatError as exc:
        return invalid(str(exc))


# --- answers (the calls' serializers) ------------------------------------------------


def responses(
    event: Event, *, data_results: int | None = None, footer_on_data: bool = False
) -> Iterator[WireResponse]:
    """The messages of one event of a Sample or Subscribe call.

    Args:
        event: The event.
        data_results: When the call's results travel on the learner's
            results connection: how many were sent there so far (the header
            then says so, the footer names the count); None: on the stream.
        footer_on_data: With ``data_results``: the header says the footer
            goes on the results connection too.

    Raises:
        CallError: The event itself, when it is one (the call ends with it).
    """
    if isinstance(event, CallHeader):
        on_data = data_results is not None
        yield header_bytes(
            event, results_on_data=on_data, footer_on_data=on_data and footer_on_data
        )
    elif isinstance(event, Forward):
        yield from forwarded(event)
    elif isinstance(event, Finished):
        yield footer_bytes(event.footer, data_results or 0)
    else:
        raise event


def header_bytes(
    header: CallHeader, *, results_on_data: bool, footer_on_data: bool = False
) -> bytes:
    """The serialized ``SampleResponse(header=SampleHeader(...))`` of a call's header.

    Written field by field: the env spec goes as the bytes the worker
    reported (``env_spec_wire``), not parsed and written again per call.
    """
    spec = header.env_spec_wire
    body = b"".join(
        (
            _varint_field(_HEADER_REQUEST_ID, header.request_id),
            b"" if spec is None else len_prefix(_HEADER_ENV_SPEC, len(spec)) + spec,
            _varint_field(_HEADER_AGENT_VERSION, header.agent_version),
            _varint_field(_HEADER_ENV_GENERATION, header.env_generation),
            _coordinator_id_field(header.coordinator_id),
            _RESULTS_ON_DATA if results_on_data else b"",
            _FOOTER_ON_DATA if footer_on_data else b"",
        )
    )
    return len_prefix(_HEADER_FIELD, len(body)) + body


def footer_bytes(footer: Footer, data_results: int) -> bytes:
    """The serialized ``SampleResponse(footer=SampleFooter(...))`` of a call's footer.

    Args:
        footer: The request's totals.
        data_results: Results sent on the learner's results connection (0: none).
    """
    body = b"".join(
        (
            _varint_field(_FOOTER_NUM_EPISODES, footer.num_episodes),
            _varint_field(_FOOTER_TOTAL_STEPS, footer.total_steps),
            _varint_field(_FOOTER_WORKERS_USED, footer.workers_used),
            _varint_field(_FOOTER_REASSIGNED_UNITS, footer.reassigned_units),
            _varint_field(_FOOTER_DATA_RESULTS, data_results),
        )
    )
    return len_prefix(_FOOTER_FIELD, len(body)) + body


def _varint_field(number: int, value: int) -> bytes:
    """A varint field as protobuf writes it: nothing for 0 (proto3's default)."""
    return tag(number, VARINT) + encode_varint(value) if value else b""


@functools.lru_cache(maxsize=8)
def _coordinator_id_field(coordinator_id: str) -> bytes:
    """``SampleHeader.coordinator_id`` (a coordinator has one id: encoded once)."""
    data = coordinator_id.encode()
    return len_prefix(_HEADER_COORDINATOR_ID, len(data)) + data if data else b""


def forwarded(forward: Forward) -> Iterator[bytes]:
    """The serialized SampleResponses that pass a worker's result on, one per chunk.

    Each is the bytes protobuf writes for ``SampleResponse(result=EpisodeResult(...))``
    (:func:`forwarded_parts`), joined.
    """
    for parts in forwarded_parts(forward):
        yield b"".join(parts)


def forwarded_parts(forward: Forward, tail: bytes = b"") -> Iterator[list[bytes | memoryview]]:
    """The pieces of the SampleResponses that pass a worker's result on, one list per chunk.

    The first carries the worker's metadata whole (fields this version does
    not know too), every one the worker's id. Each list's pieces, joined,
    are the bytes protobuf writes for ``SampleResponse(result=EpisodeResult(
    <metadata>, worker_id=..., chunk=...))`` followed by ``tail`` (further
    fields of the SampleResponse, e.g. a results connection's
    ``result_call``): the metadata as the worker sent it (``header.wire``,
    serialized without its chunk), the id's field and the chunk. No protobuf
    object is parsed or built per message, and the chunk's data is a piece
    of its own, so that a socket can send it without a copy.
    """
    header = forward.header
    if header.worker_id:  # a worker that set the coordinator's field: protobuf replaces it
        meta = worker_pb2.EpisodeResult.FromString(header.wire)
        meta.worker_id = 0
        header = dataclasses.replace(header, worker_id=0, wire=meta.SerializeToString())
    worker = _WORKER_ID_TAG + encode_varint(forward.worker_id) if forward.worker_id else b""
    for position, chunk in enumerate(forward.chunks):
        fields = (header.wire if position == 0 else b"") + worker
        chunk_header = chunk.header()
        chunk_size = len(chunk_header) + len(chunk.data)
        fields += len_prefix(_CHUNK_FIELD, chunk_size)
        result_size = len(fields) + chunk_size
        yield [len_prefix(_RESULT_FIELD, result_size) + fields + chunk_header, chunk.data, tail]


def result_call_field(call: int) -> bytes:
    """The serialized ``SampleResponse.result_call`` field (a results connection's frames)."""
    return _RESULT_CALL_TAG + encode_varint(call)


def results_end(call: int, results: int) -> bytes:
    """The serialized results-end marker of a call's results on a results connection:
    ``SampleResponse(results_end=ResultsEnd(results=...), result_call=call)``."""
    body = _varint_field(_RESULTS_END_RESULTS, results)
    return len_prefix(_RESULTS_END_FIELD, len(body)) + body + _varint_field(_RESULT_CALL, call)


def failure_bytes(error: CallError, call: int) -> bytes:
    """The serialized ``SampleResponse(failure=CallFailure(...), result_call=call)`` that
    ends a failed request sent on a results connection: what its Sample call's
    status and trailing metadata would have said (``rlfleet.transport.rpc.abort``)."""
    message = learner_pb2.SampleResponse(result_call=call)
    failure = message.failure
    failure.code = error.code.value[0]
    failure.message = error.message
    detail = _rpc.detail_message(error.detail)
    if detail is not None:
        failure.detail.MergeFromString(detail.SerializeToString())
    return message.SerializeToString()


def serialize_result_channel(opened: tuple[int, int, bytes, int] | None) -> bytes:
    """The serialized ResultChannelOpened of ``(channel id, port, ticket, longest
    request frame)``, or of None (no data channel: results stay on the stream)."""
    message = learner_pb2.ResultChannelOpened()
    if opened is not None:
        (
            message.channel_id,
            message.data.port,
            message.data.ticket,
            message.max_request_bytes,
        ) = opened
        # This coordinator serves requests sent on the connection (result_requests.py).
        message.requests_on_data = True
    return message.SerializeToString()


def parse_result_channel_request(data: bytes) -> learner_pb2.ResultChannelRequest:
    """Reads a ResultChannelRequest (it has no fields; gRPC takes None for a failure).

    Raises:
        DecodeError: If the bytes do not parse.
    """
    return learner_pb2.ResultChannelRequest.FromString(data)


def serialize_update_receipt(receipt: UpdateReceipt) -> bytes:
    """The serialized UpdateAck of an update's answer."""
    ack = learner_pb2.UpdateAck(
        agent_version=receipt.agent_version,
        env_generation=receipt.env_generation,
        workers_updated=receipt.workers_updated,
        coordinator_id=receipt.coordinator_id,
    )
    return ack.SerializeToString()


def serialize_fleet_status(status: FleetSnapshot) -> bytes:
    """The serialized FleetStatus of a snapshot."""
    message = learner_pb2.FleetStatus(
        coordinator_id=status.coordinator_id,
        protocol_version=status.protocol_version,
        implementation=status.implementation,
        workers=[_worker_status(worker) for worker in status.workers],
        agent_version=status.agent_version,
        env=encode_env_change(status.env),
        steps_per_second=status.steps_per_second,
        steps_total=status.steps_total,
        requests_in_flight=status.requests_in_flight,
        subscribers=status.subscribers,
        draining=status.draining,
        leases=status.leases,
        leased_envs=status.leased_envs,
    )
    if status.env_spec_wire is not None:
        message.env_spec.MergeFromString(status.env_spec_wire)
    return message.SerializeToString()


def _worker_status(worker: WorkerSnapshot) -> learner_pb2.WorkerStatus:
    message = learner_pb2.WorkerStatus(
        worker_id=worker.worker_id,
        name=worker.name,
        host=worker.host,
        pid=worker.pid,
        peer=worker.peer,
        num_envs=worker.num_envs,
        implementation=worker.implementation,
        capabilities=worker.capabilities,
        state=worker.state,
        agent_version=worker.agent_version,
        env_generation=worker.env_generation,
        steps_total=worker.steps_total,
        steps_per_second=worker.steps_per_second,
        seconds_since_heartbeat=worker.seconds_since_heartbeat,
        units_in_flight=worker.units_in_flight,
        leased_envs=worker.leased_envs,
    )
    if worker.last_error is not None:
        message.last_error.CopyFrom(encode_error_report(worker.last_error))
    return message
