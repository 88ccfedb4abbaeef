"""The learner face: LearnerService calls, from gRPC to the Coordinator and back.

Only translation lives here: protobuf in, Coordinator call, protobuf (or
zero-copy chunk envelopes) out, and CallError to a gRPC status. Results
are forwarded as the worker's original chunks: the first message of a
result carries its metadata, every message carries the worker id (the
client reassembles per worker).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from rlfleet import _rpc
from rlfleet.coordinator import lease_translation
from rlfleet.coordinator.calls import CallScope, Event, Finished, Forward, Header
from rlfleet.coordinator.coordinator import Coordinator
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.lease_face import LeaseFace
from rlfleet.coordinator.worker_face import Malformed, tolerant
from rlfleet.v1 import learner_pb2, updates_pb2, worker_pb2

Response = learner_pb2.SampleResponse | _rpc.WithChunk
T = TypeVar("T")
M = TypeVar("M", bound=Message)
R = TypeVar("R")


class LearnerFace:
    """Serves ``rlfleet.v1.LearnerService``.

    Args:
        coordinator: The fleet state the calls act on.
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._learners = coordinator.learners

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a server."""

        def plain(cls: type[M]) -> Callable[[bytes], M | Malformed]:
            return tolerant(_rpc.plain_deserializer(cls))

        out = _rpc.serialize
        timed = self._coordinator.metrics.timed
        methods = {
            "Sample": grpc.unary_stream_rpc_method_handler(
                timed("Sample", _parsed(self.sample)),
                request_deserializer=plain(learner_pb2.SampleRequest),
                response_serializer=out,
            ),
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                timed("Subscribe", _parsed(self.subscribe)),
                request_deserializer=plain(learner_pb2.SubscribeRequest),
                response_serializer=out,
            ),
            "UpdateAgent": grpc.unary_unary_rpc_method_handler(
                timed("UpdateAgent", _parsed(self.update_agent)),
                request_deserializer=plain(updates_pb2.AgentUpdate),
                response_serializer=out,
            ),
            "UpdateEnv": grpc.unary_unary_rpc_method_handler(
                timed("UpdateEnv", _parsed(self.update_env)),
                request_deserializer=plain(updates_pb2.EnvUpdate),
                response_serializer=out,
            ),
            "Lease": grpc.stream_stream_rpc_method_handler(
                LeaseFace(
                    self._coordinator.leases,
                    self._coordinator.lease_data,
                    self._coordinator.metrics.lease_data_frame,
                ).lease,
                request_deserializer=tolerant(lease_translation.parse_request),
                response_serializer=None,  # the lease face yields serialized responses
            ),
            "GetStatus": grpc.unary_unary_rpc_method_handler(
                timed("GetStatus", _parsed(self.get_status)),
                request_deserializer=plain(learner_pb2.StatusRequest),
                response_serializer=out,
            ),
        }
        return grpc.method_handlers_generic_handler(_rpc.LEARNER_SERVICE, methods)

    def sample(
        self, request: learner_pb2.SampleRequest, context: grpc.ServicerContext
    ) -> Iterator[Response]:
        """Sample: header, results, footer."""
        scope = self._scope(context)
        yield from self._stream(lambda: self._learners.sample(request, scope), context)

    def subscribe(
        self, request: learner_pb2.SubscribeRequest, context: grpc.ServicerContext
    ) -> Iterator[Response]:
        """Subscribe: headers and results until the learner cancels."""
        scope = self._scope(context)
        yield from self._stream(lambda: self._learners.subscribe(request, scope), context)

    def update_agent(
        self, request: updates_pb2.AgentUpdate, context: grpc.ServicerContext
    ) -> learner_pb2.UpdateAck:
        """UpdateAgent: answers once every worker applied it."""
        scope = self._scope(context)
        return _unary(lambda: self._learners.update_agent(request, scope), context)

    def update_env(
        self, request: updates_pb2.EnvUpdate, context: grpc.ServicerContext
    ) -> learner_pb2.UpdateAck:
        """UpdateEnv: answers once every worker built the env."""
        scope = self._scope(context)
        return _unary(lambda: self._learners.update_env(request, scope), context)

    def get_status(
        self, request: learner_pb2.StatusRequest, context: grpc.ServicerContext
    ) -> learner_pb2.FleetStatus:
        """GetStatus."""
        return self._coordinator.status()

    def _scope(self, context: grpc.ServicerContext) -> CallScope:
        scope = CallScope()
        if not context.add_callback(lambda: self._learners.cancel(scope)):
            scope.cancelled = True  # the call is already over
        return scope

    def _stream(
        self, start: Callable[[], Generator[Event, None, None]], context: grpc.ServicerContext
    ) -> Iterator[Response]:
        events = start()
        try:
            for event in events:
                yield from _responses(event)
        except CallError as exc:
            _rpc.abort(context, exc.code, exc.message, exc.detail)
        finally:
            # Close now, not at garbage collection: it holds the request's turn.
            events.close()


def _parsed(
    behavior: Callable[[M, grpc.ServicerContext], R],
) -> Callable[[M | Malformed, grpc.ServicerContext], R]:
    """Wraps a method so that a request that did not parse ends it with INVALID_ARGUMENT.

    gRPC itself would answer a raising deserializer with INTERNAL, which
    blames the coordinator for the caller's bytes.
    """

    def handle(request: M | Malformed, context: grpc.ServicerContext) -> R:
        if isinstance(request, Malformed):
            _rpc.abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.error}"
            )
        return behavior(request, context)

    return handle


def _unary(call: Callable[[], T], context: grpc.ServicerContext) -> T:
    try:
        return call()
    except CallError as exc:
        _rpc.abort(context, exc.code, exc.message, exc.detail)


def _responses(event: Event) -> Iterator[Response]:
    """The messages of one event."""
    if isinstance(event, Header):
        yield learner_pb2.SampleResponse(header=event.header)
    elif isinstance(event, Forward):
        first, *rest = event.chunks
        yield _rpc.WithChunk(learner_pb2.SampleResponse(result=event.meta), first)
        worker_id = event.meta.worker_id
        for chunk in rest:
            envelope = learner_pb2.SampleResponse(
                result=worker_pb2.EpisodeResult(worker_id=worker_id)
            )
            yield _rpc.WithChunk(envelope, chunk)
    elif isinstance(event, Finished):
        yield learner_pb2.SampleResponse(footer=event.footer)
    else:
        raise event
