"""The security settings of each process, checked together once.

:class:`ServerSecurity` is the coordinator's (TLS, the two role tokens,
the pickle opt-in); :class:`ClientSecurity` is a worker's or learner's
(TLS, one token). Rules that span settings live here: pickle needs TLS and
tokens, half a token pair is refused, exposing a server without them is
warned about.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from rlfleet.errors import ConfigError
from rlfleet.security import pickle as pickle_gate
from rlfleet.security.auth import AuthInterceptor, RoleTokens
from rlfleet.security.client_auth import secure_channel
from rlfleet.security.listen import warn_if_exposed
from rlfleet.security.tls import ClientTLS, PathLike, ServerTLS
from rlfleet.security.tokens import CLIENT_TOKEN, Token, load_token


@dataclass(frozen=True)
class ServerSecurity:
    """How the coordinator protects its port. The default protects nothing: loopback only.

    Args:
        tls: Certificate and key (and client CA for mTLS), or None for plaintext.
        tokens: The worker and learner tokens, or None to accept any caller.
        allow_pickle: Forward pickled policies and env factories to workers
            that allow them too. Needs ``tls`` and ``tokens``.

    Raises:
        ConfigError: If ``allow_pickle`` lacks TLS or tokens, or cloudpickle.
    """

    tls: ServerTLS | None = None
    tokens: RoleTokens | None = None
    allow_pickle: bool = False

    def __post_init__(self) -> None:
        pickle_gate.check_prerequisites(
            self.allow_pickle,
            tls=self.tls is not None,
            authenticated=self.tokens is not None,
            process="coordinator",
        )

    @property
    def pickle(self) -> pickle_gate.PickleGate:
        """The coordinator's side of the pickle gate."""
        return pickle_gate.PickleGate(self.allow_pickle, "coordinator")

    def interceptors(
        self, on_refused: Callable[[str], None] | None = None
    ) -> list[grpc.ServerInterceptor]:
        """Interceptors for ``grpc.server``: the token check, when tokens are set.

        Args:
            on_refused: Called with the status code name of each refused
                call (the coordinator counts them in its metrics).
        """
        if self.tokens is None:
            return []
        return [AuthInterceptor(self.tokens, on_refused=on_refused)]

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Binds ``address`` with TLS or in plaintext; warns if that exposes the server.

        Returns:
            The bound port, or 0 if gRPC could not bind (it may also raise
            RuntimeError).
        """
        warn_if_exposed(address, tls=self.tls is not None, authenticated=self.tokens is not None)
        if self.tls is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self.tls.credentials())

    def tokens_to_redact(self) -> tuple[Token, ...]:
        """Every token this process holds, for the log redactor."""
        return () if self.tokens is None else (self.tokens.worker, self.tokens.learner)


@dataclass(frozen=True)
class ClientSecurity:
    """How a worker or learner dials the coordinator.

    Args:
        tls: The CA to verify the coordinator with (and the client's own
            certificate for mTLS), or None for plaintext.
        token: The token to present on every call, or None.
    """

    tls: ClientTLS | None = None
    token: Token | None = None

    def __post_init__(self) -> None:
        if self.token is not None and not isinstance(self.token, Token):
            raise ConfigError(
                f"ClientSecurity.token must be a rlfleet.security.Token, got "
                f"{type(self.token).__name__}; wrap the text with Token(...)"
            )

    @classmethod
    def from_options(
        cls,
        *,
        tls_ca: PathLike | None = None,
        tls_cert: PathLike | None = None,
        tls_key: PathLike | None = None,
        tls_server_name: str | None = None,
        token: str | Token | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ClientSecurity:
        """A learner's settings from library arguments (``RemoteSampler(tls_ca=...)``).

        Args:
            tls_ca: PEM CA bundle to verify the coordinator with; any TLS
                argument turns TLS on (with only a client certificate or a
                server name, the system's CAs verify the coordinator).
            tls_cert: PEM client certificate (mutual TLS).
            tls_key: Its PEM key.
            tls_server_name: Name the coordinator's certificate must carry,
                if not the dialled host's.
            token: The learner token; None reads ``RLFLEET_TOKEN``, then
                ``RLFLEET_LEARNER_TOKEN``.
            environ: The environment (default: ``os.environ``).

        Raises:
            ConfigError: For unusable files or tokens.
        """
        tls = None
        if any(value is not None for value in (tls_ca, tls_cert, tls_key, tls_server_name)):
            tls = ClientTLS.from_files(tls_ca, tls_cert, tls_key, server_name=tls_server_name)
        if token is None:
            loaded = load_token(CLIENT_TOKEN, environ=environ)
        elif isinstance(token, Token):
            loaded = token
        else:
            loaded = Token(token, source="the token argument")
        return cls(tls, loaded)

    def open_channel(self, target: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``target`` with these settings (see :func:`secure_channel`)."""
        return secure_channel(target, options, tls=self.tls, token=self.token)

    def tokens_to_redact(self) -> tuple[Token, ...]:
        """The token this process holds, for the log redactor."""
        return () if self.token is None else (self.token,)
