"""Lost workers: their work goes back to its requests, their streams become orphans.

Determinism survives a loss because seeds come from episode indices and
stream numbers, not from placement: a lost worker's episode units are
re-queued ahead of new indices, and its fragment streams keep their numbers
as orphans, which a worker that can take streams over
(``rlfleet.stream-takeover``) adopts when it joins, or runs as stand-in
windows until then (see the rules in :mod:`rlfleet.scheduling.scheduler`).
"""

from __future__ import annotations

from rlfleet.scheduling.books import Books


class Streams:
    """Which fragment stream numbers are taken, and the orphans of lost workers."""

    def __init__(self) -> None:
        self._next = 0
        self.orphans: list[int] = []  # streams of lost workers, ascending

    def assign(self, num_envs: int, *, takeover: bool) -> tuple[int, ...]:
        """The streams of a new worker, one per slot.

        A worker that can take streams over adopts orphans first; the rest
        are consecutive, from a number never used before.
        """
        adopted: list[int] = []
        if takeover:
            # Busy ones too: their windows in flight finish where they run,
            # and the adopter's own windows skip them until then.
            adopted = self.orphans[:num_envs]
            self.orphans = self.orphans[num_envs:]
        fresh = range(self._next, self._next + num_envs - len(adopted))
        self._next += len(fresh)
        return (*adopted, *fresh)

    def orphan(self, streams: tuple[int, ...]) -> None:
        """Keeps a lost worker's streams for a worker that can take them over."""
        self.orphans = sorted({*self.orphans, *streams})


def lose_worker(books: Books, streams: Streams, worker_id: int, *, keep_streams: bool) -> int:
    """Forgets a lost worker; its outstanding work goes back to its requests.

    Args:
        books: The scheduler's books.
        streams: The stream numbers; with ``keep_streams`` the worker's
            become orphans.
        worker_id: The worker.
        keep_streams: Its fragment streams become orphans, and the windows
            a Sample request still planned on them wait for a taker.
            Otherwise they end.

    Returns:
        The number of episode units re-queued.
    """
    worker = books.workers.pop(worker_id, None)
    if worker is None:
        return 0
    if keep_streams:
        streams.orphan(worker.streams)
    requeued = 0
    for task_id in sorted(worker.tasks):
        task = books.tasks.pop(task_id)
        request = books.requests.get(task.request_id)
        if request is None:
            continue
        request.tasks.discard(task_id)
        requeued += request.lose(task, keep_streams=keep_streams)
    return requeued
