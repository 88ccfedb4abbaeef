"""A worker session's hot path: units handed over, one vector step, the flush decision.

A remote worker's session runs :meth:`SessionStep.step` on its stepping
thread for every vector step of episode units (``rlfleet.worker._session``);
``benchmarks.perenv_session`` runs the same method with a simulated clock
and no connection, so what it measures is what a worker runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.errors import ConfigError, EnvError, PolicyError
from rlfleet.worker._flush import FlushPolicy
from rlfleet.worker._tasks import TaskBook
from rlfleet.worker.vec import VecWorker


@dataclass(slots=True)
class SessionStep:
    """Feeds a VecWorker from its TaskBook, steps it, and says when to send.

    Args:
        book: The session's tasks, handing units to ``vec``.
        vec: The session's VecWorker.
        policy: The session's flush decision.
        on_error: Called with an error the vector step raised (an env past
            its restart budget, a broken policy, a bad config); the step's
            finished episodes are still counted after it.
        clock: Seconds, for the flush timer: ``time.monotonic``, or a
            simulated clock.
        steps_total: Env steps taken by :meth:`step` (and whatever else the
            session adds).
    """

    book: TaskBook
    vec: VecWorker
    policy: FlushPolicy
    on_error: Callable[[Exception], None]
    clock: Callable[[], float] = time.monotonic
    steps_total: int = 0

    def step(self) -> bool:
        """One vector step after handing units over; returns whether to send now.

        The caller sends the finished episodes when it returns True (and
        tells ``policy`` with :meth:`FlushPolicy.sent`).
        """
        vec, book, clock = self.vec, self.book, self.clock
        book.feed()
        started = clock()
        try:
            self.steps_total += vec.step()
        except (EnvError, PolicyError, ConfigError) as exc:
            self.on_error(exc)
        # Steps of the finished episodes: none unless an episode ended (each has one at least).
        finished_steps = vec.finished_steps
        if not finished_steps:
            return False
        now = clock()
        return self.policy.after_step(now, book.queued_units, finished_steps, vec, now - started)
