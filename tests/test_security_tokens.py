"""Tokens: weak ones refused, sources and precedence, never shown, compared in constant time."""

from __future__ import annotations

import hmac
import logging
import os
import pickle
from pathlib import Path

import pytest

from rlfleet.errors import ConfigError
from rlfleet.security import (
    CLIENT_TOKEN,
    COORDINATOR_WORKER_TOKEN,
    MIN_TOKEN_LENGTH,
    Role,
    RoleTokens,
    Token,
    load_token,
    read_token_file,
)

SECRET = "f3c1a9d27be84e06a5c4b1d8e9f70a62"
OTHER = "0b6e1f9c4d2a8e7b3c5f1a0d9e8b7c6a"


# --- weak tokens refused ----------------------------------------------------------


@pytest.mark.parametrize(
    "placeholder", ["CHANGE-ME", "change-me", "changeme", "CHANGE_ME", "CHANGE-ME-0123456789abcdef"]
)
def test_placeholders_are_refused_with_how_to_make_a_real_one(placeholder: str) -> None:
    with pytest.raises(ConfigError, match="placeholder such as CHANGE-ME") as caught:
        Token(placeholder, source="environment variable RLFLEET_WORKER_TOKEN")
    assert "environment variable RLFLEET_WORKER_TOKEN" in str(caught.value)
    assert "openssl rand -hex 32" in str(caught.value)


def test_short_tokens_are_refused_without_showing_them() -> None:
    short = "a1b2c3d4e5f6g7h"  # 15 characters
    assert len(short) == MIN_TOKEN_LENGTH - 1
    with pytest.raises(ConfigError, match="has 15 characters; at least 16") as caught:
        Token(short)
    assert short not in str(caught.value)
    assert Token(short + "8").reveal() == short + "8"  # 16 is enough


@pytest.mark.parametrize(
    "bad", ["has a space in it ok", "tab\tinside-0123456789", "ünïcödé-0123456789"]
)
def test_tokens_metadata_cannot_carry_are_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="printable ASCII") as caught:
        Token(bad)
    assert bad not in str(caught.value)


def test_empty_and_non_text_tokens_are_refused() -> None:
    with pytest.raises(ConfigError, match="is empty"):
        Token("")
    with pytest.raises(ConfigError, match="must be text, got bytes"):
        Token(SECRET.encode())  # type: ignore[arg-type]


# --- never shown ------------------------------------------------------------------


def test_token_never_shows_its_value(caplog: pytest.LogCaptureFixture) -> None:
    token = Token(SECRET, source="--worker-token-file /run/secrets/worker")
    assert repr(token) == str(token) == "Token(****)"
    assert f"{token}" == f"{token!r}" == "Token(****)"
    assert SECRET not in repr([token, {"t": token}])
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("rlfleet.test").info("token %s %r", token, token)
    assert SECRET not in caplog.text
    assert token.reveal() == SECRET
    assert token.source == "--worker-token-file /run/secrets/worker"


def test_token_cannot_be_pickled() -> None:
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(Token(SECRET))


# --- comparison ---------------------------------------------------------------------


def test_matches_uses_hmac_compare_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    token = Token(SECRET)
    assert token.matches(SECRET)
    assert token.matches(SECRET.encode())
    assert not token.matches(OTHER)
    assert not token.matches(SECRET[:-1])
    assert not token.matches("")
    assert len(calls) == 5
    # Digests of equal length are compared, whatever was presented, so the
    # time taken does not depend on the presented length either.
    assert {len(a) for a, _ in calls} == {len(b) for _, b in calls} == {32}


def test_role_of_compares_with_both_tokens_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        nonlocal calls
        calls += 1
        return real(a, b)

    tokens = RoleTokens(Token(SECRET), Token(OTHER))
    monkeypatch.setattr(hmac, "compare_digest", spy)
    assert tokens.role_of(SECRET) is Role.WORKER
    assert tokens.role_of(OTHER) is Role.LEARNER
    assert tokens.role_of("x" * 40) is None
    assert calls == 6


def test_equality_and_hash_follow_the_value() -> None:
    assert Token(SECRET) == Token(SECRET, source="elsewhere")
    assert Token(SECRET) != Token(OTHER)
    assert len({Token(SECRET), Token(SECRET), Token(OTHER)}) == 2
    assert Token(SECRET) != SECRET


