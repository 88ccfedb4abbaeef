"""Throwaway certificate authorities and certificates, and a server, for TLS tests.

Made with the ``cryptography`` package (a test dependency, not a runtime
one). EC P-256 keys: generating one takes microseconds, RSA takes tens of
milliseconds. Everything is in memory; :meth:`Issued.write` puts a
certificate and its key in files for the flag-shaped APIs.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from rlfleet.security import ClientTLS, ServerTLS

DEFAULT_SAN = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key.

    Attributes:
        cert: The certificate.
        key: Its private key.
    """

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        """The certificate, PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The private key, unencrypted PKCS#8 PEM (what gRPC takes)."""
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Writes ``NAME.crt`` and ``NAME.key`` into ``directory``; returns their paths."""
        cert_path = directory / f"{name}.crt"
        key_path = directory / f"{name}.key"
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)
        return cert_path, key_path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey):
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def make_ca(cn: str = "rlfleet test CA") -> Issued:
    """A self-signed certificate authority."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(cn, _name(cn), key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def make_cert(
    ca: Issued, cn: str, san: Sequence[str] = DEFAULT_SAN, *, client: bool = False
) -> Issued:
    """A leaf certificate signed by ``ca``.

    Args:
        ca: The issuing authority.
        cn: The subject's common name.
        san: Subject alternative names; entries that parse as IP addresses
            become IP SANs, the others DNS SANs.
        client: A client certificate (mTLS) rather than a server one.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for entry in san:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(entry)))
        except ValueError:
            names.append(x509.DNSName(entry))
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    cert = (
        _builder(cn, ca.cert.subject, key.public_key())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    return Issued(cert, key)


# --- a real gRPC server with the coordinator's method paths -------------------

#: What the test server's methods answer (they echo otherwise).
ECHO_SERVICES = ("rlfleet.v1.WorkerService", "rlfleet.v1.LearnerService")


@contextlib.contextmanager
def echo_server(
    *,
    credentials: grpc.ServerCredentials | None = None,
    interceptors: Sequence[grpc.ServerInterceptor] = (),
) -> Iterator[int]:
    """Serves Join (bidi echo), GetStatus (unary echo) and grpc.health.v1 on 127.0.0.1.

    Requests and responses are raw bytes (no protobuf), so tests exercise
    transport and call security only.

    Yields:
        The bound port.
    """

    def join(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    def get_status(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), interceptors=list(interceptors))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                ECHO_SERVICES[0], {"Join": grpc.stream_stream_rpc_method_handler(join)}
            ),
            grpc.method_handlers_generic_handler(
                ECHO_SERVICES[1], {"GetStatus": grpc.unary_unary_rpc_method_handler(get_status)}
            ),
        )
    )
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    address = "127.0.0.1:0"
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait()


@contextlib.contextmanager
def tls_socket_pair(
    sslsocket_class: type[ssl.SSLSocket] | None = None,
) -> Iterator[tuple[ssl.SSLSocket, ssl.SSLSocket]]:
    """(client end, server end) of a TLS connection over a socket pair, past
    the handshake (a throwaway CA; the client checks the server's
    certificate), the client's end blocking, as a dialled data link is.

    Args:
        sslsocket_class: The client end's class (an SSLSocket subclass that
            records its calls), or None for SSLSocket.
    """
    ca = make_ca()
    server = make_cert(ca, "coordinator")
    client = ClientTLS(ca.cert_pem).ssl_context()
    if sslsocket_class is not None:
        client.sslsocket_class = sslsocket_class
    ours, theirs = socket.socketpair()
    server_side: dict[str, ssl.SSLSocket] = {}

    def accept() -> None:
        context = ServerTLS(server.cert_pem, server.key_pem).ssl_context()
        server_side["sock"] = context.wrap_socket(theirs, server_side=True)

    accepting = threading.Thread(target=accept, name="tls-pair-accept")
    accepting.start()
    learner = client.wrap_socket(ours, server_hostname="localhost")
    accepting.join(30)
    learner.settimeout(None)
    try:
        yield learner, server_side["sock"]
    finally:
        learner.close()
        server_side["sock"].close()


def health_check(channel: grpc.Channel, timeout: float = 5.0) -> int:
    """The server's overall health status (raises grpc.RpcError on failure)."""
    stub = health_pb2_grpc.HealthStub(channel)
    return int(stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout).status)
