"""Log output of the command line: ``--log-level`` and ``--log-format text|json``.

JSON lines (python-json-logger) carry ``timestamp`` (ISO 8601, UTC),
``level``, ``logger`` and ``message``, plus the ids a log call passes in
``extra`` (:data:`CONTEXT_FIELDS`): the coordinator tags requests, tasks and
workers, the worker its tasks and their requests, so one request can be
followed across every process's log. A worker process tags each of its
lines with its name. Token redaction (``rlfleet.security.redact``) runs
before formatting, so JSON lines are redacted too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

#: Ids log calls may pass in ``extra``; JSON lines carry them as fields.
CONTEXT_FIELDS = ("worker", "request_id", "task_id")
#: Text lines: what a terminal reader needs.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _ProcessTag(logging.Filter):
    """Tags every record with a field of the process (a worker's name)."""

    def __init__(self, field: str, value: str | Callable[[], str]) -> None:
        super().__init__()
        self._field, self._value = field, value

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, self._field):
            value = self._value
            setattr(record, self._field, value if isinstance(value, str) else value())
        return True


def configure_logging(level: str, log_format: str) -> None:
    """Sets up the root logger's one handler (stderr) for a command.

    Args:
        level: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``.
        log_format: ``text`` or ``json``.
    """
    logging.basicConfig(level=level, format=TEXT_FORMAT)
    if log_format != "json":
        return
    from pythonjsonlogger.json import JsonFormatter

    formatter = JsonFormatter(
        "{levelname}{name}{message}",
        style="{",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp=True,
    )
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)


def tag_process(field: str, value: str | Callable[[], str]) -> None:
    """Adds ``field=value`` to every later line of this process that lacks it
    (``value()`` at each line, for a value that changes: a worker's name)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_ProcessTag(field, value))