# --- role tokens ----------------------------------------------------------------------


def test_role_tokens_must_differ() -> None:
    with pytest.raises(ConfigError, match="are the same; give each role its own token"):
        RoleTokens(Token(SECRET, source="A"), Token(SECRET, source="B"))


def test_role_tokens_are_both_or_neither() -> None:
    assert RoleTokens.of(None, None) is None
    with pytest.raises(ConfigError, match="a worker token is set but no learner token"):
        RoleTokens.of(Token(SECRET), None)
    with pytest.raises(ConfigError, match="a learner token is set but no worker token"):
        RoleTokens.of(None, Token(SECRET))
    both = RoleTokens.of(Token(SECRET), Token(OTHER))
    assert both is not None and both.worker.reveal() == SECRET


# --- loading ----------------------------------------------------------------------------


def test_load_from_env_strips_whitespace() -> None:
    token = load_token(COORDINATOR_WORKER_TOKEN, environ={"RLFLEET_WORKER_TOKEN": f"  {SECRET}\n"})
    assert token is not None and token.reveal() == SECRET
    assert token.source == "environment variable RLFLEET_WORKER_TOKEN"


def test_nothing_set_means_no_token() -> None:
    assert load_token(COORDINATOR_WORKER_TOKEN, environ={}) is None
    assert load_token(COORDINATOR_WORKER_TOKEN, environ={"RLFLEET_WORKER_TOKEN": "  "}) is None


def test_placeholder_from_the_kubernetes_secret_refuses_to_start() -> None:
    with pytest.raises(ConfigError, match="RLFLEET_LEARNER_TOKEN is a placeholder"):
        load_token(CLIENT_TOKEN, environ={"RLFLEET_LEARNER_TOKEN": "CHANGE-ME"})


def test_client_prefers_rlfleet_token_over_the_learner_variable() -> None:
    environ = {"RLFLEET_TOKEN": SECRET, "RLFLEET_LEARNER_TOKEN": OTHER}
    token = load_token(CLIENT_TOKEN, environ=environ)
    assert token is not None and token.reveal() == SECRET
    token = load_token(CLIENT_TOKEN, environ={"RLFLEET_LEARNER_TOKEN": OTHER})
    assert token is not None and token.reveal() == OTHER


def test_flag_wins_over_env_and_warns_about_the_process_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="rlfleet.security"):
        token = load_token(
            COORDINATOR_WORKER_TOKEN, value=SECRET, environ={"RLFLEET_WORKER_TOKEN": OTHER}
        )
    assert token is not None and token.reveal() == SECRET
    assert token.source == "--worker-token"
    assert "process list" in caplog.text
    assert "--worker-token-file" in caplog.text
    assert SECRET not in caplog.text


def test_file_wins_over_env(tmp_path: Path) -> None:
    path = tmp_path / "worker-token"
    path.write_text(SECRET + "\n")
    token = load_token(COORDINATOR_WORKER_TOKEN, file=path, environ={"RLFLEET_WORKER_TOKEN": OTHER})
    assert token is not None and token.reveal() == SECRET
    assert token.source == f"--worker-token-file {path}"


def test_flag_and_file_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--worker-token and --worker-token-file are both given"):
        load_token(COORDINATOR_WORKER_TOKEN, value=SECRET, file=tmp_path / "t", environ={})


def test_a_loaded_token_passes_through() -> None:
    token = Token(SECRET)
    assert load_token(CLIENT_TOKEN, value=token, environ={}) is token


def test_token_file_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ConfigError, match=rf"--token-file {missing}: no such file"):
        read_token_file(missing, flag="--token-file")
    with pytest.raises(ConfigError, match=rf"{tmp_path} is a directory"):
        read_token_file(tmp_path)
    placeholder = tmp_path / "placeholder"
    placeholder.write_text("CHANGE-ME\n")
    with pytest.raises(ConfigError, match=rf"{placeholder} is a placeholder"):
        read_token_file(placeholder)
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe" + SECRET.encode())
    with pytest.raises(ConfigError, match="cannot read it \\(UnicodeDecodeError\\)") as caught:
        read_token_file(binary)
    assert SECRET not in str(caught.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_token_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "locked"
    path.write_text(SECRET)
    path.chmod(0)
    with pytest.raises(ConfigError, match=rf"{path}: permission denied"):
        read_token_file(path)
