"""Fragment windows: planning rounds of every stream, and taking lost streams over.

A fragment stream is an env slot that keeps its episode across windows and
requests; it belongs to a worker (``failures`` hands out stream numbers and
keeps lost workers' streams as orphans). :class:`FragmentRequest` counts the
steps a request still expects; :class:`WindowPlanner` plans the windows that
deliver them (see the rules in :mod:`rlfleet.scheduling.scheduler`).
"""

from __future__ import annotations

import itertools
import math

from rlfleet.protocol.modes import Footer
from rlfleet.scheduling.books import Books, RequestState, TaskRecord, WorkerLoad
from rlfleet.scheduling.failures import Streams
from rlfleet.scheduling.orders import RequestSpec, TaskOrder

#: Fragment windows a subscription keeps outstanding per worker: one being
#: stepped and one queued behind it.
SUBSCRIPTION_WINDOWS_PER_WORKER = 2


class FragmentRequest(RequestState):
    """FRAGMENTS requests and subscriptions.

    A fragment stream is an env slot that keeps its episode across windows
    and requests, so fragment work cannot move between workers: a worker
    gets whole windows of all its slots. A Sample request plans rounds so
    that the windows of the workers ready at its start total at least
    ``amount`` steps, and is done when every planned window came back
    (waiting for all of them, not for the first ``amount`` steps, keeps the
    answer independent of which worker is faster). A lost worker's missing
    windows go to workers that can take its streams over; only when none
    can are they made up by extra rounds on other streams, and then the
    answer differs from an undisturbed run.
    """

    def __init__(self, request_id: int, spec: RequestSpec, *, subscription: bool) -> None:
        super().__init__(request_id, spec, subscription=subscription)
        self.fragments = 0
        self.expected_steps = 0  # of windows planned and not received yet
        # Lost workers' planned windows, (streams, rounds), still to hand
        # to workers that can take streams over (counted in expected_steps).
        self.takeovers: list[tuple[tuple[int, ...], int]] = []

    @property
    def done(self) -> bool:
        return (
            not self.subscription
            and self.expected_steps == 0
            and self.accepted_steps >= self.spec.amount
        )

    def drop(self, task: TaskRecord) -> None:
        """Forgets the windows a cancelled task still owed."""
        self.expected_steps -= task.windows_left * task.steps_per_window

    def lose(self, task: TaskRecord, *, keep_streams: bool) -> int:
        """Takes back the windows of a lost worker's task; none are re-queued as units.

        With ``keep_streams``, a Sample request's planned windows wait for a
        worker that can take the streams over (they stay expected);
        otherwise the streams died with the worker, and dispatch plans
        replacement windows.
        """
        left = task.windows_left
        if keep_streams and left and not self.subscription:
            self.takeovers.append((task.streams, left))
        else:
            self.expected_steps -= left * task.steps_per_window
        return 0

    def deficit(self) -> int:
        """Steps that no planned window will deliver."""
        return self.spec.amount - self.accepted_steps - self.expected_steps

    def footer(self) -> Footer:
        """Fragments and steps received, workers used."""
        return Footer(
            self.fragments, self.accepted_steps, len(self.workers_used), self.reassigned_units
        )


# --- planning windows ------------------------------------------------------


