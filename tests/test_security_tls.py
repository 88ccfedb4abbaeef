"""TLS and mutual TLS: file checks, and real handshakes against a real gRPC server."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2

from rlfleet.errors import ConfigError
from rlfleet.security import ClientTLS, ServerTLS, secure_channel
from tests.tls_fixtures import echo_server, health_check, make_ca, make_cert

SERVING = health_pb2.HealthCheckResponse.SERVING


class PKI:
    """Files of one CA, a server and a client certificate, and a stranger CA's client."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = make_ca()
        self.ca_path = root / "ca.crt"
        self.ca_path.write_bytes(self.ca.cert_pem)
        self.server = make_cert(self.ca, "coordinator")
        self.server_cert, self.server_key = self.server.write(root, "server")
        self.client_cert, self.client_key = make_cert(self.ca, "worker-0", client=True).write(
            root, "client"
        )
        other_ca = make_ca("another CA")
        self.other_ca_path = root / "other-ca.crt"
        self.other_ca_path.write_bytes(other_ca.cert_pem)
        self.stranger_cert, self.stranger_key = make_cert(other_ca, "intruder", client=True).write(
            root, "stranger"
        )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


def _status(port: int, tls: ClientTLS, host: str = "127.0.0.1") -> int:
    with secure_channel(f"{host}:{port}", [], tls=tls) as channel:
        return health_check(channel, timeout=5)


def _handshake_fails(port: int, tls: ClientTLS) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        _status(port, tls)
    return caught.value.code()


# --- real handshakes ------------------------------------------------------------


def test_tls_client_verifies_the_server_and_talks(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key)
    assert not server.mutual
    with echo_server(credentials=server.credentials()) as port:
        assert _status(port, ClientTLS.from_files(pki.ca_path)) == SERVING
        # The SAN lists "localhost" too.
        assert _status(port, ClientTLS.from_files(pki.ca_path), host="localhost") == SERVING


def test_tls_client_with_the_wrong_ca_fails_the_handshake(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key)
    with echo_server(credentials=server.credentials()) as port:
        assert _handshake_fails(port, ClientTLS.from_files(pki.other_ca_path)) is (
            grpc.StatusCode.UNAVAILABLE
        )


def test_plaintext_client_cannot_talk_to_a_tls_server(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key)
    with (
        echo_server(credentials=server.credentials()) as port,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        health_check(channel, timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


def test_server_name_override_checks_the_certificate_against_that_name(
    pki: PKI, tmp_path: Path
) -> None:
    # A certificate for the in-cluster name only, dialled on 127.0.0.1 as
    # through `kubectl port-forward`.
    cluster_name = "rlfleet-coordinator.rlfleet.svc.cluster.local"
    cert, key = make_cert(pki.ca, "coordinator", san=[cluster_name]).write(tmp_path, "k8s")
    server = ServerTLS.from_files(cert, key)
    with echo_server(credentials=server.credentials()) as port:
        assert _handshake_fails(port, ClientTLS.from_files(pki.ca_path)) is (
            grpc.StatusCode.UNAVAILABLE
        )
        named = ClientTLS.from_files(pki.ca_path, server_name=cluster_name)
        assert _status(port, named) == SERVING


def test_mtls_admits_a_client_with_a_certificate_from_the_client_ca(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key, client_ca=pki.ca_path)
    assert server.mutual
    client = ClientTLS.from_files(pki.ca_path, pki.client_cert, pki.client_key)
    assert client.mutual
    with echo_server(credentials=server.credentials()) as port:
        assert _status(port, client) == SERVING


def test_mtls_refuses_a_client_without_a_certificate(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key, client_ca=pki.ca_path)
    with echo_server(credentials=server.credentials()) as port:
        assert _handshake_fails(port, ClientTLS.from_files(pki.ca_path)) is (
            grpc.StatusCode.UNAVAILABLE
        )


def test_mtls_refuses_a_client_certificate_from_another_ca(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key, client_ca=pki.ca_path)
    stranger = ClientTLS.from_files(pki.ca_path, pki.stranger_cert, pki.stranger_key)
    with echo_server(credentials=server.credentials()) as port:
        assert _handshake_fails(port, stranger) is grpc.StatusCode.UNAVAILABLE


# --- file checks ----------------------------------------------------------------


def test_missing_file_is_named(pki: PKI, tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    with pytest.raises(ConfigError, match=rf"--tls-cert {missing}: no such file"):
        ServerTLS.from_files(missing, pki.server_key)
    with pytest.raises(ConfigError, match=rf"--tls-key {missing}: no such file"):
        ServerTLS.from_files(pki.server_cert, missing)
    with pytest.raises(ConfigError, match=rf"--tls-client-ca {missing}: no such file"):
        ServerTLS.from_files(pki.server_cert, pki.server_key, client_ca=missing)
    with pytest.raises(ConfigError, match=rf"--tls-ca {missing}: no such file"):
        ClientTLS.from_files(missing)


def test_directory_and_empty_file_are_named(pki: PKI, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"--tls-ca {tmp_path} is a directory"):
        ClientTLS.from_files(tmp_path)
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"\n")
    with pytest.raises(ConfigError, match=rf"--tls-cert {empty} is empty"):
        ServerTLS.from_files(empty, pki.server_key)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_named(pki: PKI, tmp_path: Path) -> None:
    locked = tmp_path / "locked.key"
    locked.write_bytes(pki.server.key_pem)
    locked.chmod(0)
    with pytest.raises(ConfigError, match=rf"--tls-key {locked}: permission denied"):
        ServerTLS.from_files(pki.server_cert, locked)


def test_key_of_another_certificate_is_refused(pki: PKI) -> None:
    with pytest.raises(ConfigError, match=rf"--tls-key {pki.client_key} is not the key of"):
        ServerTLS.from_files(pki.server_cert, pki.client_key)
    with pytest.raises(ConfigError, match="is not the key of --tls-cert"):
        ClientTLS.from_files(pki.ca_path, pki.client_cert, pki.server_key)


def test_swapped_cert_and_key_are_refused(pki: PKI) -> None:
    with pytest.raises(ConfigError, match=rf"--tls-cert {pki.server_key} is not a PEM certificate"):
        ServerTLS.from_files(pki.server_key, pki.server_cert)


def test_der_certificate_is_refused_with_the_conversion_command(pki: PKI, tmp_path: Path) -> None:
    der = tmp_path / "server.der"
    der.write_bytes(pki.server.cert.public_bytes(serialization.Encoding.DER))
    with pytest.raises(ConfigError, match="openssl x509 -inform der"):
        ServerTLS.from_files(der, pki.server_key)


def test_encrypted_key_is_refused_without_prompting(pki: PKI, tmp_path: Path) -> None:
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        pki.server.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"hunter2hunter2"),
        )
    )
    with pytest.raises(ConfigError, match=rf"--tls-key {encrypted} is encrypted"):
        ServerTLS.from_files(pki.server_cert, encrypted)


