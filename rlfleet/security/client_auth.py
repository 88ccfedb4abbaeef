"""Client side: dialling the coordinator with TLS and a bearer token.

Over TLS the token rides as gRPC call credentials
(``grpc.metadata_call_credentials``), which gRPC attaches to every call on
the channel and never sends in the clear. gRPC refuses call credentials on
an insecure channel, so without TLS a client interceptor adds the same
``authorization`` metadata to every call instead. That sends the token in
plaintext: fine on loopback (``Fleet.local``), so allowed silently there,
and anywhere else allowed with one loud warning per target and process
(:func:`rlfleet.security.listen.plaintext_token_warning`), because a
trusted private network is a legitimate set-up and refusing would only
push users to turn tokens off.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from rlfleet._util.log_limit import OncePerKey
from rlfleet.security.auth import AUTHORIZATION_KEY
from rlfleet.security.listen import plaintext_token_warning
from rlfleet.security.tls import ClientTLS
from rlfleet.security.tokens import Token

logger = logging.getLogger("rlfleet.security")


def authorization_metadata(token: Token) -> tuple[tuple[str, str]]:
    """The call metadata that presents ``token``."""
    return ((AUTHORIZATION_KEY, f"Bearer {token.reveal()}"),)


class BearerAuthPlugin(grpc.AuthMetadataPlugin):
    """Call credentials plugin: adds ``authorization: Bearer <token>`` (TLS channels).

    Args:
        token: The token to present.
    """

    def __init__(self, token: Token) -> None:
        self._metadata = authorization_metadata(token)

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        """Called by gRPC before each call."""
        del context
        callback(self._metadata, None)

    def __repr__(self) -> str:
        return "BearerAuthPlugin(Token(****))"


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    """A ClientCallDetails gRPC accepts back from an interceptor."""


class BearerMetadataInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call (plaintext channels).

    Args:
        token: The token to present.
    """

    def __init__(self, token: Token) -> None:
        self._metadata = authorization_metadata(token)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        kept: Sequence[tuple[str, Any]] = [
            (key, value)
            for key, value in details.metadata or ()
            if key.lower() != AUTHORIZATION_KEY
        ]
        return _CallDetails(
            details.method,
            details.timeout,
            (*kept, *self._metadata),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        """Adds the metadata to a unary-unary call."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        """Adds the metadata to a unary-stream call."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> Any:
        """Adds the metadata to a stream-unary call."""
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Iterator[Any],
    ) -> Any:
        """Adds the metadata to a stream-stream call."""
        return continuation(self._details(client_call_details), request_iterator)

    def __repr__(self) -> str:
        return "BearerMetadataInterceptor(Token(****))"


def secure_channel(
    target: str,
    options: Sequence[tuple[str, Any]],
    *,
    tls: ClientTLS | None = None,
    token: Token | None = None,
) -> grpc.Channel:
    """Opens a channel with the transport and call security asked for.

    Args:
        target: ``HOST:PORT`` of the coordinator.
        options: Channel options (``rlfleet.transport.rpc`` builds them).
        tls: TLS settings, or None for plaintext.
        token: The token to present on every call, or None.

    Returns:
        The channel. With a token but no TLS it is an intercepted channel,
        and a warning was logged unless ``target`` is loopback.
    """
    if tls is not None:
        credentials = tls.credentials()
        if token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.metadata_call_credentials(BearerAuthPlugin(token), name="rlfleet")
            )
        return grpc.secure_channel(target, credentials, [*options, *tls.channel_options()])
    channel = grpc.insecure_channel(target, list(options))
    if token is None:
        return channel
    _warn_once(target)
    return grpc.intercept_channel(channel, BearerMetadataInterceptor(token))


_plaintext_warned = OncePerKey()


def _warn_once(target: str) -> None:
    """Logs the plaintext-token warning for ``target`` once per process."""
    warning = plaintext_token_warning(target)
    if warning is None:
        return
    if _plaintext_warned.first(target):
        logger.warning("%s", warning)
