"""Tail moves: unstarted units of a Sample request moved to a worker that ran out.

At a request's tail each worker still runs the queue it holds, and the
faster ones idle until the slowest is done. :class:`TailMoves` evens the
queues out when :class:`~rlfleet.scheduling.units.UnitPlanner` finds no
unit left to hand out (the rules in :mod:`rlfleet.scheduling.scheduler`;
docs/data_plane.md, "A request's tail").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlfleet.scheduling.books import Books, TaskRecord, WorkerLoad
from rlfleet.scheduling.orders import CancelOrder, TaskOrder

if TYPE_CHECKING:  # units imports this module
    from rlfleet.scheduling.units import EpisodeRequest

#: Steps below which units are not moved from a busy worker to one that ran
#: out at a request's tail (:meth:`TailMoves.move`; nor fewer units
#: than the taker's slots, the slice refills deal). A move costs a Cancel to
#: one worker and a Task to the other, about a millisecond of the
#: coordinator's CPU together (the moved units join the taker's live task:
#: no result more); 128 CartPole steps are about 4 ms of a per-env worker's
#: work (30,000 steps/s), so a move of fewer would save little more than it
#: costs. A floor in steps, not seconds: the scheduler keeps no clocks, and
#: for an env whose steps are slow it is a few units, worth moving.
MOVE_MIN_STEPS = 128


class TailMoves:
    """Moves unstarted units of a Sample request at its tail, and counts them.

    Args:
        books: The scheduler's books (tasks are opened there).
        enabled: Whether units move at all (off: :meth:`move` never does).
    """

    def __init__(self, books: Books, *, enabled: bool) -> None:
        self._books = books
        self._enabled = enabled
        #: Cancels of moved units not handed to the caller yet.
        self.cancels: list[CancelOrder] = []
        #: Units moved from one worker to another so far.
        self.moved = 0

    def move(
        self,
        request: EpisodeRequest,
        workers: list[WorkerLoad],
        wanting: list[WorkerLoad],
        mean: float | None,
    ) -> list[TaskOrder]:
        """Moves unstarted units of ``request`` to the workers that want a refill.

        At a request's tail each worker still runs the queue it holds, and
        the faster ones idle until the slowest is done. A worker that wants
        a refill when none is left takes, from the worker with the most
        units of the request not started (:meth:`_unstarted`), the last units
        dealt to it (the least likely to be started: a worker runs its units
        in the order it got them), as many as leave both with the same
        queue per slot, if that is at least a slice of the taker's slots and
        :data:`MOVE_MIN_STEPS`. The busy worker gets a Cancel of them
        (:attr:`cancels`), and a result of its task that still names one is
        ignored (``Scheduler.complete``): only the taker's books them.

        Only Sample requests: a subscription has no tail, and its buffer
        counts its work in flight. Their batch does not depend on who ran a
        unit (its seeds are the unit's), as after a lost worker's units are
        re-run elsewhere.

        Args:
            request: The request with no unit left to hand out.
            workers: The eligible workers.
            wanting: Those of them that want a refill.
            mean: The fleet's running mean episode length (None: unknown,
                and nothing moves).
        """
        if not self._enabled or request.subscription or request.done or mean is None:
            return []
        floor = math.ceil(MOVE_MIN_STEPS / max(mean, 1.0))
        orders = []
        for taker in wanting:
            taker_task = self._books.live_task(taker, request)
            # It just reported (a refill follows a result): nothing finished unsent.
            outstanding = taker_task.units.outstanding if taker_task is not None else 0
            taker_queued = outstanding - taker.slots
            busiest: tuple[int, WorkerLoad, TaskRecord] | None = None
            for worker in workers:
                task = self._books.live_task(worker, request)
                if worker is taker or task is None:
                    continue
                queued = self._unstarted(worker, task, mean)
                if busiest is None or queued > busiest[0]:
                    busiest = (queued, worker, task)
            if busiest is None:
                continue
            queued, giver, giver_task = busiest
            # Both then hold the same queue per slot: they finish together.
            count = (queued * taker.slots - taker_queued * giver.slots) // (
                taker.slots + giver.slots
            )
            count = min(count, queued)
            if count < max(taker.slots, floor):
                continue
            moved = giver_task.units.outstanding_indices()[-count:]
            giver_task.units.take_away(moved)
            giver.units -= count
            self.cancels.append(
                CancelOrder(giver.worker_id, giver_task.task_id, tuple(moved.tolist()))
            )
            units = request.units(moved)
            task = self._books.task_for(taker, request, moved)
            task.units.add(units)
            taker.units += count
            self.moved += count
            orders.append(self._books.order(task, request, units=units))
        return orders

    @staticmethod
    def _unstarted(worker: WorkerLoad, task: TaskRecord, mean: float) -> int:
        """At most about how many of a task's outstanding units its worker has
        not started: not those its slots run, nor those it may have finished
        since its last result (up to one of its largest results' worth).

        Conservative on purpose: a unit it already ran is run again by the
        taker, and a result of the busy worker that names one is ignored
        whole, with every other unit it names run again. Counted in a
        per-env CartPole fleet, subtracting half a result or none moved
        more and cut the workers' last-result gap further, but 3-10% of the
        episodes were then thrown away (docs/data_plane.md, "A request's
        tail")."""
        finished = math.ceil(worker.result_steps / mean)
        return task.units.outstanding - worker.slots - finished
