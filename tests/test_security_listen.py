"""Listening safely: loopback by default, one loud warning when exposed."""

from __future__ import annotations

import logging

import pytest

from rlfleet.security import DEFAULT_HOST, is_loopback, warn_if_exposed
from rlfleet.security.listen import exposure_warning, plaintext_token_warning


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.8.9.10:1", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("::1", True),
        ("unix:/run/rlfleet.sock", True),
        ("dns:///localhost:50051", True),
        ("ipv4:127.0.0.1:50051", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        ("10.0.0.7:50051", False),
        ("rlfleet-coordinator.rlfleet.svc.cluster.local:50051", False),
        ("dns:///example.com:443", False),
        ("localhost.evil.example:50051", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_default_host_is_loopback() -> None:
    assert is_loopback(f"{DEFAULT_HOST}:50051")


def test_no_warning_on_loopback_or_when_fully_protected() -> None:
    assert exposure_warning("127.0.0.1:50051", tls=False, authenticated=False) is None
    assert exposure_warning("0.0.0.0:50051", tls=True, authenticated=True) is None


def test_exposed_plaintext_without_tokens_says_what_anyone_can_do() -> None:
    message = exposure_warning("0.0.0.0:50051", tls=False, authenticated=False)
    assert message is not None
    assert message.startswith("SECURITY: the coordinator listens on 0.0.0.0:50051")
    assert "without TLS (--tls-cert/--tls-key) and without tokens" in message
    assert "anyone who can reach this port can join as a worker" in message
    assert "in plaintext" in message
    assert "\n" not in message  # one paragraph


def test_exposed_with_tokens_but_no_tls_warns_about_the_tokens() -> None:
    message = exposure_warning("[::]:50051", tls=False, authenticated=True)
    assert message is not None
    assert "and the tokens themselves" in message
    assert "anyone who can reach" not in message


def test_exposed_with_tls_but_no_tokens_warns_about_access() -> None:
    message = exposure_warning("10.0.0.7:50051", tls=True, authenticated=False)
    assert message is not None
    assert "without tokens" in message
    assert "plaintext" not in message


def test_warn_if_exposed_logs_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="rlfleet.security"):
        assert warn_if_exposed("0.0.0.0:50051", tls=False, authenticated=False)
        assert not warn_if_exposed("127.0.0.1:50051", tls=False, authenticated=False)
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_plaintext_token_warning() -> None:
    assert plaintext_token_warning("127.0.0.1:50051") is None
    message = plaintext_token_warning("10.0.0.7:50051")
    assert message is not None and "without TLS" in message
