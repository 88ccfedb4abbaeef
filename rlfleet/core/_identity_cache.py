"""Values derived from objects that cannot be hashed, keyed by identity.

Gymnasium spaces and numpy bound arrays are unhashable, yet a fleet checks
every batch against the same few of them: their derived forms (accepted
shapes, bounds, a bound repeated for wide comparisons) are worked out once
per object.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityCache(Generic[V]):
    """``compute()``'s value per (object, extra key), by the object's identity.

    Each entry holds its object, so the object's ``id`` cannot be reused by
    another while it is cached; past ``limit`` entries the cache starts over
    (a fleet uses a handful of spaces; a caller making new ones forever
    must not grow it).

    Args:
        limit: Most entries kept.
    """

    def __init__(self, limit: int = 64) -> None:
        self._limit = limit
        self._entries: dict[tuple[int, Hashable], tuple[object, V]] = {}

    def get(self, obj: object, extra: Hashable, compute: Callable[[], V]) -> V:
        """The cached value for ``(obj, extra)``, computed by ``compute`` when missing."""
        key = (id(obj), extra)
        cached = self._entries.get(key)
        if cached is not None and cached[0] is obj:
            return cached[1]
        value = compute()
        if len(self._entries) > self._limit:
            self._entries.clear()
        self._entries[key] = (obj, value)
        return value
