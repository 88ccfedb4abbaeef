"""Security: TLS, bearer tokens with roles, the pickle gate, limits, safe defaults.

See docs/security.md for the threat model and deployment. In short: the
coordinator listens on loopback unless told otherwise; on a network it
serves TLS (or mutual TLS) and checks a bearer token on every call, the
worker token allowing only Join and the learner token only the learner
service; no code crosses the wire unless both ends opted in with
``--allow-pickle``, which itself needs TLS and tokens.

Names are imported on first use (PEP 562), so that the CLI can build its
flags (:mod:`rlfleet.cli._security_flags`) without loading gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlfleet._util.imports import LazyNames

if TYPE_CHECKING:
    from rlfleet.security.auth import (
        AuthInterceptor,
        Role,
        RoleTokens,
        may_call,
    )
    from rlfleet.security.client_auth import (
        BearerAuthPlugin,
        BearerMetadataInterceptor,
        secure_channel,
    )
    from rlfleet.security.limits import InflightBudget, Limits
    from rlfleet.security.listen import DEFAULT_HOST, is_loopback, warn_if_exposed
    from rlfleet.security.pickle import PICKLE_CAPABILITY, PickleGate
    from rlfleet.security.redact import TokenRedactor, install_redaction
    from rlfleet.security.settings import ClientSecurity, ServerSecurity
    from rlfleet.security.tls import ClientTLS, ServerTLS
    from rlfleet.security.tokens import (
        CLIENT_TOKEN,
        COORDINATOR_LEARNER_TOKEN,
        COORDINATOR_WORKER_TOKEN,
        MIN_TOKEN_LENGTH,
        WORKER_TOKEN,
        Token,
        TokenSetting,
        load_token,
        read_token_file,
    )

_LAZY = LazyNames(
    __name__,
    {
        "AuthInterceptor": "rlfleet.security.auth",
        "Role": "rlfleet.security.auth",
        "RoleTokens": "rlfleet.security.auth",
        "may_call": "rlfleet.security.auth",
        "BearerAuthPlugin": "rlfleet.security.client_auth",
        "BearerMetadataInterceptor": "rlfleet.security.client_auth",
        "secure_channel": "rlfleet.security.client_auth",
        "InflightBudget": "rlfleet.security.limits",
        "Limits": "rlfleet.security.limits",
        "DEFAULT_HOST": "rlfleet.security.listen",
        "is_loopback": "rlfleet.security.listen",
        "warn_if_exposed": "rlfleet.security.listen",
        "PICKLE_CAPABILITY": "rlfleet.security.pickle",
        "PickleGate": "rlfleet.security.pickle",
        "TokenRedactor": "rlfleet.security.redact",
        "install_redaction": "rlfleet.security.redact",
        "ClientSecurity": "rlfleet.security.settings",
        "ServerSecurity": "rlfleet.security.settings",
        "ClientTLS": "rlfleet.security.tls",
        "ServerTLS": "rlfleet.security.tls",
        "CLIENT_TOKEN": "rlfleet.security.tokens",
        "COORDINATOR_LEARNER_TOKEN": "rlfleet.security.tokens",
        "COORDINATOR_WORKER_TOKEN": "rlfleet.security.tokens",
        "MIN_TOKEN_LENGTH": "rlfleet.security.tokens",
        "WORKER_TOKEN": "rlfleet.security.tokens",
        "Token": "rlfleet.security.tokens",
        "TokenSetting": "rlfleet.security.tokens",
        "load_token": "rlfleet.security.tokens",
        "read_token_file": "rlfleet.security.tokens",
    },
)


def __getattr__(name: str) -> object:
    return _LAZY(name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "CLIENT_TOKEN",
    "COORDINATOR_LEARNER_TOKEN",
    "COORDINATOR_WORKER_TOKEN",
    "DEFAULT_HOST",
    "MIN_TOKEN_LENGTH",
    "PICKLE_CAPABILITY",
    "WORKER_TOKEN",
    "AuthInterceptor",
    "BearerAuthPlugin",
    "BearerMetadataInterceptor",
    "ClientSecurity",
    "ClientTLS",
    "InflightBudget",
    "Limits",
    "PickleGate",
    "Role",
    "RoleTokens",
    "ServerSecurity",
    "ServerTLS",
    "Token",
    "TokenRedactor",
    "TokenSetting",
    "install_redaction",
    "is_loopback",
    "load_token",
    "may_call",
    "read_token_file",
    "secure_channel",
    "warn_if_exposed",
]
