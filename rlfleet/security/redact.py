"""A logging filter that keeps tokens out of log output.

rlfleet never logs a token on purpose (:class:`~rlfleet.security.Token`
prints as ``Token(****)``). This filter is the second line: a library's
debug log, an exception that quotes call metadata, or a user's own log line
might still carry one. It replaces ``Bearer <anything>`` and every
configured token's text with ``****``, in the message, its arguments and
any traceback.

Filters on a logger do not see records of its child loggers, so
:func:`install_redaction` puts the filter on the root logger's handlers,
which every propagated record passes through. The CLI installs it after
configuring logging; an application embedding rlfleet calls it itself.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

from rlfleet.security.tokens import Token

MASK = "****"

# "Bearer" then the credential: anything up to whitespace, a quote or a
# separator that ends a metadata value in a repr.
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s'\",;)\]}]+")


class TokenRedactor(logging.Filter):
    """Redacts bearer credentials and known tokens from log records.

    Args:
        tokens: Tokens whose text must never appear (more can be added
            with :meth:`add`).
    """

    def __init__(self, tokens: Iterable[Token] = ()) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._secrets: tuple[str, ...] = ()
        self.add(*tokens)

    def add(self, *tokens: Token) -> None:
        """Adds tokens to redact."""
        with self._lock:
            known = set(self._secrets) | {token.reveal() for token in tokens}
            # Longest first, so that a token containing another is masked whole.
            self._secrets = tuple(sorted(known, key=len, reverse=True))

    def redact(self, text: str) -> str:
        """``text`` with bearer credentials and known tokens masked."""
        text = _BEARER.sub(lambda match: match.group(1) + MASK, text)
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrites the record in place; never drops it."""
        try:
            message = record.getMessage()
        except Exception:  # bad format arguments: the handler reports those itself
            return True
        redacted = self.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            # Formatters reuse exc_text when set, so the traceback is
            # rendered here once, redacted, instead of later, in clear.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def install_redaction(
    tokens: Iterable[Token] = (), *, logger: logging.Logger | None = None
) -> TokenRedactor:
    """Puts a :class:`TokenRedactor` on every handler of ``logger`` (default: root).

    Call it after logging is configured (handlers added later are not
    covered). Calling it again adds the tokens to the filter already
    installed rather than stacking filters.

    Returns:
        The installed filter.
    """
    target = logger or logging.getLogger()
    tokens = tuple(tokens)
    redactor: TokenRedactor | None = None
    for handler in target.handlers:
        redactor = next((f for f in handler.filters if isinstance(f, TokenRedactor)), redactor)
    if redactor is None:
        redactor = TokenRedactor()
    redactor.add(*tokens)
    for handler in target.handlers:
        if redactor not in handler.filters:
            handler.addFilter(redactor)
    return redactor
