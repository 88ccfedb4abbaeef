"""TLS and mutual TLS credentials from PEM files.

The coordinator serves TLS with ``--tls-cert``/``--tls-key`` and, with
``--tls-client-ca``, requires every client to present a certificate signed
by that CA (mTLS). Workers and learners verify the coordinator against
``--tls-ca`` (or the system's trust store) and, for mTLS, present their own
``--tls-cert``/``--tls-key``.

Files are checked when they are loaded, with Python's ``ssl`` module, so
that a wrong path, a DER file, an encrypted key or a key that belongs to
another certificate is a :class:`~rlfleet.errors.ConfigError` naming the
file at start-up rather than a handshake failure on the first call.
"""

from __future__ import annotations

import os
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import grpc

from rlfleet.errors import ConfigError

PathLike = str | os.PathLike[str]

_CERT_MARKER = b"-----BEGIN CERTIFICATE-----"
_KEY_MARKER = b"PRIVATE KEY-----"
_ENCRYPTED_MARKER = b"ENCRYPTED"


@dataclass(frozen=True)
class ServerTLS:
    """The coordinator's certificate, key and (for mTLS) client CA.

    Make one with :meth:`from_files`. The key never appears in ``repr``.

    Attributes:
        certificate_chain: PEM certificate chain, the server's own first.
        private_key: PEM private key of that certificate.
        client_ca: PEM CA bundle client certificates must chain to; set,
            it makes TLS mutual (clients without a valid certificate fail
            the handshake).
        origin: Where these came from, for messages.
    """

    certificate_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = field(default=None, repr=False)
    origin: str = "PEM data given in code"

    @classmethod
    def from_files(
        cls, cert: PathLike, key: PathLike, client_ca: PathLike | None = None
    ) -> ServerTLS:
        """Loads and checks ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca``.

        Raises:
            ConfigError: If a file is missing, unreadable, not PEM, an
                encrypted key, or the key does not belong to the certificate.
                The message names the file.
        """
        cert_pem, key_pem = _load_pair(cert, key, "--tls-cert", "--tls-key")
        ca_pem = _load_ca(client_ca, "--tls-client-ca") if client_ca is not None else None
        origin = f"--tls-cert {os.fspath(cert)}"
        if client_ca is not None:
            origin += f", --tls-client-ca {os.fspath(client_ca)}"
        return cls(cert_pem, key_pem, ca_pem, origin)

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return self.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials."""
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.mutual,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """The same credentials for the lease data channel (Python's ``ssl``),
        requiring client certificates under mTLS as gRPC does."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        _load_chain(context, self.certificate_chain, self.private_key)
        if self.client_ca is not None:
            context.load_verify_locations(cadata=self.client_ca.decode("ascii"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context


@dataclass(frozen=True)
class ClientTLS:
    """What a worker or learner needs to dial a TLS coordinator.

    Make one with :meth:`from_files`. The key never appears in ``repr``.

    Attributes:
        root_certificates: PEM CA bundle the coordinator's certificate must
            chain to; None trusts the system's CAs.
        certificate_chain: The client's PEM certificate (mTLS), or None.
        private_key: Its PEM key, or None.
        server_name: Name to check the coordinator's certificate against
            instead of the dialled host (e.g. when dialling
            ``localhost:50051`` through ``kubectl port-forward``), or None.
        origin: Where these came from, for messages.
    """

    root_certificates: bytes | None = field(default=None, repr=False)
    certificate_chain: bytes | None = field(default=None, repr=False)
    private_key: bytes | None = field(default=None, repr=False)
    server_name: str | None = None
    origin: str = "PEM data given in code"

    def __post_init__(self) -> None:
        if (self.certificate_chain is None) != (self.private_key is None):
            raise ConfigError(
                "a client certificate needs its key and a key its certificate: give both "
                "--tls-cert and --tls-key, or neither"
            )

    @classmethod
    def from_files(
        cls,
        ca: PathLike | None = None,
        cert: PathLike | None = None,
        key: PathLike | None = None,
        *,
        server_name: str | None = None,
    ) -> ClientTLS:
        """Loads and checks ``--tls-ca`` and the client's ``--tls-cert``/``--tls-key``.

        Raises:
            ConfigError: If only one of cert and key is given, or a file is
                missing, unreadable, not PEM, an encrypted key, or the key
                does not belong to the certificate. The message names the file.
        """
        if (cert is None) != (key is None):
            given, missing = (
                ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
            )
            raise ConfigError(
                f"{given} is given without {missing}: a client certificate (mTLS) needs both"
            )
        ca_pem = _load_ca(ca, "--tls-ca") if ca is not None else None
        cert_pem = key_pem = None
        if cert is not None and key is not None:
            cert_pem, key_pem = _load_pair(cert, key, "--tls-cert", "--tls-key")
        origin = f"--tls-ca {os.fspath(ca)}" if ca is not None else "the system's CAs"
        return cls(ca_pem, cert_pem, key_pem, server_name, origin)

    @property
    def mutual(self) -> bool:
        """Whether this client presents a certificate."""
        return self.certificate_chain is not None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.root_certificates,
            private_key=self.private_key,
            certificate_chain=self.certificate_chain,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Channel options these credentials need (the server name override)."""
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]

    def ssl_context(self) -> ssl.SSLContext:
        """The same credentials for the lease data channel (Python's ``ssl``):
        the coordinator verified against the same CAs, the client certificate
        presented under mTLS. Dial with ``server_hostname`` :attr:`server_name`
        or the dialled host, as gRPC checks it."""
        cadata = None if self.root_certificates is None else self.root_certificates.decode("ascii")
        context = ssl.create_default_context(cadata=cadata)
        if self.certificate_chain is not None and self.private_key is not None:
            _load_chain(context, self.certificate_chain, self.private_key)
        return context


def _load_chain(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """Loads a PEM certificate chain and key given as bytes: ``ssl`` reads them
    only from files, so they pass through a private temporary directory."""
    with tempfile.TemporaryDirectory(prefix="rlfleet-tls-") as folder:
        cert_path, key_path = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_path.write_bytes(chain)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        context.load_cert_chain(cert_path, key_path)


def _read(path: PathLike, flag: str) -> bytes:
    where = f"{flag} {os.fspath(path)}"
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file; check the path (or the Secret mount)") from None
    except PermissionError:
        raise ConfigError(
            f"{where}: permission denied for uid {os.getuid()}; make it readable by the user "
            "rlfleet runs as"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{where} is a directory; give the PEM file inside it") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if not data.strip():
        raise ConfigError(f"{where} is empty")
    return data


def _load_pair(cert: PathLike, key: PathLike, cert_flag: str, key_flag: str) -> tuple[bytes, bytes]:
    cert_pem = _read(cert, cert_flag)
    key_pem = _read(key, key_flag)
    if _CERT_MARKER not in cert_pem:
        raise ConfigError(
            f"{cert_flag} {os.fspath(cert)} is not a PEM certificate (no '{_CERT_MARKER.decode()}'"
            " line); convert a DER file with `openssl x509 -inform der -in FILE -out FILE.pem`"
        )
    if _KEY_MARKER not in key_pem:
        raise ConfigError(
            f"{key_flag} {os.fspath(key)} is not a PEM private key (no '... PRIVATE KEY-----' "
            "line); convert a DER key with `openssl pkey -inform der -in FILE -out FILE.pem`"
        )
    if _ENCRYPTED_MARKER in key_pem.split(_KEY_MARKER, 1)[0]:
        _encrypted(key, key_flag)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        # The password callback only runs for an encrypted key, which gRPC
        # cannot use; without it, ssl would prompt on the terminal.
        context.load_cert_chain(cert, key, password=_refuse_password(key, key_flag))
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"{key_flag} {os.fspath(key)} is not the key of {cert_flag} {os.fspath(cert)}: "
                "give the key the certificate was issued for"
            ) from None
        raise ConfigError(
            f"{cert_flag} {os.fspath(cert)} with {key_flag} {os.fspath(key)}: OpenSSL cannot "
            f"load them ({exc.reason or exc}); check that both are PEM and belong together"
        ) from None
    return cert_pem, key_pem


def _refuse_password(key: PathLike, flag: str) -> Callable[[], NoReturn]:
    def password() -> NoReturn:
        _encrypted(key, flag)

    return password


def _encrypted(key: PathLike, flag: str) -> NoReturn:
    raise ConfigError(
        f"{flag} {os.fspath(key)} is encrypted, which gRPC cannot use; store it decrypted with "
        "tight permissions (`openssl pkey -in KEY -out KEY.plain && chmod 600 KEY.plain`) or "
        "in a Kubernetes Secret"
    )


def _load_ca(path: PathLike, flag: str) -> bytes:
    pem = _read(path, flag)
    if _CERT_MARKER not in pem:
        raise ConfigError(
            f"{flag} {os.fspath(path)} is not a PEM CA certificate bundle (no "
            f"'{_CERT_MARKER.decode()}' line)"
        )
    try:
        ssl.create_default_context().load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise ConfigError(
            f"{flag} {os.fspath(path)}: OpenSSL cannot load it as CA certificates ({reason})"
        ) from None
    return pem
