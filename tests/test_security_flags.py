"""The security flags of the CLI commands, parsed into settings."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from rlfleet.cli._security_flags import (
    add_client_flags,
    add_server_flags,
    learner_options_from_args,
    server_security_from_args,
    worker_security_from_args,
)
from rlfleet.errors import ConfigError
from rlfleet.security import TokenRedactor
from tests.tls_fixtures import make_ca, make_cert

WORKER_SECRET = "a3f1c2d4e5b6a7980f1e2d3c4b5a6978"
LEARNER_SECRET = "b4e2d3c5f6a7b8091e2f3d4c5b6a7988"
ENV = {"RLFLEET_WORKER_TOKEN": WORKER_SECRET, "RLFLEET_LEARNER_TOKEN": LEARNER_SECRET}


def _server_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_flags(parser)
    return parser.parse_args(argv)


def _client_args(*argv: str, worker: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_client_flags(parser, worker=worker)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flags")
    ca = make_ca()
    (root / "ca.crt").write_bytes(ca.cert_pem)
    cert, key = make_cert(ca, "coordinator").write(root, "server")
    client_cert, client_key = make_cert(ca, "worker", client=True).write(root, "client")
    return {
        "ca": root / "ca.crt",
        "cert": cert,
        "key": key,
        "ccert": client_cert,
        "ckey": client_key,
    }


def test_no_flags_no_env_means_an_open_loopback_server() -> None:
    security = server_security_from_args(_server_args(), environ={})
    assert security.tls is None and security.tokens is None and not security.allow_pickle
    assert security.interceptors() == []


def test_server_reads_both_tokens_from_the_kubernetes_env() -> None:
    security = server_security_from_args(_server_args(), environ=ENV)
    assert security.tokens is not None
    assert security.tokens.worker.reveal() == WORKER_SECRET
    assert security.tokens.learner.reveal() == LEARNER_SECRET
    assert len(security.interceptors()) == 1


def test_server_refuses_the_placeholder_secret() -> None:
    environ = {"RLFLEET_WORKER_TOKEN": "CHANGE-ME", "RLFLEET_LEARNER_TOKEN": "CHANGE-ME"}
    with pytest.raises(ConfigError, match="RLFLEET_WORKER_TOKEN is a placeholder"):
        server_security_from_args(_server_args(), environ=environ)


def test_server_tls_and_mtls_flags(files: dict[str, Path]) -> None:
    args = _server_args(
        "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
        "--tls-client-ca", str(files["ca"]),
    )  # fmt: skip
    security = server_security_from_args(args, environ={})
    assert security.tls is not None and security.tls.mutual


def test_server_flag_combinations_that_make_no_sense(files: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        server_security_from_args(_server_args("--tls-cert", str(files["cert"])), environ={})
    with pytest.raises(ConfigError, match=r"--tls-client-ca \(mutual TLS\) needs the server's own"):
        server_security_from_args(_server_args("--tls-client-ca", str(files["ca"])), environ={})
    with pytest.raises(ConfigError, match="without TLS and a token"):
        server_security_from_args(_server_args("--allow-pickle"), environ={})
    with pytest.raises(ConfigError, match="without TLS:"):
        server_security_from_args(_server_args("--allow-pickle"), environ=ENV)


def test_server_allow_pickle_with_tls_and_tokens(files: dict[str, Path], tmp_path: Path) -> None:
    learner_file = tmp_path / "learner"
    learner_file.write_text(LEARNER_SECRET)
    args = _server_args(
        "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
        "--learner-token-file", str(learner_file), "--allow-pickle",
    )  # fmt: skip
    security = server_security_from_args(args, environ={"RLFLEET_WORKER_TOKEN": WORKER_SECRET})
    assert security.pickle.allowed


def test_worker_flags(files: dict[str, Path]) -> None:
    args = _client_args(
        "--tls-ca", str(files["ca"]), "--tls-cert", str(files["ccert"]),
        "--tls-key", str(files["ckey"]), "--allow-pickle", worker=True,
    )  # fmt: skip
    security = worker_security_from_args(args, environ=ENV)
    assert security.tls is not None and security.tls.mutual
    assert security.token is not None and security.token.reveal() == WORKER_SECRET
    assert args.allow_pickle


def test_worker_allow_pickle_needs_tls_and_token() -> None:
    args = _client_args("--allow-pickle", worker=True)
    with pytest.raises(ConfigError, match="the worker was started with --allow-pickle"):
        worker_security_from_args(args, environ=ENV)


def test_learner_flags_and_env(files: dict[str, Path]) -> None:
    args = _client_args(worker=False)
    assert not hasattr(args, "allow_pickle")
    options = learner_options_from_args(args, environ=ENV)
    assert options["token"] is not None and options["token"].reveal() == LEARNER_SECRET
    assert options["tls_ca"] is None
    args = _client_args("--tls-ca", str(files["ca"]), "--tls-server-name", "x", worker=False)
    options = learner_options_from_args(args, environ={"RLFLEET_TOKEN": WORKER_SECRET})
    assert options["tls_ca"] == str(files["ca"]) and options["tls_server_name"] == "x"
    assert options["token"].reveal() == WORKER_SECRET


def test_worker_key_without_cert_is_refused(files: dict[str, Path]) -> None:
    args = _client_args("--tls-key", str(files["ckey"]), worker=True)
    with pytest.raises(ConfigError, match="--tls-key is given without --tls-cert"):
        worker_security_from_args(args, environ={})


def test_loaded_tokens_are_registered_with_the_redactor() -> None:
    handler = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        server_security_from_args(_server_args(), environ=ENV)
        redactor = next(f for f in handler.filters if isinstance(f, TokenRedactor))
        assert redactor.redact(f"{WORKER_SECRET}/{LEARNER_SECRET}") == "****/****"
    finally:
        root.removeHandler(handler)


def test_help_never_shows_token_values(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    parser = argparse.ArgumentParser()
    add_server_flags(parser)
    parser.print_help()
    text = capsys.readouterr().out
    assert "--worker-token-file" in text and "RLFLEET_WORKER_TOKEN" in text
    assert WORKER_SECRET not in text and LEARNER_SECRET not in text