class WindowPlanner:
    """Plans fragment windows over the workers' streams.

    Args:
        books: The scheduler's books (tasks are opened there).
        streams: Who owns which stream, and the orphans of lost workers.
    """

    def __init__(self, books: Books, streams: Streams) -> None:
        self._books = books
        self._streams = streams

    def _busy_orphans(self) -> set[int]:
        """Streams taken over that a request still has windows of (planned or running)."""
        busy = {s for t in self._books.tasks.values() if t.takeover for s in t.streams}
        for request in self._books.requests.values():
            if isinstance(request, FragmentRequest):
                busy.update(s for streams, _ in request.takeovers for s in streams)
        return busy

    def dispatch(self, request: FragmentRequest, workers: list[WorkerLoad]) -> list[TaskOrder]:
        """Plans windows of ``request`` on ``workers`` (and takers for orphaned streams)."""
        length = request.spec.fragment_length
        orders = []
        if request.subscription:
            for worker in workers:
                rounds = SUBSCRIPTION_WINDOWS_PER_WORKER - worker.windows
                if rounds <= 0 or not request.has_buffer_room(request.expected_steps):
                    continue
                worker.windows += 1  # one window per task: each can be cancelled alone
                orders.append(self._window_task(request, worker, 1, length))
            return orders
        takers = [w for w in workers if w.takeover]
        if request.takeovers:
            pending, request.takeovers = request.takeovers, []
            for streams, rounds in pending:
                if takers:
                    orders += self._take_over(
                        request, takers, streams, rounds, length, counted=True
                    )
                else:  # nobody can run them: other streams make up their steps
                    request.expected_steps -= rounds * len(streams) * length
        deficit = request.deficit()
        if deficit <= 0:
            return orders
        busy = self._busy_orphans()
        own = {w.worker_id: tuple(s for s in w.streams if s not in busy) for w in workers}
        orphans = self._stand_ins(own) if takers else ()
        steps_per_round = (sum(map(len, own.values())) + len(orphans)) * length
        if not steps_per_round:
            return orders  # every stream is busy elsewhere: wait for those windows
        rounds = math.ceil(deficit / steps_per_round)
        orders += [
            self._window_task(request, worker, rounds, length, streams=own[worker.worker_id])
            for worker in workers
            if own[worker.worker_id]
        ]
        if orphans:
            orders += self._take_over(request, takers, orphans, rounds, length, counted=False)
        return orders

    def _stand_ins(self, own: dict[int, tuple[int, ...]]) -> tuple[int, ...]:
        """Streams no eligible worker runs in a new round: free orphans, and the
        streams of workers that can take streams over but are not ready (one
        that just joined and adopted orphans, or one building an env)."""
        running = {s for t in self._books.tasks.values() if t.is_windows for s in t.streams}
        waiting = [
            s
            for w in self._books.workers.values()
            if w.takeover and w.worker_id not in own
            for s in w.streams
        ]
        return tuple(sorted(s for s in {*self._streams.orphans, *waiting} if s not in running))

    def _take_over(
        self,
        request: FragmentRequest,
        takers: list[WorkerLoad],
        streams: tuple[int, ...],
        rounds: int,
        length: int,
        *,
        counted: bool,
    ) -> list[TaskOrder]:
        """Windows of orphaned streams, in slices of at most a taker's slots, dealt in turn.

        Takers with the fewest tasks come first. ``counted``: the windows'
        steps are in the request's expected steps already (a lost worker's).
        """
        takers = sorted(takers, key=lambda w: (len(w.tasks), w.worker_id))
        orders = []
        position = 0
        for taker in itertools.cycle(takers):
            if position >= len(streams):
                break
            chunk = streams[position : position + taker.num_envs]
            position += len(chunk)
            orders.append(
                self._window_task(
                    request, taker, rounds, length, streams=chunk, takeover=True, counted=counted
                )
            )
        return orders

    def _window_task(
        self,
        request: FragmentRequest,
        worker: WorkerLoad,
        rounds: int,
        length: int,
        *,
        streams: tuple[int, ...] | None = None,
        takeover: bool = False,
        counted: bool = False,
    ) -> TaskOrder:
        task = self._books.new_task(worker, request)
        task.rounds = rounds
        task.streams = worker.streams if streams is None else streams
        task.takeover = takeover
        task.steps_per_window = len(task.streams) * length
        if not counted:
            request.expected_steps += rounds * task.steps_per_window
        return self._books.order(task, request, fragment_length=length, rounds=rounds)

    def record(
        self,
        worker: WorkerLoad,
        task: TaskRecord,
        request: FragmentRequest,
        indices: list[int],
        lengths: list[int],
    ) -> None:
        """Books an accepted window of ``task``: one piece of each of its streams."""
        steps = sum(lengths)
        task.received += 1
        request.fragments += len(indices)
        request.accepted_steps += steps
        request.expected_steps -= task.steps_per_window
        if request.subscription:
            request.buffered_steps += steps
            worker.windows -= 1
        if task.windows_left == 0:
            self._books.retire(task)
