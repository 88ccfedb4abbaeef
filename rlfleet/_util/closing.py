"""Closing objects that have a ``close()``: ``with obj:``, and closing without raising."""

from __future__ import annotations

import logging
from typing import Protocol, Self


class _Closable(Protocol):
    def close(self) -> None: ...


class ClosesOnExit:
    """Mixin: ``with obj as o:`` gives ``obj`` itself and calls ``obj.close()``
    on the way out, whether the block raised or not (the exception goes on)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self: _Closable, *exc_info: object) -> None:
        self.close()


def close_quietly(obj: _Closable, what: str, logger: logging.Logger) -> None:
    """Closes ``obj``, logging a warning instead of raising: a broken env must
    not stop its worker, nor the closing of the envs after it.

    Args:
        obj: What to close.
        what: What it is, for the warning (e.g. ``"env CartPole-v1"``).
        logger: Where the warning goes.
    """
    try:
        obj.close()
    except Exception as exc:
        logger.warning("closing %s raised %s: %s", what, type(exc).__name__, exc, exc_info=True)
