"""Why a TLS connection failed: a refused certificate is not an outage.

gRPC reports a coordinator that refuses the client's certificate (mutual
TLS: none given, or one from another CA) as UNAVAILABLE with "Socket
closed", the same status as a coordinator that is down, so a worker would
retry forever and a learner would be told to retry. After such a failure,
the client shakes hands once more with Python's own TLS stack and the same
credentials; the alert the server sends back (or the verification error
of the server's certificate) says what is wrong, and the caller turns it
into an error that names TLS and is not retried.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlfleet.security.tls import ClientTLS

_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Seconds the probe may take (connect, handshake, the server's first answer).
PROBE_SECONDS = 5.0


def tls_failure(address: str, tls: ClientTLS, timeout: float = PROBE_SECONDS) -> str | None:
    """What the TLS handshake with ``address`` says is wrong, or None.

    None means the handshake works, or the failure is not about TLS (the
    host does not answer, the connection was reset): an outage, worth a
    retry.

    Args:
        address: ``HOST:PORT`` of the coordinator.
        tls: The client's TLS settings.
        timeout: Seconds the probe may take.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit():
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.set_alpn_protocols(["h2"])  # gRPC servers insist on HTTP/2
    if tls.root_certificates is not None:
        context.load_verify_locations(cadata=tls.root_certificates.decode("ascii", "replace"))
    try:
        with _client_certificate(tls) as files:
            if files is not None:
                context.load_cert_chain(*files)
            with (
                socket.create_connection((host, int(port)), timeout=timeout) as raw,
                context.wrap_socket(raw, server_hostname=tls.server_name or host) as conn,
            ):
                # Under TLS 1.3 the server judges the client's certificate
                # after the client's side of the handshake is done: gRPC
                # then closes the connection without a word, where an
                # accepting server answers the HTTP/2 preface.
                conn.sendall(_HTTP2_PREFACE)
                if conn.recv(1) == b"":
                    return (
                        "the coordinator closed the connection right after the TLS handshake, "
                        "which is how it refuses a client certificate (mutual TLS): "
                        + (
                            "this client presented none"
                            if tls.certificate_chain is None
                            else "it did not accept this client's certificate"
                        )
                    )
    except ssl.SSLCertVerificationError as exc:
        return f"the coordinator's certificate does not verify: {exc.verify_message}"
    except ssl.SSLError as exc:
        return f"the TLS handshake failed: {exc.reason or exc}"
    except (OSError, ValueError):
        return None
    return None


def describe_tls_failure(address: str, reason: str, tls: ClientTLS) -> str:
    """The message of a refused TLS connection: what happened and what to do."""
    if tls.certificate_chain is None:
        advice = (
            "if the coordinator requires mutual TLS (--tls-client-ca), give this client a "
            "certificate signed by that CA (--tls-cert and --tls-key)"
        )
    else:
        advice = (
            "check that the client certificate (--tls-cert) is signed by the coordinator's "
            "--tls-client-ca and not expired, and that --tls-ca is the CA of the coordinator's "
            "certificate"
        )
    return f"TLS with coordinator {address} failed: {reason} ({tls.origin}); {advice}"


@contextlib.contextmanager
def _client_certificate(tls: ClientTLS) -> Iterator[tuple[str, str] | None]:
    """Paths of the client's PEM certificate and key, which ``ssl`` only reads from files.

    In memory where the system allows it (Linux ``memfd``), else in a
    private temporary directory removed at once.
    """
    if tls.certificate_chain is None or tls.private_key is None:
        yield None
        return
    contents = (tls.certificate_chain, tls.private_key)
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create(f"rlfleet-tls-{i}") for i in range(2)]
        try:
            for fd, data in zip(fds, contents, strict=True):
                os.write(fd, data)
            yield (f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="rlfleet-tls-") as directory:
        paths = [Path(directory) / name for name in ("cert.pem", "key.pem")]
        for path, data in zip(paths, contents, strict=True):
            path.touch(mode=0o600)
            path.write_bytes(data)
        yield (str(paths[0]), str(paths[1]))
