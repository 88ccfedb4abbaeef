"""``with obj:`` for objects that have a ``close()``: the one place it is written."""

from __future__ import annotations

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
