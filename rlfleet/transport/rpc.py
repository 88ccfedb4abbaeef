"""The gRPC boundary shared by the coordinator, the worker and the client.

Only ``rlfleet.coordinator``, ``rlfleet.worker.remote``, ``rlfleet.client``
and ``rlfleet.security`` import this module (and gRPC). It holds what both
ends of a call must agree on: method paths, (de)serializers that keep batch
payloads out of protobuf objects, channel and server options (keepalive on
purpose: gRPC alone never notices a frozen peer), and the mapping between
gRPC status codes and rlfleet's exceptions. No generated stub is used or exposed anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import grpc
import grpc.experimental
from google.protobuf.message import Message
from grpc import _common

from rlfleet import errors
from rlfleet.errors import WrongTypeError
from rlfleet.protocol.error_reports import ErrorReport, error_of_report, report_of_exception
from rlfleet.v1 import learner_pb2, updates_pb2, worker_pb2
from rlfleet.wire import (
    Chunk,
    decode_error_detail,
    encode_error_report,
    parse_with_chunk,
    serialize_with_chunk,
)

if TYPE_CHECKING:  # rlfleet.security imports this module
    from rlfleet.security import ClientSecurity

#: Protocol version spoken by this implementation (worker.proto ProtocolVersion).
PROTOCOL_VERSION = 1

WORKER_SERVICE = "rlfleet.v1.WorkerService"
LEARNER_SERVICE = "rlfleet.v1.LearnerService"
JOIN = f"/{WORKER_SERVICE}/Join"
SAMPLE = f"/{LEARNER_SERVICE}/Sample"
SUBSCRIBE = f"/{LEARNER_SERVICE}/Subscribe"
UPDATE_AGENT = f"/{LEARNER_SERVICE}/UpdateAgent"
UPDATE_ENV = f"/{LEARNER_SERVICE}/UpdateEnv"
GET_STATUS = f"/{LEARNER_SERVICE}/GetStatus"
LEASE = f"/{LEARNER_SERVICE}/Lease"
OPEN_RESULT_CHANNEL = f"/{LEARNER_SERVICE}/OpenResultChannel"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
#: Calls a client channel retries when the answer is UNAVAILABLE (a
#: coordinator restarting or not reachable yet): those that only read, so
#: that running one twice changes nothing. Not Sample (without a seed each
#: request takes the next request index; RemoteSampler retries it itself,
#: after restoring a restarted coordinator), not UpdateAgent/UpdateEnv (each
#: creates a new version or generation), not the streams (Subscribe, Lease,
#: Join hold state on the coordinator; their owners reconnect).
RETRIED_METHODS = (GET_STATUS, HEALTH_CHECK)
#: Attempts of a retried call in all, within the call's own timeout.
RETRY_ATTEMPTS = 4
#: Capability of workers that host step-level env leases (worker.proto Hello).
LEASE_CAPABILITY = "rlfleet.leases"
#: Capability of workers that run the fragment streams a Task names and
#: rebuild them from Task.replays (docs/reliability.md, "Fragments under faults").
TAKEOVER_CAPABILITY = "rlfleet.stream-takeover"
#: Capability of workers that read a Task's episode units as columns
#: (worker.proto EpisodeUnitColumns); the others get EpisodeUnit messages.
UNIT_COLUMNS_CAPABILITY = "rlfleet.unit-columns"
#: Capability of workers that send their results on the lease data channel
#: once their session's connection is open (leases.proto, "Results on the
#: lease data channel"); agreed in Hello and Welcome like every capability.
DATA_RESULTS_CAPABILITY = "rlfleet.data-results"
#: Capability of workers whose results move to the lease data channel at a
#: result boundary once its connection opens, after the results switch
#: marker on the Join stream (WorkerMessage.results_switch); without it on
#: both sides, a session keeps the carrier of its first result.
RESULTS_SWITCH_CAPABILITY = "rlfleet.results-switch"
#: Capability of workers that take their Tasks and Cancels on the lease data
#: channel once its connection is accepted: every Task or Cancel sent after
#: the switch marker on the Join stream (LeaseCommand.data_switch) comes
#: there; agent and env updates stay on the stream, so the worker holds a
#: Task until it runs the Task's agent version and env generation.
DATA_TASKS_CAPABILITY = "rlfleet.data-tasks"
#: Capability of workers that send their heartbeats on the lease data
#: channel while its connection is open, and on the Join stream otherwise:
#: on the coordinator a heartbeat there is one read of its data loop, not a
#: round of gRPC's threads (docs/protocol.md, "The lease data channel").
DATA_HEARTBEATS_CAPABILITY = "rlfleet.data-heartbeats"

#: Default largest message either side sends or accepts. Batches are chunked
#: well below it (rlfleet.wire.DEFAULT_CHUNK_BYTES); only agent updates with
#: very large parameter sets come near it.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: The coordinator's flow-control window per stream for what it receives
#: (:func:`server_options`): fixed, as Go's and Java's static windows, large
#: enough that an agent pushed by a learner or a result on a Join stream
#: is not held to a 64 KiB window a round trip at a time on a remote link.
SERVER_STREAM_WINDOW_BYTES = 4 * 1024 * 1024

#: Trailing-metadata key carrying a serialized rlfleet.v1.ErrorDetail.
ERROR_DETAIL_KEY = "rlfleet-error-bin"

#: Paths of the BatchChunk field inside the messages that carry one.
WORKER_CHUNK_PATH = ("result", "chunk")
RESPONSE_CHUNK_PATH = ("result", "chunk")

M = TypeVar("M", bound=Message)


@dataclasses.dataclass(frozen=True)
class WithChunk:
    """A message plus the batch chunk it carries, kept out of protobuf.

    Attributes:
        message: The envelope (WorkerMessage or SampleResponse) with its
            chunk field unset.
        chunk: The chunk (payload bytes as a memoryview), or None.
    """

    message: Any
    chunk: Chunk | None = None


def serialize(obj: Message | WithChunk | bytes) -> bytes:
    """Serializes a plain message, or a WithChunk without copying through protobuf.

    ``bytes`` are a message serialized already (e.g. by
    :func:`rlfleet.wire.serialize_batch_messages`) and are sent as they are.
    """
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, WithChunk):
        if obj.chunk is None:
            return bytes(obj.message.SerializeToString())
        return serialize_with_chunk(obj.message, _chunk_path(obj.message), obj.chunk)
    return bytes(obj.SerializeToString())


def _chunk_path(message: Message) -> tuple[str, ...]:
    if isinstance(message, worker_pb2.WorkerMessage):
        return WORKER_CHUNK_PATH
    if isinstance(message, learner_pb2.SampleResponse):
        return RESPONSE_CHUNK_PATH
    raise WrongTypeError(f"{type(message).__name__} carries no batch chunk")


def chunked_deserializer(cls: type[Message]) -> Callable[[bytes], WithChunk]:
    """Returns a deserializer that yields WithChunk(message, chunk or None).

    Malformed bytes raise WireFormatError, which gRPC turns into an
    INTERNAL status for that call only.
    """
    path = WORKER_CHUNK_PATH if cls is worker_pb2.WorkerMessage else RESPONSE_CHUNK_PATH

    def deserialize(data: bytes) -> WithChunk:
        message, chunk = parse_with_chunk(cls, data, path)
        return WithChunk(message, chunk)

    return deserialize


def plain_deserializer(cls: type[M]) -> Callable[[bytes], M]:
    """Returns ``cls.FromString`` typed for callers."""

    def deserialize(data: bytes) -> M:
        return cls.FromString(data)

    return deserialize


def keepalive_options(
    *, keepalive_seconds: float, ping_timeout_seconds: float
) -> list[tuple[str, int]]:
    """Options that make either end notice a frozen or vanished peer.

    Measured on this project's machines: without keepalive a stream to a
    SIGSTOPped peer hangs forever; with keepalive 1 s and the default ping
    timeout it took 60 s; with a 2 s ping timeout, 2.3 s.
    """
    return [
        ("grpc.keepalive_time_ms", int(keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(ping_timeout_seconds * 1000)),
        ("grpc.http2.ping_timeout_ms", int(ping_timeout_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def channel_options(
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    keepalive_seconds: float = 10.0,
    ping_timeout_seconds: float = 5.0,
    receive_message_bytes: int | None = None,
) -> list[tuple[str, int]]:
    """Options for client channels (workers and learners).

    Client keepalive must not ping faster than the server permits
    (:func:`server_options`), or the server answers GOAWAY too_many_pings.
    ``receive_message_bytes`` (default ``max_message_bytes``) is the
    largest message accepted, when it differs from the largest sent.
    """
    received = max_message_bytes if receive_message_bytes is None else receive_message_bytes
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", received),
        *keepalive_options(
            keepalive_seconds=keepalive_seconds, ping_timeout_seconds=ping_timeout_seconds
        ),
    ]


def retry_service_config() -> str:
    """gRPC's service config (``grpc.service_config``) with the retry policy of
    :data:`RETRIED_METHODS`: UNAVAILABLE only, exponential backoff from
    0.1 s to 1 s. Retries happen within the call's timeout, never past it."""
    names = []
    for method in RETRIED_METHODS:
        service, _, name = method.strip("/").partition("/")
        names.append({"service": service, "method": name})
    policy = {
        "maxAttempts": RETRY_ATTEMPTS,
        "initialBackoff": "0.1s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({"methodConfig": [{"name": names, "retryPolicy": policy}]})


def enable_reflection(server: grpc.Server, *services: str) -> None:
    """Serves gRPC server reflection, so that ``grpcurl`` and ``grpc_cli``
    list and call ``services`` without the .proto files.

    Args:
        server: The server, before it starts.
        services: Full names of the services it serves (reflection names
            itself). Their descriptors are in protobuf's default pool: the
            generated modules this module imports put them there.
    """
    from grpc_reflection.v1alpha import reflection  # only servers need it

    reflection.enable_server_reflection((*services, reflection.SERVICE_NAME), server)


#: gRPC's channel option for unary-stream calls read on the calling thread.
_CALLING_THREAD_STREAMS = grpc.experimental.ChannelOptions.SingleThreadedUnaryStream


def open_channel(
    address: str,
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    reconnect_max_seconds: float = 5.0,
    connect_timeout_seconds: float = 20.0,
    receive_window_bytes: int | None = None,
    keepalive_seconds: float = 10.0,
    ping_timeout_seconds: float = 5.0,
    security: ClientSecurity | None = None,
    receive_message_bytes: int | None = None,
    calling_thread_streams: bool = False,
) -> grpc.Channel:
    """Opens a client channel (workers and learners): the one place channels are made.

    Its calls of :data:`RETRIED_METHODS` are retried on UNAVAILABLE
    (:func:`retry_service_config`).

    Args:
        address: ``HOST:PORT`` of the coordinator.
        max_message_bytes: Largest message sent or accepted.
        reconnect_max_seconds: Cap of the channel's own reconnect backoff.
            gRPC's default cap is 120 s: after a coordinator restart, calls
            would fail fast for up to two minutes although it is back.
        connect_timeout_seconds: How long one connection attempt (TCP, TLS
            and the server's first HTTP/2 SETTINGS) may take. gRPC takes it
            from the option named ``grpc.min_reconnect_backoff_ms``; at
            100 ms, loopback connections to a busy coordinator failed with
            "connection attempt timed out" although it was up.
        receive_window_bytes: If set, a fixed per-stream receive window
            (BDP probing off). By default gRPC grows the window to several
            MiB, which a reader that stops reading lets fill: measured, a
            stalled subscription absorbed ~90k CartPole steps before
            backpressure reached the workers, ~2.5k with a 64 KiB window.
        keepalive_seconds: Keepalive ping interval (see :func:`channel_options`).
        ping_timeout_seconds: How long a ping may go unanswered.
        security: TLS and the bearer token (rlfleet.security); None: plaintext,
            no token.
        receive_message_bytes: Largest message accepted, if not
            ``max_message_bytes``.
        calling_thread_streams: Its unary-stream calls are read on the thread
            that iterates them (gRPC's ``SingleThreadedUnaryStream``), not
            through a thread of gRPC's that starts with each call on an
            otherwise idle channel and hands each message over: for a caller
            that reads a call on one thread at a time and needs no
            ``result()`` or ``exception()`` before the call is complete.
    """
    options: list[tuple[str, int | str]] = [
        *channel_options(
            max_message_bytes=max_message_bytes,
            keepalive_seconds=keepalive_seconds,
            ping_timeout_seconds=ping_timeout_seconds,
            receive_message_bytes=receive_message_bytes,
        ),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", retry_service_config()),
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", int(connect_timeout_seconds * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(reconnect_max_seconds * 1000)),
    ]
    if calling_thread_streams:
        options.append((_CALLING_THREAD_STREAMS, 1))
    if receive_window_bytes is not None:
        options += [
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", receive_window_bytes),
        ]
    if security is None:
        return grpc.insecure_channel(address, options=options)
    return security.open_channel(address, options)


def server_options(
    *,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    keepalive_seconds: float = 10.0,
    ping_timeout_seconds: float = 5.0,
    min_client_ping_seconds: float = 1.0,
) -> list[tuple[str, int]]:
    """Options for the coordinator's server.

    The server pings its clients too, so a frozen worker (SIGSTOP, a
    partitioned host) is noticed even while it owes no heartbeat yet.

    Its receive window is fixed at :data:`SERVER_STREAM_WINDOW_BYTES`
    instead of sized by BDP probes: a probe is a PING the server sends with
    its window update after a message arrives, whose acknowledgement wakes
    gRPC's threads again, so each worker's heartbeat cost the coordinator
    two rounds of wake-ups instead of one (docs/performance.md, "gRPC's
    threads per second").
    """
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", SERVER_STREAM_WINDOW_BYTES),
        ("grpc.http2.min_ping_interval_without_data_ms", int(min_client_ping_seconds * 1000)),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.so_reuseport", 0),
        *keepalive_options(
            keepalive_seconds=keepalive_seconds, ping_timeout_seconds=ping_timeout_seconds
        ),
    ]