def test_legacy_encrypted_key_is_refused_without_prompting(pki: PKI, tmp_path: Path) -> None:
    # Traditional OpenSSL format: "BEGIN EC PRIVATE KEY" with a Proc-Type header.
    encrypted = tmp_path / "legacy.key"
    encrypted.write_bytes(
        pki.server.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.BestAvailableEncryption(b"hunter2hunter2"),
        )
    )
    with pytest.raises(ConfigError, match="is encrypted"):
        ServerTLS.from_files(pki.server_cert, encrypted)


def test_garbage_ca_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus-ca.pem"
    bogus.write_bytes(
        b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"
    )
    with pytest.raises(ConfigError, match=rf"--tls-ca {bogus}: OpenSSL cannot load it"):
        ClientTLS.from_files(bogus)
    not_pem = tmp_path / "not-pem.txt"
    not_pem.write_text("hello")
    with pytest.raises(ConfigError, match="is not a PEM CA certificate bundle"):
        ClientTLS.from_files(not_pem)


def test_client_certificate_needs_its_key(pki: PKI) -> None:
    with pytest.raises(ConfigError, match="--tls-cert is given without --tls-key"):
        ClientTLS.from_files(pki.ca_path, cert=pki.client_cert)
    with pytest.raises(ConfigError, match="--tls-key is given without --tls-cert"):
        ClientTLS.from_files(pki.ca_path, key=pki.client_key)
    with pytest.raises(ConfigError, match="needs its key"):
        ClientTLS(certificate_chain=b"cert")


def test_keys_never_appear_in_repr(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key, client_ca=pki.ca_path)
    client = ClientTLS.from_files(pki.ca_path, pki.client_cert, pki.client_key)
    for settings in (server, client):
        text = repr(settings)
        assert "PRIVATE KEY" not in text
        assert "BEGIN" not in text
    assert str(pki.server_cert) in repr(server)


def test_loaded_bytes_are_the_files(pki: PKI) -> None:
    server = ServerTLS.from_files(pki.server_cert, pki.server_key, client_ca=pki.ca_path)
    assert server.certificate_chain == pki.server_cert.read_bytes()
    assert server.private_key == pki.server_key.read_bytes()
    assert server.client_ca == pki.ca_path.read_bytes()
    assert ClientTLS.from_files().root_certificates is None  # the system's CAs
