"""Server-side authentication and authorization: who may call which method.

With tokens configured, every call to the coordinator must carry the gRPC
metadata ``authorization: Bearer <token>``, and the token decides the
caller's role (least privilege):

=========  ==========================================================
role       may call
=========  ==========================================================
worker     ``rlfleet.v1.WorkerService/Join`` only
learner    ``rlfleet.v1.LearnerService/*`` only (it cannot join as a
           worker: a learner has no business running episodes)
either     ``grpc.reflection.v1alpha.ServerReflection/*`` (``grpcurl``
           with ``-H "authorization: Bearer <token>"``: the services'
           schema, which the repository's protos/ publish anyway)
anyone     ``grpc.health.v1.Health/*`` (probes carry no credentials
           and learn nothing but SERVING or NOT_SERVING)
=========  ==========================================================

Anything else is refused: no or a bad token with UNAUTHENTICATED, a good
token outside its role, or an unknown method, with PERMISSION_DENIED. The
refusal happens in the interceptor, before the method's handler runs or
any request is read, so an unauthenticated peer costs the server no more
than the refusal itself.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from rlfleet._util.log_limit import LogLimiter, held_back_note
from rlfleet.errors import ConfigError
from rlfleet.security.tokens import Token
from rlfleet.transport import rpc as _rpc

logger = logging.getLogger("rlfleet.security")

AUTHORIZATION_KEY = "authorization"
BEARER = "bearer"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIX = "/grpc.reflection.v1alpha.ServerReflection/"
_LEARNER_PREFIX = f"/{_rpc.LEARNER_SERVICE}/"


class Role(enum.Enum):
    """What a token lets its holder do."""

    WORKER = "worker"
    LEARNER = "learner"


def may_call(role: Role, method: str) -> bool:
    """Whether ``role`` may call the full method path ``method``."""
    if method.startswith(REFLECTION_PREFIX):
        return True
    if role is Role.WORKER:
        return method == _rpc.JOIN
    return method.startswith(_LEARNER_PREFIX)


def _needed_role(method: str) -> Role | None:
    if method == _rpc.JOIN:
        return Role.WORKER
    if method.startswith(_LEARNER_PREFIX):
        return Role.LEARNER
    return None


@dataclass(frozen=True)
class RoleTokens:
    """The coordinator's two tokens.

    Args:
        worker: What workers present.
        learner: What learners present.

    Raises:
        ConfigError: If both are the same token: a worker could then act
            as a learner, which the roles exist to prevent.
    """

    worker: Token
    learner: Token

    def __post_init__(self) -> None:
        if self.worker == self.learner:
            raise ConfigError(
                f"the worker token ({self.worker.source}) and the learner token "
                f"({self.learner.source}) are the same; give each role its own token so that "
                "a worker cannot push agent updates (openssl rand -hex 32, twice)"
            )

    @classmethod
    def of(cls, worker: Token | None, learner: Token | None) -> RoleTokens | None:
        """Both tokens, or None for neither.

        Raises:
            ConfigError: If only one is given: half an authenticated server
                would leave the other face open to anyone.
        """
        if worker is None and learner is None:
            return None
        if worker is None or learner is None:
            given, missing = ("worker", "learner") if learner is None else ("learner", "worker")
            raise ConfigError(
                f"a {given} token is set but no {missing} token: set both (--worker-token-file "
                "and --learner-token-file, or RLFLEET_WORKER_TOKEN and RLFLEET_LEARNER_TOKEN) "
                "or neither"
            )
        return cls(worker, learner)

    def role_of(self, presented: str) -> Role | None:
        """The role of a presented token, or None if it is neither.

        Both comparisons always run, so timing does not tell which failed.
        """
        is_worker = self.worker.matches(presented)
        is_learner = self.learner.matches(presented)
        if is_learner:
            return Role.LEARNER
        return Role.WORKER if is_worker else None


@dataclass(frozen=True)
class Refusal:
    """Why a call was refused, as the caller will see it."""

    code: grpc.StatusCode
    message: str


def bearer_token(metadata: Sequence[tuple[str, Any]] | None) -> str | Refusal:
    """The token of a call's ``authorization: Bearer <token>`` metadata.

    Returns:
        The token text, or a Refusal (UNAUTHENTICATED) saying what is wrong.
    """
    values = [value for key, value in metadata or () if key.lower() == AUTHORIZATION_KEY]
    if not values:
        return Refusal(
            grpc.StatusCode.UNAUTHENTICATED,
            "this coordinator requires a token: send the gRPC metadata "
            "'authorization: Bearer <token>' (rlfleet: --token-file, token=..., or the "
            "environment variable RLFLEET_TOKEN / RLFLEET_WORKER_TOKEN)",
        )
    if len(values) > 1:
        return Refusal(
            grpc.StatusCode.UNAUTHENTICATED,
            f"the call carries {len(values)} authorization metadata entries; send exactly one",
        )
    scheme, _, token = values[0].partition(" ") if isinstance(values[0], str) else ("", "", "")
    if scheme.lower() != BEARER or not token.strip():
        return Refusal(
            grpc.StatusCode.UNAUTHENTICATED,
            "the authorization metadata must be 'Bearer <token>'",
        )
    return token.strip()


class AuthInterceptor(grpc.ServerInterceptor):
    """Checks every call's bearer token and role before its handler runs.

    Args:
        tokens: The coordinator's worker and learner tokens.
        clock: Seconds, for spacing out refusal logs (tests pass their own).
        on_refused: Called with the status code name of each refused call.
    """

    def __init__(
        self,
        tokens: RoleTokens,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self._tokens = tokens
        self._log = _RefusalLog(clock)
        self._on_refused = on_refused

    def check(self, method: str, metadata: Sequence[tuple[str, Any]] | None) -> Refusal | None:
        """Decides one call: None to let it through, else why not."""
        if method.startswith(HEALTH_PREFIX):
            return None
        presented = bearer_token(metadata)
        if isinstance(presented, Refusal):
            return presented
        role = self._tokens.role_of(presented)
        if role is None:
            return Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "the token is not valid for this coordinator; check that the worker or "
                "learner uses the token the coordinator was started with",
            )
        if may_call(role, method):
            return None
        needed = _needed_role(method)
        if needed is None:
            return Refusal(grpc.StatusCode.PERMISSION_DENIED, f"no role may call {method}")
        return Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"the {role.value} token may not call {method}: it needs the {needed.value} "
            f"token ({_ROLE_SCOPE[role]})",
        )

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        """gRPC's hook: the method's handler, or one that refuses the call."""
        method = handler_call_details.method
        refusal = self.check(method, handler_call_details.invocation_metadata)
        if refusal is None:
            return continuation(handler_call_details)
        if self._on_refused is not None:
            self._on_refused(refusal.code.name)
        return _refusing_handler(refusal, method, self._log)


_ROLE_SCOPE = {
    Role.WORKER: "workers may only Join",
    Role.LEARNER: "learners may only call LearnerService",
}


def _refusing_handler(refusal: Refusal, method: str, log: _RefusalLog) -> grpc.RpcMethodHandler:
    # Stream-stream whatever the method's shape: the handler runs at once
    # without waiting for a request message, and its status reaches unary
    # callers just the same.
    def refuse(requests: Iterator[bytes], context: grpc.ServicerContext) -> NoReturn:
        del requests
        log.refused(method, context.peer(), refusal)
        context.abort(refusal.code, refusal.message)

    return grpc.stream_stream_rpc_method_handler(refuse)


class _RefusalLog:
    """Logs refused calls, at most one line per interval plus a count.

    A peer hammering the port with bad tokens must not flood the logs.
    Never logs the presented token: only method, peer and reason.
    """

    INTERVAL_SECONDS = 10.0

    def __init__(self, clock: Callable[[], float]) -> None:
        self._limit = LogLimiter(self.INTERVAL_SECONDS, clock)

    def refused(self, method: str, peer: str, refusal: Refusal) -> None:
        held_back = self._limit.admit()
        if held_back is None:
            return
        logger.warning(
            "refused %s from %s: %s: %s%s",
            method,
            peer,
            refusal.code.name,
            refusal.message,
            held_back_note(held_back, "refused"),
        )
