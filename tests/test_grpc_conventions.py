"""gRPC conventions: server reflection on the coordinator, and the client
channel's retry policy (docs/operations.md, "gRPC tools and retries").

* The coordinator serves reflection: a reflection client lists its
  services and resolves their methods without the .proto files.
* With tokens, reflection takes either token and refuses a call with none.
* A client channel retries GetStatus when the coordinator answers
  UNAVAILABLE, and never retries a call that is not safe twice
  (UpdateAgent): a real gRPC server here fails the first calls.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from rlfleet.client._learner_messages import LearnerStubs
from rlfleet.coordinator import CoordinatorConfig, CoordinatorServer, serve
from rlfleet.protocol.learner_calls import UpdatePush
from rlfleet.protocol.updates import AgentChange
from rlfleet.security.auth import AuthInterceptor, Role, RoleTokens, may_call
from rlfleet.security.tokens import Token
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import learner_pb2

#: Bounds every call (a wait on a condition, never a sleep).
CALL_SECONDS = 30.0
REFLECTION_INFO = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@pytest.fixture
def coordinator() -> Iterator[CoordinatorServer]:
    server = serve(CoordinatorConfig(listen="127.0.0.1:0"))
    try:
        yield server
    finally:
        server.stop()


def test_the_coordinator_serves_reflection_of_its_services(
    coordinator: CoordinatorServer,
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{coordinator.port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=CALL_SECONDS)
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        learner = database.FindFileContainingSymbol(_rpc.LEARNER_SERVICE)
    assert {
        _rpc.WORKER_SERVICE,
        _rpc.LEARNER_SERVICE,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= services
    (service,) = [s for s in learner.service if s.name == "LearnerService"]
    assert {"Sample", "GetStatus", "UpdateAgent", "Lease"} <= {m.name for m in service.method}


def test_reflection_takes_either_token_and_refuses_none() -> None:
    worker, learner = Token("w" * 32), Token("l" * 32)
    interceptor = AuthInterceptor(RoleTokens(worker=worker, learner=learner))
    assert may_call(Role.WORKER, REFLECTION_INFO) and may_call(Role.LEARNER, REFLECTION_INFO)
    for token in (worker, learner):
        metadata = (("authorization", f"Bearer {token.reveal()}"),)
        assert interceptor.check(REFLECTION_INFO, metadata) is None
    refusal = interceptor.check(REFLECTION_INFO, ())
    assert refusal is not None and refusal.code is grpc.StatusCode.UNAUTHENTICATED


class _FlakyLearner(grpc.GenericRpcHandler):
    """A LearnerService whose calls answer UNAVAILABLE ``failures`` times first."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method
        if method == _rpc.GET_STATUS:
            return grpc.unary_unary_rpc_method_handler(
                self._answer(method, learner_pb2.FleetStatus(coordinator_id="flaky"))
            )
        if method == _rpc.UPDATE_AGENT:
            return grpc.unary_unary_rpc_method_handler(
                self._answer(method, learner_pb2.UpdateAck())
            )
        return None

    def _answer(
        self, method: str, answer: learner_pb2.FleetStatus | learner_pb2.UpdateAck
    ) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            del request
            with self._lock:
                self.calls[method] = self.calls.get(method, 0) + 1
                failing = self.calls[method] <= self.failures
            if failing:
                context.abort(grpc.StatusCode.UNAVAILABLE, "restarting, try again")
            return answer.SerializeToString()

        return handle


@pytest.fixture
def flaky() -> Iterator[tuple[_FlakyLearner, int]]:
    handler = _FlakyLearner(failures=_rpc.RETRY_ATTEMPTS - 1)
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield handler, port
    finally:
        server.stop(grace=None)


def test_a_client_channel_retries_status_calls_the_server_answers_unavailable(
    flaky: tuple[_FlakyLearner, int],
) -> None:
    handler, port = flaky
    with _rpc.open_channel(f"127.0.0.1:{port}") as channel:
        status = LearnerStubs(channel).status(timeout=CALL_SECONDS)
    assert status.coordinator_id == "flaky"
    assert handler.calls[_rpc.GET_STATUS] == _rpc.RETRY_ATTEMPTS


def test_a_client_channel_never_retries_an_update(flaky: tuple[_FlakyLearner, int]) -> None:
    handler, port = flaky
    with _rpc.open_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as failure:
        LearnerStubs(channel).update_agent(UpdatePush(AgentChange()), timeout=CALL_SECONDS)
    assert failure.value.code() is grpc.StatusCode.UNAVAILABLE
    assert handler.calls[_rpc.UPDATE_AGENT] == 1


def _slow_to_greet(target_port: int, delay: float, stop: threading.Event) -> int:
    """A TCP relay to ``target_port`` that holds the server's first bytes ``delay`` s.

    A busy server answers a new connection's HTTP/2 handshake late; this is
    that server, on demand.
    """
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)

    def pipe(src: socket.socket, dst: socket.socket, hold: float) -> None:
        held = False
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not held:
                    stop.wait(hold)
                    held = True
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            server = socket.create_connection(("127.0.0.1", target_port))
            threading.Thread(target=pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=pipe, args=(server, client, delay), daemon=True).start()
        listener.close()

    threading.Thread(target=accept, daemon=True).start()
    return int(listener.getsockname()[1])


def test_a_connection_whose_handshake_is_answered_late_still_connects(
    flaky: tuple[_FlakyLearner, int],
) -> None:
    # gRPC's connect timeout is its option grpc.min_reconnect_backoff_ms: at
    # 100 ms every attempt to a server this slow to greet timed out, again
    # and again, and the call failed although the server was up.
    handler, port = flaky
    handler.failures = 0
    stop = threading.Event()
    try:
        relay = _slow_to_greet(port, delay=0.5, stop=stop)
        with _rpc.open_channel(f"127.0.0.1:{relay}") as channel:
            status = LearnerStubs(channel).status(timeout=CALL_SECONDS)
    finally:
        stop.set()
    assert status.coordinator_id == "flaky"
