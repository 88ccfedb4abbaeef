"""The log redactor: bearer credentials and known tokens never reach log output."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from rlfleet.security import Token, TokenRedactor, install_redaction

SECRET = "9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a"


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger writing to a string through one handler, detached from root."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("rlfleet.test.redact")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    yield log, stream
    log.removeHandler(handler)
    log.propagate = True


def test_redact_masks_bearer_credentials_and_known_tokens() -> None:
    redactor = TokenRedactor([Token(SECRET)])
    assert redactor.redact("authorization: Bearer abc.def-123") == "authorization: Bearer ****"
    assert (
        redactor.redact("(('authorization', 'bearer xyz'),)")
        == "(('authorization', 'bearer ****'),)"
    )
    assert redactor.redact(f"token={SECRET} again {SECRET}") == "token=**** again ****"
    assert redactor.redact("nothing to hide") == "nothing to hide"


def test_filter_redacts_message_arguments_and_tracebacks(
    logger: tuple[logging.Logger, io.StringIO],
) -> None:
    log, stream = logger
    install_redaction([Token(SECRET)], logger=log)
    log.info("metadata %s", [("authorization", f"Bearer {SECRET}")])
    log.info("plain %s", SECRET)
    try:
        raise RuntimeError(f"call failed with token {SECRET}")
    except RuntimeError:
        log.exception("boom")
    text = stream.getvalue()
    assert SECRET not in text
    assert "plain ****" in text
    assert "RuntimeError: call failed with token ****" in text
    assert "Traceback" in text


def test_install_twice_extends_one_filter(logger: tuple[logging.Logger, io.StringIO]) -> None:
    log, stream = logger
    other = "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d"
    first = install_redaction([Token(SECRET)], logger=log)
    second = install_redaction([Token(other)], logger=log)
    assert first is second
    assert sum(isinstance(f, TokenRedactor) for f in log.handlers[0].filters) == 1
    log.warning("%s and %s", SECRET, other)
    assert stream.getvalue() == "WARNING **** and ****\n"


def test_bad_format_arguments_do_not_break_logging(
    logger: tuple[logging.Logger, io.StringIO],
) -> None:
    log, _ = logger
    install_redaction(logger=log)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "%d", ("not a number",), None)
    assert TokenRedactor().filter(record) is True
    assert record.args == ("not a number",)  # left for the handler to report
