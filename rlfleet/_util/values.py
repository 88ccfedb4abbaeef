"""Checks of plain values, each done here once: counts, JSON objects, listen addresses.

Every module that takes an int with a lower bound or a JSON object from a
user or the network checks it with these, so the rules and the messages are
the same everywhere. Callers at a boundary re-raise the :class:`ConfigError`
as their own kind (a gRPC status, an argparse error).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from rlfleet.errors import ConfigError

#: How much of a bad JSON text an error quotes.
_QUOTED_CHARS = 200


def check_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Checks that ``value`` is an int (not a bool) in ``[minimum, maximum]``; returns it.

    ``maximum`` is what the protocol field carrying the value can hold
    (e.g. ``2**32 - 1`` for a uint32); None for no upper bound.

    Raises:
        ConfigError: ``"<name> must be an int >= <minimum>, got <value>"``
            (or ``<= <maximum>``).
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be an int <= {maximum}, got {value!r}")
    return int(value)


def json_value(text: str | bytes, where: str) -> Any:
    """Parses JSON text from a user or a peer; empty text is None.

    Args:
        text: The JSON text.
        where: What the text is, for the message (e.g. ``"LeaseCall.value_json"``).

    Raises:
        ConfigError: If the text is not JSON, or nests too deeply to parse
            (``json.loads`` alone raises RecursionError for ``"[[[[..."``).
    """
    if not text:
        return None
    quoted = repr(text[:_QUOTED_CHARS])
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid JSON ({exc}): {quoted}") from None
    except RecursionError:  # "[[[[..." deeper than Python's stack
        raise ConfigError(f"{where} nests too deeply to parse: {quoted}") from None


def json_object(text: str, where: str) -> dict[str, Any]:
    """Parses a JSON object (kwargs and the like); empty text is ``{}``.

    Args:
        text: The JSON text.
        where: What the text is, for the message (e.g. ``"EnvUpdate.kwargs_json"``).

    Raises:
        ConfigError: If the text is not JSON, nests too deeply to parse, or
            is not an object.
    """
    if not text:
        return {}
    value = json_value(text, where)
    if not isinstance(value, dict):
        quoted = repr(text[:_QUOTED_CHARS])
        raise ConfigError(f"{where} must be a JSON object like '{{\"a\": 1}}', got {quoted}")
    return value


def host_and_port(address: str) -> tuple[str, int] | None:
    """``(HOST, PORT)`` of a listen address ``HOST:PORT``, or None if it is not one.

    The host is kept as written (``[::]`` stays bracketed); the port is
    0-65535. Callers raise their own ConfigError, naming their flag.
    """
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        return None
    return host, int(port)
