"""Log lines limited: one per interval (what a peer can trigger at will), or one per key."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LogLimiter:
    """Lets one line through per interval and counts the ones held back.

    A peer hammering a port (bad tokens, streams that never say Hello) must
    not flood the logs: the line that gets through says how many were held
    back since the previous one.

    Args:
        interval_seconds: Least time between two lines.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self, interval_seconds: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval_seconds = interval_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._next = float("-inf")
        self._held_back = 0

    def admit(self) -> int | None:
        """None if the line must be held back, else how many were held back before it."""
        now = self._clock()
        with self._lock:
            if now < self._next:
                self._held_back += 1
                return None
            held_back, self._held_back = self._held_back, 0
            self._next = now + self.interval_seconds
        return held_back


def held_back_note(held_back: int, what: str) -> str:
    """`` (N more <what> since the last report)``, or "" for none."""
    return f" ({held_back} more {what} since the last report)" if held_back else ""


class OncePerKey:
    """Says yes the first time it is asked about a key, for the process's lifetime.

    For warnings worth one line per address, env info key or target, however
    often their cause recurs. Safe to call from any thread.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        """True if ``key`` was never asked about before (and records it)."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        return True
