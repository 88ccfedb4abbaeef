"""Bearer tokens and roles over real gRPC: the server interceptor and both client paths."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from rlfleet.errors import AuthenticationError, PermissionDeniedError
from rlfleet.security import (
    AuthInterceptor,
    ClientTLS,
    Role,
    RoleTokens,
    ServerTLS,
    Token,
    may_call,
    secure_channel,
)
from rlfleet.security.auth import Refusal, bearer_token
from rlfleet.transport import rpc as _rpc
from tests.tls_fixtures import echo_server, health_check, make_ca, make_cert

WORKER_SECRET = "w0rker-5ecret-7c1d9a0b3e5f4a2c"
LEARNER_SECRET = "le4rner-5ecret-e8b2c6d1f0a94b37"
TOKENS = RoleTokens(Token(WORKER_SECRET), Token(LEARNER_SECRET))
WORKER = Token(WORKER_SECRET)
LEARNER = Token(LEARNER_SECRET)
STRANGER = Token("5tranger-5ecret-0123456789abcdef")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """A plaintext server that requires tokens."""
    with echo_server(interceptors=[AuthInterceptor(TOKENS)]) as bound:
        yield bound


def _join(channel: grpc.Channel) -> list[bytes]:
    call = channel.stream_stream(_rpc.JOIN, None, None)
    return list(call(iter([b"hello", b"again"]), timeout=5))


def _status(channel: grpc.Channel) -> bytes:
    return channel.unary_unary(_rpc.GET_STATUS, None, None)(b"status?", timeout=5)


def _code(call: object, channel: grpc.Channel) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call(channel)  # type: ignore[operator]
    return caught.value.code()


def _channel(port: int, token: Token | None) -> grpc.Channel:
    return secure_channel(f"127.0.0.1:{port}", [], token=token)


# --- roles over plaintext on loopback ----------------------------------------------------


def test_worker_token_may_join_and_nothing_else(port: int) -> None:
    with _channel(port, WORKER) as channel:
        assert _join(channel) == [b"hello", b"again"]
        assert _code(_status, channel) is grpc.StatusCode.PERMISSION_DENIED


def test_learner_token_may_call_the_learner_face_but_not_join(port: int) -> None:
    with _channel(port, LEARNER) as channel:
        assert _status(channel) == b"status?"
        assert _code(_join, channel) is grpc.StatusCode.PERMISSION_DENIED


def test_no_token_and_a_wrong_token_are_unauthenticated(port: int) -> None:
    for token in (None, STRANGER):
        with _channel(port, token) as channel:
            assert _code(_join, channel) is grpc.StatusCode.UNAUTHENTICATED
            assert _code(_status, channel) is grpc.StatusCode.UNAUTHENTICATED


def test_health_needs_no_token(port: int) -> None:
    with _channel(port, None) as channel:
        assert health_check(channel) == health_pb2.HealthCheckResponse.SERVING


def test_unknown_methods_are_refused_even_to_valid_tokens(port: int) -> None:
    with _channel(port, LEARNER) as channel:
        call = channel.unary_unary("/rlfleet.v1.AdminService/Shutdown", None, None)
        with pytest.raises(grpc.RpcError) as caught:
            call(b"", timeout=5)
    assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "no role may call /rlfleet.v1.AdminService/Shutdown" in (caught.value.details() or "")


def test_refusals_say_what_to_do(port: int) -> None:
    with _channel(port, WORKER) as channel, pytest.raises(grpc.RpcError) as caught:
        _status(channel)
    assert caught.value.details() == (
        f"the worker token may not call {_rpc.GET_STATUS}: it needs the learner token "
        "(workers may only Join)"
    )
    with _channel(port, None) as channel, pytest.raises(grpc.RpcError) as caught:
        _status(channel)
    assert "authorization: Bearer <token>" in (caught.value.details() or "")


def test_refusals_map_to_typed_exceptions(port: int) -> None:
    with _channel(port, STRANGER) as channel, pytest.raises(grpc.RpcError) as caught:
        _status(channel)
    assert isinstance(_rpc.error_from_rpc(caught.value, what="GetStatus"), AuthenticationError)
    with _channel(port, WORKER) as channel, pytest.raises(grpc.RpcError) as caught:
        _status(channel)
    assert isinstance(_rpc.error_from_rpc(caught.value, what="GetStatus"), PermissionDeniedError)


def test_raw_metadata_forms(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(_rpc.GET_STATUS, None, None)

        def code(metadata: tuple[tuple[str, str | bytes], ...]) -> grpc.StatusCode:
            try:
                call(b"x", metadata=metadata, timeout=5)
            except grpc.RpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        assert code((("authorization", f"Bearer {LEARNER_SECRET}"),)) is grpc.StatusCode.OK
        assert code((("authorization", f"bearer {LEARNER_SECRET}"),)) is grpc.StatusCode.OK
        assert code((("authorization", f"Basic {LEARNER_SECRET}"),)) is (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert code((("authorization", LEARNER_SECRET),)) is grpc.StatusCode.UNAUTHENTICATED
        twice: tuple[tuple[str, str | bytes], ...] = (
            ("authorization", f"Bearer {LEARNER_SECRET}"),
        ) * 2
        assert code(twice) is grpc.StatusCode.UNAUTHENTICATED


# --- no token in logs -------------------------------------------------------------------


def test_failed_auth_is_logged_without_the_token(caplog: pytest.LogCaptureFixture) -> None:
    # A fresh server: the refusal log is rate-limited per interceptor.
    presented = "wr0ng-but-l0ng-en0ugh-secret-42"
    with (
        caplog.at_level(logging.DEBUG),
        echo_server(interceptors=[AuthInterceptor(TOKENS)]) as bound,
        _channel(bound, Token(presented)) as channel,
    ):
        assert _code(_status, channel) is grpc.StatusCode.UNAUTHENTICATED
        assert _code(_join, channel) is grpc.StatusCode.UNAUTHENTICATED
    assert f"refused {_rpc.GET_STATUS} from ipv4:127.0.0.1:" in caplog.text
    assert "UNAUTHENTICATED" in caplog.text
    for secret in (presented, WORKER_SECRET, LEARNER_SECRET):
        assert secret not in caplog.text


def test_refusal_logs_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    interceptor = AuthInterceptor(TOKENS, clock=lambda: now[0])
    with (
        caplog.at_level(logging.WARNING, logger="rlfleet.security"),
        echo_server(interceptors=[interceptor]) as bound,
        _channel(bound, None) as channel,
    ):
        for _ in range(5):
            _code(_status, channel)
        assert len(caplog.records) == 1
        now[0] += 11.0
        _code(_status, channel)
    assert len(caplog.records) == 2
    assert "more refused" not in caplog.records[0].getMessage()
    assert caplog.records[1].getMessage().endswith("(4 more refused since the last report)")


# --- TLS with call credentials ------------------------------------------------------------


def test_tokens_over_tls_use_call_credentials(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    cert, key = make_cert(ca, "coordinator").write(tmp_path, "server")
    server = ServerTLS.from_files(cert, key)
    client = ClientTLS.from_files(tmp_path / "ca.crt")
    with echo_server(
        credentials=server.credentials(), interceptors=[AuthInterceptor(TOKENS)]
    ) as bound:
        target = f"127.0.0.1:{bound}"
        with secure_channel(target, [], tls=client, token=WORKER) as channel:
            assert _join(channel) == [b"hello", b"again"]
            assert _code(_status, channel) is grpc.StatusCode.PERMISSION_DENIED
        with secure_channel(target, [], tls=client, token=LEARNER) as channel:
            assert _status(channel) == b"status?"
        with secure_channel(target, [], tls=client) as channel:
            assert _code(_status, channel) is grpc.StatusCode.UNAUTHENTICATED


# --- plaintext token warning ------------------------------------------------------------------


def test_token_in_plaintext_to_another_host_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.security"):
        # Channels connect lazily: nothing is dialled here.
        secure_channel("10.1.2.3:50051", [], token=LEARNER).close()
        secure_channel("10.1.2.3:50051", [], token=LEARNER).close()  # once per target
    assert caplog.text.count("SECURITY: sending a bearer token to 10.1.2.3:50051 without TLS") == 1
    assert LEARNER_SECRET not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlfleet.security"):
        secure_channel("127.0.0.1:50051", [], token=LEARNER).close()
        secure_channel("10.1.2.3:50051", []).close()
    assert caplog.text == ""


# --- the rule table and metadata parsing --------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "method", "allowed"),
    [
        (Role.WORKER, _rpc.JOIN, True),
        (Role.WORKER, _rpc.SAMPLE, False),
        (Role.WORKER, _rpc.UPDATE_AGENT, False),
        (Role.WORKER, _rpc.GET_STATUS, False),
        (Role.LEARNER, _rpc.SAMPLE, True),
        (Role.LEARNER, _rpc.SUBSCRIBE, True),
        (Role.LEARNER, _rpc.UPDATE_AGENT, True),
        (Role.LEARNER, _rpc.UPDATE_ENV, True),
        (Role.LEARNER, _rpc.GET_STATUS, True),
        (Role.LEARNER, _rpc.JOIN, False),
        (Role.LEARNER, "/rlfleet.v1.LearnerServiceX/Sample", False),
        (Role.WORKER, "/rlfleet.v1.WorkerService/JoinX", False),
    ],
)
def test_may_call(role: Role, method: str, allowed: bool) -> None:
    assert may_call(role, method) is allowed


def test_bearer_token_parsing() -> None:
    assert bearer_token([("authorization", "Bearer abc")]) == "abc"
    assert bearer_token([("Authorization", "BEARER  abc ")]) == "abc"
    for bad in ([], None, [("authorization", "Bearer ")], [("authorization", b"Bearer abc")]):
        refusal = bearer_token(bad)
        assert isinstance(refusal, Refusal)
        assert refusal.code is grpc.StatusCode.UNAUTHENTICATED


def test_check_lets_health_through_without_credentials() -> None:
    interceptor = AuthInterceptor(TOKENS)
    assert interceptor.check("/grpc.health.v1.Health/Check", ()) is None
    assert interceptor.check("/grpc.health.v1.Health/Watch", ()) is None
    refusal = interceptor.check(_rpc.SAMPLE, ())
    assert refusal is not None and refusal.code is grpc.StatusCode.UNAUTHENTICATED
