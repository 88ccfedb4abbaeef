"""Progress deadlines: workers that beat but never finish their units.

Heartbeats prove that a worker's process runs, not that its units advance:
a worker whose env hangs in a C extension on a thread of its own, or a
hostile one, can beat forever while holding units that every request then
waits for. So the coordinator also expects *results*: a worker holding
work must deliver an accepted result within the progress deadline, counted
from when it got work while holding none, or from its last accepted
result. Past it, the worker is dropped and its units run elsewhere.

The deadline is a setting (``--progress-deadline``) or, by default, derived
from what the fleet was seen to do: ``AUTO_FACTOR`` times the longest wait
for a result observed so far (which covers the slowest env step times the
steps a result holds), and never below ``AUTO_FLOOR_SECONDS``. Until a
first result, ``AUTO_INITIAL_SECONDS`` applies.
"""

from __future__ import annotations

from collections.abc import Iterable

#: How many times the longest observed wait for a result the auto deadline allows.
AUTO_FACTOR = 10.0
#: The auto deadline is never shorter than this.
AUTO_FLOOR_SECONDS = 60.0
#: The auto deadline before any result was seen.
AUTO_INITIAL_SECONDS = 600.0


class ProgressWatch:
    """When each busy worker last made progress. Not thread-safe: lock held.

    Args:
        deadline_seconds: A fixed deadline, or None for the auto deadline.
    """

    def __init__(self, deadline_seconds: float | None = None) -> None:
        self._fixed = deadline_seconds
        self._since: dict[int, float] = {}
        self._longest_wait: float | None = None

    @property
    def deadline(self) -> float:
        """Seconds a busy worker may go without delivering a result."""
        if self._fixed is not None:
            return self._fixed
        if self._longest_wait is None:
            return AUTO_INITIAL_SECONDS
        return max(AUTO_FLOOR_SECONDS, AUTO_FACTOR * self._longest_wait)

    def delivered(self, worker_id: int, now: float) -> None:
        """A result of the worker was accepted at ``now``."""
        since = self._since.get(worker_id)
        if since is not None:
            wait = now - since
            if self._longest_wait is None or wait > self._longest_wait:
                self._longest_wait = wait
        self._since[worker_id] = now

    def stalled(self, busy: Iterable[int], now: float) -> list[int]:
        """The workers among ``busy`` (those holding work) past the deadline.

        Workers not in ``busy`` are forgotten: their clock starts again when
        they next hold work.
        """
        busy = set(busy)
        for worker_id in list(self._since):
            if worker_id not in busy:
                del self._since[worker_id]
        for worker_id in busy:
            self._since.setdefault(worker_id, now)
        deadline = self.deadline
        return sorted(w for w in busy if now - self._since[w] > deadline)

    def forget(self, worker_id: int) -> None:
        """The worker is gone."""
        self._since.pop(worker_id, None)
