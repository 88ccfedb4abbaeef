"""The learner face: LearnerService calls, from gRPC to the Coordinator and back.

Only plumbing lives here: the calls' (de)serializers turn messages into
rlfleet types and back (``learner_messages``), the Coordinator serves them,
and a CallError becomes the call's gRPC status. A Sample call that names
the learner's results connection sends its result messages there
(``result_channels``); its stream keeps the header, footer and errors (the
footer goes on the connection too when the learner asks for it). A request
the learner sends on that connection instead makes no gRPC call at all
(``result_requests``).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import TypeVar

import grpc

from rlfleet.coordinator import learner_messages
from rlfleet.coordinator.calls import CallScope, Event, Finished, Forward
from rlfleet.coordinator.coordinator import Coordinator
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.learner_messages import WireResponse, forwarded_parts
from rlfleet.coordinator.leases import translation as lease_translation
from rlfleet.coordinator.leases.face import LeaseFace
from rlfleet.coordinator.result_channels import ResultChannels, ResultSender
from rlfleet.coordinator.result_requests import RequestRunner
from rlfleet.coordinator.status import FleetSnapshot
from rlfleet.coordinator.worker_face import Malformed, tolerant
from rlfleet.protocol.learner_calls import SampleAsk, StatusAsk, SubscribeAsk, UpdateReceipt
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.transport import rpc as _rpc

#: The metrics' method label of Sample requests sent on a results connection
#: (result_requests.py): no gRPC call, so not "Sample".
SAMPLE_ON_DATA = "SampleOnData"

T = TypeVar("T")
Q = TypeVar("Q")
R = TypeVar("R")


class LearnerFace:
    """Serves ``rlfleet.v1.LearnerService``.

    Args:
        coordinator: The fleet state the calls act on.
    """

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator
        self._learners = coordinator.learners
        metrics = coordinator.metrics
        self._results = ResultChannels(
            coordinator.lease_data,
            RequestRunner(
                sample=self._learners.sample,
                cancel=self._learners.cancel,
                done=lambda outcome, started: metrics.request_done(
                    SAMPLE_ON_DATA, outcome, started
                ),
            ),
            # A connection's requests hold a thread as a Sample call does.
            max_open=coordinator.config.max_learner_calls,
        )

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a server."""

        messages = learner_messages
        out = _rpc.serialize
        timed = self._coordinator.metrics.timed
        methods = {
            "Sample": grpc.unary_stream_rpc_method_handler(
                timed("Sample", _parsed(self.sample)),
                request_deserializer=tolerant(messages.parse_sample_request),
                response_serializer=out,
            ),
            "Subscribe": grpc.unary_stream_rpc_method_handler(
                timed("Subscribe", _parsed(self.subscribe)),
                request_deserializer=tolerant(messages.parse_subscribe_request),
                response_serializer=out,
            ),
            "UpdateAgent": grpc.unary_unary_rpc_method_handler(
                timed("UpdateAgent", _parsed(self.update_agent)),
                request_deserializer=tolerant(messages.parse_agent_update),
                response_serializer=messages.serialize_update_receipt,
            ),
            "UpdateEnv": grpc.unary_unary_rpc_method_handler(
                timed("UpdateEnv", _parsed(self.update_env)),
                request_deserializer=tolerant(messages.parse_env_update),
                response_serializer=messages.serialize_update_receipt,
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
            "OpenResultChannel": grpc.unary_unary_rpc_method_handler(
                timed("OpenResultChannel", _parsed(self.open_result_channel)),
                request_deserializer=tolerant(messages.parse_result_channel_request),
                response_serializer=messages.serialize_result_channel,
            ),
            "GetStatus": grpc.unary_unary_rpc_method_handler(
                timed("GetStatus", _parsed(self.get_status)),
                request_deserializer=tolerant(messages.parse_status_request),
                response_serializer=messages.serialize_fleet_status,
            ),
        }
        return grpc.method_handlers_generic_handler(_rpc.LEARNER_SERVICE, methods)

    def sample(self, request: SampleAsk, context: grpc.ServicerContext) -> Iterator[WireResponse]:
        """Sample: header, results (on the learner's results connection, when it
        names one this coordinator can use), footer."""
        scope = self._scope(context)
        sender = None
        if request.result_channel:
            sender = self._results.take(
                request.result_channel, request.result_call, footer_on_data=request.footer_on_data
            )
        yield from self._stream(
            lambda: self._learners.sample(request, scope, sender), scope, context, sender
        )

    def open_result_channel(
        self, request: object, context: grpc.ServicerContext
    ) -> tuple[int, int, bytes, int] | None:
        """OpenResultChannel: a results connection's id, port and ticket, and the
        longest request frame read there (None: no data channel); RESOURCE_EXHAUSTED
        while as many connections are open as learner calls may run at once."""
        try:
            opened = self._results.open()
        except CallError as exc:
            _rpc.abort(context, exc.code, exc.message, exc.detail)
        if opened is None:
            return None
        # The data channel's frame bound: the gRPC server's message bound.
        return (*opened, self._coordinator.config.max_message_bytes)

    def subscribe(
        self, request: SubscribeAsk, context: grpc.ServicerContext
    ) -> Iterator[WireResponse]:
        """Subscribe: headers and results until the learner cancels."""
        scope = self._scope(context)
        yield from self._stream(lambda: self._learners.subscribe(request, scope), scope, context)

    def update_agent(
        self, request: tuple[AgentChange, str], context: grpc.ServicerContext
    ) -> UpdateReceipt:
        """UpdateAgent: answers once every worker applied it."""
        scope = self._scope(context)
        update, expected_id = request
        return _unary(
            lambda: self._learners.update_agent(update, expected_id, scope), scope, context
        )

    def update_env(
        self, request: tuple[EnvChange, str], context: grpc.ServicerContext
    ) -> UpdateReceipt:
        """UpdateEnv: answers once every worker built the env."""
        scope = self._scope(context)
        update, expected_id = request
        return _unary(lambda: self._learners.update_env(update, expected_id, scope), scope, context)

    def get_status(self, request: StatusAsk, context: grpc.ServicerContext) -> FleetSnapshot:
        """GetStatus."""
        return self._coordinator.status()

    def _scope(self, context: grpc.ServicerContext) -> CallScope:
        scope = CallScope()
        if not context.add_callback(lambda: self._learners.cancel(scope)):
            scope.cancelled = True  # the call is already over
        return scope

    def _stream(
        self,
        start: Callable[[], Generator[Event, None, None]],
        scope: CallScope,
        context: grpc.ServicerContext,
        sender: ResultSender | None = None,
    ) -> Iterator[WireResponse]:
        events = start()
        try:
            for event in events:
                if sender is None:
                    yield from learner_messages.responses(event)
                elif isinstance(event, Forward):
                    sender.send(forwarded_parts(event, sender.tail))
                elif isinstance(event, Finished) and sender.footer_on_data:
                    sender.end(event.footer)  # the footer in place of the end marker
                else:
                    if isinstance(event, Finished):  # the end marker before the footer
                        sender.end()
                    yield from learner_messages.responses(
                        event, data_results=sender.sent, footer_on_data=sender.footer_on_data
                    )
        except CallError as exc:
            if sender is not None:
                sender.end()  # before the status: the learner reads up to the marker first
            _rpc.abort(context, exc.code, exc.message, exc.detail)
        finally:
            if sender is not None:
                sender.end()
            # Close now, not at garbage collection: it holds the request's turn.
            events.close()
            scope.served = True


def _parsed(
    behavior: Callable[[Q, grpc.ServicerContext], R],
) -> Callable[[Q | Malformed | CallError, grpc.ServicerContext], R]:
    """Wraps a method so that a request that did not parse ends it with INVALID_ARGUMENT.

    gRPC itself would answer a raising deserializer with INTERNAL, which
    blames the coordinator for the caller's bytes. A request the
    deserializer refused (a malformed update in it) ends with its error.
    """

    def handle(request: Q | Malformed | CallError, context: grpc.ServicerContext) -> R:
        if isinstance(request, Malformed):
            _rpc.abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request: {request.error}"
            )
        if isinstance(request, CallError):
            _rpc.abort(context, request.code, request.message, request.detail)
        return behavior(request, context)

    return handle


def _unary(call: Callable[[], T], scope: CallScope, context: grpc.ServicerContext) -> T:
    try:
        return call()
    except CallError as exc:
        _rpc.abort(context, exc.code, exc.message, exc.detail)
    finally:
        scope.served = True