# --- errors across the boundary -------------------------------------------

_CODE_TO_ERROR: dict[grpc.StatusCode, type[errors.RlfleetError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgumentError,
    grpc.StatusCode.FAILED_PRECONDITION: errors.WorkerError,
    grpc.StatusCode.UNAVAILABLE: errors.UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.RlfleetTimeoutError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhaustedError,
    grpc.StatusCode.UNAUTHENTICATED: errors.AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDeniedError,
    grpc.StatusCode.UNIMPLEMENTED: errors.ProtocolError,
    grpc.StatusCode.CANCELLED: errors.UnavailableError,
}


#: gRPC status codes by number (a CallFailure carries the number).
_CODES = {code.value[0]: code for code in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status code numbered ``number`` (UNKNOWN for one gRPC does not know)."""
    return _CODES.get(number, grpc.StatusCode.UNKNOWN)


def detail_from_exception(
    exc: BaseException,
    *,
    worker: str = "",
    task_id: int = 0,
    traceback_text: str = "",
    env_generation: int | None = None,
    agent_version: int | None = None,
) -> updates_pb2.ErrorDetail:
    """Describes an exception as an ErrorDetail message (see :func:`report_of_exception`)."""
    return encode_error_report(
        report_of_exception(
            exc,
            worker=worker,
            task_id=task_id,
            traceback_text=traceback_text,
            env_generation=env_generation,
            agent_version=agent_version,
        )
    )


def error_from_detail(
    detail: updates_pb2.ErrorDetail, default: type[errors.RlfleetError] = errors.WorkerError
) -> errors.RlfleetError:
    """The typed exception a learner sees for an ErrorDetail (see :func:`error_of_report`)."""
    return error_of_report(decode_error_detail(detail), default)


def error_from_rpc(
    exc: grpc.RpcError, *, what: str, timeout: float | None = None
) -> errors.RlfleetError:
    """Maps a failed call to rlfleet's typed exception.

    Args:
        exc: The gRPC error (a grpc.Call as well).
        what: What was being done, for the message (e.g. "Sample from 127.0.0.1:50051").
        timeout: The call's timeout, named in the message when it fired.
    """
    code: grpc.StatusCode = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details: str = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    trailing: Sequence[Any] = ()
    if hasattr(exc, "trailing_metadata"):
        trailing = exc.trailing_metadata() or ()
    detail = None
    for key, value in trailing:
        if key == ERROR_DETAIL_KEY:
            # A garbled detail must not hide the status.
            with contextlib.suppress(Exception):
                detail = decode_error_detail(updates_pb2.ErrorDetail.FromString(value))
            break
    return error_from_status(code, details, detail, what=what, timeout=timeout)


def error_from_status(
    code: grpc.StatusCode,
    details: str,
    detail: ErrorReport | None,
    *,
    what: str,
    timeout: float | None = None,
) -> errors.RlfleetError:
    """Maps a failed call's status to rlfleet's typed exception: a gRPC call's
    (:func:`error_from_rpc`), or what a request on a learner's results
    connection ended with (learner.proto ``CallFailure``).

    Args:
        code: The status code.
        details: The status message.
        detail: The structured error sent with it (decoded), if any.
        what: What was being done, for the message.
        timeout: The call's timeout, named in the message when it fired.
    """
    if detail is not None:
        return error_of_report(detail, _CODE_TO_ERROR.get(code, errors.WorkerError))
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and timeout is not None:
        return errors.RlfleetTimeoutError(f"{what}: no answer within {timeout:g} seconds")
    cls = _CODE_TO_ERROR.get(code, errors.RlfleetError)
    if cls is errors.WorkerError:
        return errors.WorkerError(f"{what}: {details}")
    return cls(f"{what}: {details} ({code.name})")


def abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    detail: ErrorReport | Message | None = None,
) -> NoReturn:
    """Ends a call with a status and, optionally, a structured ErrorDetail.

    Args:
        context: The call.
        code: Its status.
        message: The status message.
        detail: What went wrong, sent in the trailing metadata: a report, or
            an ErrorDetail message passed on as a worker sent it (the lease
            relay's).
    """
    encoded = detail_message(detail)
    if encoded is not None:
        context.set_trailing_metadata(((ERROR_DETAIL_KEY, encoded.SerializeToString()),))
    context.abort(code, message)


def detail_message(detail: ErrorReport | Message | None) -> Message | None:
    """The ErrorDetail a failed call carries of ``detail``: a report encoded, or
    an ErrorDetail message as it is (the lease relay passes a worker's on).
    What :func:`abort` puts in the trailing metadata, and a failed request on
    a learner's results connection in its ``CallFailure``."""
    return encode_error_report(detail) if isinstance(detail, ErrorReport) else detail


# grpcio's blocking waits without their 0.1 s polls off the main thread.
#
# grpcio's synchronous API waits for a call's events on a condition variable,
# never longer than 0.1 s at a time (``grpc._common.wait``): so that a main
# thread blocked in a call runs its signal handlers soon
# (https://github.com/grpc/grpc/issues/19464). Only the main thread runs
# signal handlers, so another thread's polls wake it for nothing. Each
# wake-up takes the GIL: in a worker, whose stepping thread holds it almost
# all the time and lets go of it for a moment several times a vector step
# (numpy's generators draw without it), a waiting thread is woken at each of
# those moments and mostly loses the race for it, so one wake-up costs
# dozens of context switches, some of them preempting a stepping thread. A
# worker's Join stream receiver waits for the coordinator's few messages a
# second, so those polls were most of its wake-ups
# (``tests/test_grpc_waits.py::test_a_join_streams_receiver_sleeps_while_no_message_comes``).
#
# :func:`install_long_waits` replaces ``grpc._common.wait``, which grpcio's channel looks
# up at every call, with one that waits as grpcio's does on the main thread,
# for a bounded wait, and when grpcio passes a spin callback (its fork
# support, run between polls); elsewhere it waits
# :data:`LONG_WAIT_SECONDS` at a time. grpcio notifies the condition on
# every event of a call and on its cancel, so that bound is only a backstop.
# A grpcio whose wait takes other parameters keeps its own.

#: The longest single wait of a thread other than the main one.
LONG_WAIT_SECONDS = 5.0

#: The parameters of the grpcio wait :func:`_long_wait` stands in for.
GRPC_WAIT_PARAMETERS = ("wait_fn", "wait_complete_fn", "timeout", "spin_cb")

_grpc_wait = _common.wait


def _long_wait(
    wait_fn: Callable[..., bool],
    wait_complete_fn: Callable[[], bool],
    timeout: float | None = None,
    spin_cb: Callable[[], None] | None = None,
) -> bool:
    """``grpc._common.wait``: the same, without short polls off the main thread."""
    if (
        timeout is not None
        or spin_cb is not None
        or threading.current_thread() is threading.main_thread()
    ):
        return _grpc_wait(wait_fn, wait_complete_fn, timeout, spin_cb)
    while not wait_complete_fn():
        wait_fn(timeout=LONG_WAIT_SECONDS)
    return False


def install_long_waits() -> None:
    """Makes grpcio's unbounded waits off the main thread wait
    :data:`LONG_WAIT_SECONDS` at a time, in this process (idempotent).

    Leaves a grpcio wait whose parameters are not :data:`GRPC_WAIT_PARAMETERS` alone.
    """
    if _common.wait is _long_wait:
        return
    if tuple(inspect.signature(_common.wait).parameters) != GRPC_WAIT_PARAMETERS:
        return
    _common.wait = _long_wait
