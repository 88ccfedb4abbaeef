"""The coordinator's scheduling state machine: pure Python, no gRPC, no threads.

The scheduler decides which worker runs which episode, and when a learner
request is complete. It knows nothing about sockets, protobuf or clocks: the
coordinator feeds it events (a worker joined, became ready, was lost; a
result arrived; a subscriber consumed steps) under its lock and sends the
orders it returns (:class:`TaskOrder`, :class:`CancelOrder`). That keeps the
rules below unit-testable and the threading in one place.

The rules, and why:

* Determinism comes from seeds, not from placement. Episode ``k`` of a
  request always gets ``episode_seeds(seed, request_index, k)``, whichever
  worker runs it, so units can be handed out dynamically (fast workers take
  more) and re-run elsewhere after a loss without changing the answer.
* A worker holds about ``capacity_steps`` steps of work (units running,
  queued, or finished and not reported yet), sized with the fleet's running
  mean episode length and never below ``num_envs * (1 + prefetch_factor)``
  units, nor below a unit per slot and five of its largest results. Enough
  that it reports many episodes per message (each result costs the
  coordinator and the learner about a millisecond of CPU: one per episode
  cost the fleet 3x its throughput), and that a refill's round trip ends
  before its queue runs dry: a refill only follows a result, so when one is
  booked the worker must still hold two results' worth not started. The
  three beyond those make a refill span several results: a Task message
  per result cost the coordinator 250-300 us of gRPC CPU with large results.
* Refills come in batches: a worker is topped up to capacity once its
  spare units fall to half, or to two of its results if that is more, so
  one Task carries many units instead of one per finished episode. Every
  idle env slot is filled before any worker gets spare units, and spare
  units are dealt round-robin in slices of ``num_envs``, so that every
  worker works near the front of the request (the prefix rule below waits
  for the lowest indices) and no slot idles while another worker hoards.
* A refill joins the worker's live task of the request (the Task message
  names a task id the worker holds): a worker sends one result per task
  at each flush, and a new task per refill split most of its flushes in
  two. A worker thus holds one task per request; which units it runs is
  unchanged, so neither the answer nor the balance depends on it.
* A lost worker's units go back to a min-heap of the request, ahead of new
  indices; the answer stays the same, only later.
* STEPS requests end on a *prefix* rule: the answer is episodes ``0..m``
  with the smallest ``m`` whose lengths reach ``amount``. Units keep being
  generated while the completed episodes are short of ``amount``, but no
  more than the running average length says are still needed, so a fast
  fleet does not run many surplus episodes that are thrown away.
  Surplus units are cancelled when the answer is known; as workers run
  their units in index order, those are mostly units not started yet.
* Leased envs (step-level env leases) share a worker's env slots with
  sampling: a worker hosting ``L`` leased envs of its ``num_envs`` gets
  units for ``num_envs - L`` slots (its capacity shrinks in proportion), none
  once all are leased, and no fragment windows (a window runs all of a
  worker's slots), so sampling and leases never oversubscribe it.
* Only one Sample request runs at a time (the coordinator queues them) and
  it has priority: subscriptions get units only while no Sample runs.
* Subscriptions are bounded in steps: the steps accepted and not yet sent
  to the subscriber, plus the steps the units and windows in flight are
  expected to bring, stay below ``max_buffered_steps``. Work in flight
  counts because it is as old as what is buffered: after an agent update,
  a learner still receives all of it from the previous version.
* Every unit completes at most once: a result is accepted only for units
  still outstanding on the worker that sends it.
* At a Sample request's tail (no unit left to hand out), a worker that
  wants a refill takes unstarted units from the worker with the most
  queued: the last ones dealt to it, as many as leave both with the same
  queue per slot, if worth a round trip (``TailMoves.move``). The
  busy worker gets a Cancel of them; a result of it that still names one
  (sent before the Cancel arrived) is ignored whole, and the units of its
  task it names besides go back to the request, so each unit is booked
  once, from the worker that holds it now. A unit never returns to a task
  it was taken from: it goes to a new task of that worker. Only episode
  units of Sample requests move; their seeds make the batch the same
  whoever runs them. Only with ``move_units`` (the coordinator's
  ``--tail-moves``, on by default; LocalSampler's scheduler moves none).
* Fragment streams belong to workers. A lost worker's streams become
  orphans, not renumbered: its windows still planned in a Sample request,
  and every orphan's windows in later Sample requests, go to workers that
  can take streams over (``rlfleet.stream-takeover``) and rebuild their
  episodes from replays, so the answer is the one the lost worker would
  have given. A new worker that can take streams over adopts orphans
  first; until it is ready, others run its streams too, so every answer
  covers every stream.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Sequence
from dataclasses import replace

import numpy as np

from rlfleet._util.prebuilt import prebuilt
from rlfleet.errors import InternalError, InvalidValueError
from rlfleet.protocol.modes import Footer, Mode
from rlfleet.protocol.unit_columns import EMPTY_UNITS, UnitColumns
from rlfleet.scheduling.books import Books, RequestState, WorkerLoad
from rlfleet.scheduling.failures import Streams, lose_worker
from rlfleet.scheduling.orders import (
    CancelOrder,
    RequestSpec,
    ResultRuling,
    TaskOrder,
    Unit,
    Verdict,
)
from rlfleet.scheduling.units import (
    DEFAULT_CAPACITY_STEPS,
    DEFAULT_PREFETCH_FACTOR,
    EpisodeRequest,
    MeanLength,
    UnitPlanner,
)
from rlfleet.scheduling.windows import (
    SUBSCRIPTION_WINDOWS_PER_WORKER,
    FragmentRequest,
    WindowPlanner,
)

#: A ``(task id, episode indices, ...)`` result's task id, and its indices
#: (taken by ``map``: no frame per result, as a comprehension's).
_task_of = operator.itemgetter(0)
_held_of = operator.itemgetter(1)

#: ACCEPT rulings kept (two per live request: done or not); past it the
#: least recently used are made again when asked for.
_ACCEPTED_KEPT = 256

__all__ = [
    "DEFAULT_CAPACITY_STEPS",
    "DEFAULT_PREFETCH_FACTOR",
    "SUBSCRIPTION_WINDOWS_PER_WORKER",
    "CancelOrder",
    "RequestSpec",
    "ResultRuling",
    "Scheduler",
    "TaskOrder",
    "Unit",
    "Verdict",
]


class Scheduler:
    """Hands out units to workers and decides when requests are complete.

    Not thread-safe: the coordinator calls it under its lock.

    Args:
        prefetch_factor: Units a worker may hold beyond its env slots, per
            slot, whatever the episode length: the floor of its capacity,
            ``num_envs * (1 + prefetch_factor)`` units.
        capacity_steps: Steps of work a worker may hold, converted to units
            with the running mean episode length (0: the floor only).
        move_units: At a Sample request's tail, move unstarted units from
            the busiest worker to one that runs out (see the rules); the
            caller sends :meth:`take_cancels` with the orders of
            :meth:`dispatch`.
    """

    def __init__(
        self,
        *,
        prefetch_factor: int = DEFAULT_PREFETCH_FACTOR,
        capacity_steps: int = DEFAULT_CAPACITY_STEPS,
        move_units: bool = False,
    ) -> None:
        self._books = Books()
        self._units = UnitPlanner(
            self._books,
            prefetch_factor=prefetch_factor,
            capacity_steps=capacity_steps,
            move_units=move_units,
        )
        self._streams = Streams()
        self._windows = WindowPlanner(self._books, self._streams)
        self._sample: RequestState | None = None
        self._subscriptions: list[RequestState] = []
        self._request_ids = itertools.count(1)

    # --- workers -----------------------------------------------------------

    def add_worker(
        self, worker_id: int, num_envs: int, *, takeover: bool = False
    ) -> tuple[int, ...]:
        """Registers a worker; it gets no work until :meth:`set_eligible`.

        Args:
            worker_id: Its id.
            num_envs: Its env slots.
            takeover: It runs the streams a task names (it declared
                ``rlfleet.stream-takeover``): it adopts orphaned
                streams first, and takes over lost workers' streams.

        Returns:
            Its fragment streams, one per slot. Without ``takeover`` they
            are consecutive, from a number never used before.
        """
        if num_envs < 1:
            raise InvalidValueError(f"worker {worker_id}: num_envs must be >= 1, got {num_envs}")
        if worker_id in self._books.workers:
            raise InvalidValueError(f"worker {worker_id} is already registered")
        streams = self._streams.assign(num_envs, takeover=takeover)
        floor = self._units.min_capacity(num_envs)
        self._books.workers[worker_id] = WorkerLoad(
            worker_id, num_envs, floor, streams=streams, takeover=takeover
        )
        return streams

    @property
    def orphaned_streams(self) -> tuple[int, ...]:
        """Streams of lost workers that no worker has adopted."""
        return tuple(self._streams.orphans)

    def task_streams(self, task_id: int) -> tuple[int, ...]:
        """The streams a live fragment task runs (empty once it is retired)."""
        task = self._books.tasks.get(task_id)
        return () if task is None else task.streams

    def set_leased(self, worker_id: int, leased: int) -> None:
        """How many of the worker's env slots leased envs hold now (see the rules)."""
        worker = self._books.workers.get(worker_id)
        if worker is not None:
            worker.set_leased(leased)

    def set_eligible(self, worker_id: int, eligible: bool) -> None:
        """Whether the worker may get new work (ready in the current state, not leaving)."""
        self._books.workers[worker_id].set_eligible(eligible)

    def remove_worker(self, worker_id: int, *, keep_streams: bool = False) -> int:
        """Forgets a lost worker; its outstanding units go back to their requests.

        Args:
            worker_id: The worker.
            keep_streams: Its fragment streams become orphans, and the
                windows a Sample request still planned on them are handed
                to workers that can take them over. Otherwise they end.

        Returns:
            The number of episode units re-queued.
        """
        self._units.forget(worker_id)
        return lose_worker(self._books, self._streams, worker_id, keep_streams=keep_streams)

    def units_in_flight(self, worker_id: int) -> int:
        """Episode units and fragment windows the worker holds."""
        worker = self._books.workers.get(worker_id)
        if worker is None:
            return 0
        return worker.units + sum(self._books.tasks[t].windows_left for t in worker.tasks)

    @property
    def eligible_workers(self) -> int:
        """Workers that may get work now."""
        return sum(1 for worker in self._books.workers.values() if worker.eligible)

    @property
    def mean_episode_length(self) -> float | None:
        """The fleet's running mean episode length (None before any episode)."""
        return self._units.mean_length.value

    def capacity(self, worker_id: int) -> int:
        """Episode units the worker may hold now."""
        return self._units.capacity(self._books.workers[worker_id])

    # --- requests -----------------------------------------------------------

    def start_sample(self, spec: RequestSpec) -> int:
        """Starts the (single) Sample request; returns its id.

        Raises:
            InvalidValueError: If a Sample request is already running (the
                coordinator serialises them) or the spec is invalid.
        """
        if self._sample is not None:
            raise InvalidValueError(f"request {self._sample.request_id} is still running")
        _check_spec(spec, subscription=False)
        request = self._new_request(spec, subscription=False)
        self._sample = request
        return request.request_id

    def start_subscription(self, spec: RequestSpec) -> int:
        """Starts a subscription (EPISODES or FRAGMENTS); returns its id."""
        _check_spec(spec, subscription=True)
        request = self._new_request(spec, subscription=True)
        self._subscriptions.append(request)
        return request.request_id

    def _new_request(self, spec: RequestSpec, *, subscription: bool) -> RequestState:
        request_id = next(self._request_ids)
        request: RequestState
        if spec.mode is Mode.FRAGMENTS:
            request = FragmentRequest(request_id, spec, subscription=subscription)
        else:
            request = EpisodeRequest(request_id, spec, subscription=subscription)
        self._books.requests[request_id] = request
        return request

    def request_spec(self, request_id: int) -> RequestSpec:
        """The spec of a live request (its env generation follows env updates)."""
        return self._books.requests[request_id].spec

    def request_of_task(self, task_id: int) -> int | None:
        """The request a live task serves, or None once the task is retired."""
        task = self._books.tasks.get(task_id)
        return None if task is None else task.request_id

    def expectation_inputs(
        self, request_id: int, task_id: int
    ) -> tuple[RequestSpec, UnitColumns, tuple[int, ...]]:
        """What a result's expectation is made of, in one call: the request's
        spec (:meth:`request_spec`), the task's units (:meth:`unit_seeds`)
        and its streams (:meth:`task_streams`)."""
        spec = self._books.requests[request_id].spec
        task = self._books.tasks.get(task_id)
        if task is None:
            return spec, EMPTY_UNITS, ()
        return spec, task.units.given, task.streams

    def unit_seeds(self, task_id: int) -> UnitColumns:
        """Every unit given to a live episode task, with its seeds, ascending by index.

        Kept from dispatch, so checking a result's seeds derives none again;
        a snapshot, which later refills leave as it is (results are checked
        outside the coordinator's lock). Empty for fragment tasks and
        retired tasks.
        """
        task = self._books.tasks.get(task_id)
        return EMPTY_UNITS if task is None else task.units.given

    def footer(self, request_id: int) -> Footer:
        """The footer of a done request."""
        return self._books.requests[request_id].footer()

    def finish(self, request_id: int) -> list[CancelOrder]:
        """Ends a request (done, failed or cancelled by the learner).

        Returns:
            Cancels for its units still on workers; their late results are
            ignored from now on.
        """
        request = self._books.requests.pop(request_id, None)
        if request is None:
            return []
        if self._sample is request:
            self._sample = None
        if request in self._subscriptions:
            self._subscriptions.remove(request)
        cancels = [
            self._books.cancel(self._books.tasks[task_id], request)
            for task_id in sorted(request.tasks)
        ]
        request.tasks.clear()
        return cancels

    def set_env_generation(self, generation: int) -> list[CancelOrder]:
        """Moves subscriptions to a new env generation.

        Their outstanding work was for the old env: it is cancelled and
        episode units are re-queued, to be run again in the new env. The
        running mean episode length starts over.

        Returns:
            Cancels for the work on workers.
        """
        self._units.mean_length = MeanLength()  # the old env's lengths say nothing of the new
        for worker in self._books.workers.values():
            worker.result_steps = 0  # nor its results' sizes (steps of another size)
        cancels: list[CancelOrder] = []
        for request in self._subscriptions:
            request.spec = replace(request.spec, env_generation=generation)
            for task_id in sorted(request.tasks):
                task = self._books.tasks[task_id]
                if isinstance(request, EpisodeRequest):
                    request.requeue(task.units.outstanding_indices(), lost=False)
                cancels.append(self._books.cancel(task, request))
            request.tasks.clear()
        return cancels

    def consumed(self, request_id: int, steps: int) -> None:
        """A subscriber was sent ``steps`` buffered steps (frees buffer room)."""
        request = self._books.requests.get(request_id)
        if request is not None:
            request.buffered_steps -= steps

    # --- dispatch -----------------------------------------------------------

    def dispatch(self) -> list[TaskOrder]:
        """Hands out work to eligible workers with free capacity.

        Call after every event that may free capacity or create work.
        """
        request = self._sample
        if request is not None:
            if isinstance(request, EpisodeRequest):
                # The common look after a result: no worker that may be given
                # units wants a refill (one call; no sorted list of the
                # eligible ones made). Past it the planner looks once more,
                # exactly, and only over those.
                if self._units.surely_full(self._books.workers.values()):
                    return []
                return self._dispatch_request(request, looked=True)
            return self._dispatch_request(request)
        orders: list[TaskOrder] = []
        # Rotate so that no subscription starves the others of free slots.
        for request in list(self._subscriptions):
            orders.extend(self._dispatch_request(request))
        if self._subscriptions:
            self._subscriptions.append(self._subscriptions.pop(0))
        return orders

    def take_cancels(self) -> list[CancelOrder]:
        """Cancels of units :meth:`dispatch` moved to other workers, not taken yet."""
        cancels, self._units.moves.cancels = self._units.moves.cancels, []
        return cancels

    @property
    def moved_units(self) -> int:
        """Units moved from one worker to another at requests' tails so far."""
        return self._units.moves.moved

    def _dispatch_request(self, request: RequestState, *, looked: bool = False) -> list[TaskOrder]:
        ordered = sorted(self._books.workers.items())
        if isinstance(request, EpisodeRequest):
            workers = [w for _, w in ordered if w.takes_units]
            return self._units.dispatch(request, workers, looked=looked) if workers else []
        if isinstance(request, FragmentRequest):
            workers = [w for _, w in ordered if w.eligible and not w.leased]
            return self._windows.dispatch(request, workers) if workers else []
        raise InternalError(f"unknown request type {type(request).__name__}")

    # --- results --------------------------------------------------------------

    def classify(
        self, worker_id: int, task_id: int, episode_indices: Iterable[int]
    ) -> ResultRuling:
        """Judges a result without changing any state.

        The coordinator calls this before decoding a result (no need to
        check a batch it will drop) and :meth:`complete` after.
        """
        return self._judge(worker_id, task_id, _int64(episode_indices))[0]

    def classify_many(
        self, worker_id: int, results: Sequence[tuple[int, Iterable[int]]]
    ) -> list[ResultRuling]:
        """Judges results of one worker, given as ``(task id, episode indices)``,
        each as :meth:`classify` would now, without changing any state.

        The results of one episode task are judged together in one call over
        their indices (``TaskUnits.all_outstanding``: a header's tuples, no
        array made); only if one of them is not wholly outstanding, repeats
        an episode of another or holds its indices in another form is each
        judged alone. The caller books them in order with
        :meth:`complete_many` (or :meth:`complete`), which judges each again
        after those before it.
        """
        if results:
            # The common batch: one task's results, every episode outstanding.
            task = self._books.tasks.get(results[0][0])
            if (
                task is not None
                and task.worker_id == worker_id
                and not task.rounds  # not is_windows, without the property's frame
                and all(map(task.task_id.__eq__, map(_task_of, results)))  # no frame per result
                and task.units.all_outstanding(list(map(_held_of, results)))
            ):
                request = self._books.requests[task.request_id]
                return [_accepted(request.request_id, request.subscription, False)] * len(results)
        groups: dict[int, list[int]] = {}
        for position, (task_id, _) in enumerate(results):
            groups.setdefault(task_id, []).append(position)
        rulings: list[ResultRuling | None] = [None] * len(results)
        for task_id, members in groups.items():
            task = self._books.tasks.get(task_id)
            if (
                task is not None
                and task.worker_id == worker_id
                and not task.is_windows
                and task.units.all_outstanding([results[m][1] for m in members])
            ):
                request = self._books.requests[task.request_id]
                ruling = _accepted(request.request_id, request.subscription, False)
                for m in members:
                    rulings[m] = ruling
                continue
            for m in members:
                rulings[m] = self._judge(worker_id, task_id, _int64(results[m][1]))[0]
        return [r for r in rulings if r is not None]

    def _judge(
        self, worker_id: int, task_id: int, indices: np.ndarray
    ) -> tuple[ResultRuling, np.ndarray | None]:
        """:meth:`classify`, and where an episode task holds the result's units."""
        task = self._books.tasks.get(task_id)
        if task is None:
            if 0 < task_id <= self._books.last_task_id:
                # Retired: its request ended or its units were cancelled.
                return ResultRuling(Verdict.IGNORE, reason=f"task {task_id} is over"), None
            return ResultRuling(Verdict.REJECT, reason=f"task {task_id} was never sent"), None
        request = self._books.requests[task.request_id]

        def outcome(
            verdict: Verdict, reason: str = "", positions: np.ndarray | None = None
        ) -> tuple[ResultRuling, np.ndarray | None]:
            ruling = ResultRuling(
                verdict, request.request_id, reason, subscription=request.subscription
            )
            return ruling, positions

        if task.worker_id != worker_id:
            return outcome(Verdict.REJECT, f"task {task_id} belongs to another worker")
        if not indices.size:
            return outcome(Verdict.REJECT, "a result must hold at least one episode")
        if task.is_windows:
            return outcome(Verdict.ACCEPT)  # every window is a new piece of its streams
        taken = task.units.taken_in(indices)
        if taken.size:
            # Sent before the Cancel of units moved to another worker reached
            # it: those are the other worker's to complete, so none of the
            # result is booked (complete() re-queues the rest it names).
            rest = indices[~np.isin(indices, taken)]
            problem = task.units.check(rest, task_id)[0] if rest.size else ""
            if problem:
                return outcome(Verdict.REJECT, problem)
            shown = taken[:5].tolist()
            return outcome(
                Verdict.IGNORE, f"episodes {shown} of task {task_id} moved to another worker"
            )
        problem, positions = task.units.check(indices, task_id)
        return (
            outcome(Verdict.REJECT, problem) if problem else outcome(Verdict.ACCEPT, "", positions)
        )

    def complete_many(
        self, worker_id: int, results: Sequence[tuple[int, Iterable[int], Iterable[int]]]
    ) -> list[ResultRuling]:
        """Records results given as ``(task id, episode indices, lengths)``, in
        order, as :meth:`complete` one after the other would.

        A result of an episode task whose episodes are all outstanding, none
        twice, given as a header's tuples of ints, is found and marked back
        in one call (``TaskUnits.take_back``: it was judged before it was
        checked, so it is not judged again); anything else by :meth:`complete`.

        Returns:
            The rulings of the first results, up to the first that is
            rejected or completes its request (the caller finishes it, then
            passes the rest again: they are judged after that).
        """
        rulings: list[ResultRuling] = []
        for task_id, indices, lengths in results:
            task = self._books.tasks.get(task_id)
            # not task.is_windows, without the property's frame
            if task is not None and task.worker_id == worker_id and not task.rounds:
                request = self._books.requests[task.request_id]
                if isinstance(request, EpisodeRequest) and task.units.take_back(indices, lengths):
                    request.workers_used.add(worker_id)
                    worker = self._books.workers[worker_id]
                    # take_back took them: tuples or lists of ints.
                    held: Sequence[int] = indices  # type: ignore[assignment]
                    steps: Sequence[int] = lengths  # type: ignore[assignment]
                    self._units.booked(worker, task, request, held, steps)
                    done = request.num_episodes is not None  # request.done, without its call
                    rulings.append(_accepted(request.request_id, request.subscription, done))
                    if done:
                        return rulings
                    continue
            ruling = self.complete(worker_id, task_id, indices, lengths)
            rulings.append(ruling)
            if ruling.done or ruling.verdict is Verdict.REJECT:
                return rulings
        return rulings

    def complete(
        self,
        worker_id: int,
        task_id: int,
        episode_indices: Iterable[int],
        lengths: Iterable[int],
    ) -> ResultRuling:
        """Records a (validated) result; returns what to do with it.

        Args:
            worker_id: The sender.
            task_id: The task it names.
            episode_indices: Its episodes (fragments: as sent).
            lengths: Their lengths, one per index.
        """
        indices = _int64(episode_indices)
        outcome, positions = self._judge(worker_id, task_id, indices)
        if outcome.verdict is Verdict.IGNORE and task_id in self._books.tasks:
            # Its task is live: the result named units moved to another worker.
            requeued = self._units.forfeit(self._books.tasks[task_id], indices)
            return replace(outcome, requeued=requeued) if requeued else outcome
        if outcome.verdict is not Verdict.ACCEPT:
            return outcome
        task = self._books.tasks[task_id]
        request = self._books.requests[task.request_id]
        request.workers_used.add(worker_id)
        worker = self._books.workers[worker_id]
        if isinstance(request, EpisodeRequest) and positions is not None:
            self._units.record(worker, task, request, indices, _int64(lengths), positions=positions)
        elif isinstance(request, FragmentRequest):
            self._windows.record(worker, task, request, indices.tolist(), list(lengths))
        return ResultRuling(
            Verdict.ACCEPT,
            request_id=request.request_id,
            done=request.done,
            subscription=request.subscription,
        )


@functools.lru_cache(maxsize=_ACCEPTED_KEPT)
def _accepted(request_id: int, subscription: bool, done: bool) -> ResultRuling:
    """An ACCEPT ruling, made without the frozen ``__init__`` (its fields are the
    scheduler's own). Kept per request: judging and booking a result ask for
    one or two, and a frozen ruling is shared as safely as made again."""
    return prebuilt(
        ResultRuling,
        verdict=Verdict.ACCEPT,
        request_id=request_id,
        reason="",
        done=done,
        subscription=subscription,
        requeued=0,
    )


def _int64(values: Iterable[int]) -> np.ndarray:
    """Episode indices or lengths as an int64 column (a result's are a tuple)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.int64, copy=False).reshape(-1)
    return np.array(values if isinstance(values, tuple | list) else list(values), dtype=np.int64)


def _check_spec(spec: RequestSpec, *, subscription: bool) -> None:
    if spec.mode is Mode.FRAGMENTS and spec.fragment_length < 1:
        raise InvalidValueError(f"FRAGMENTS needs fragment_length >= 1, got {spec.fragment_length}")
    if subscription:
        if spec.mode is Mode.STEPS:
            raise InvalidValueError("subscriptions run in EPISODES or FRAGMENTS mode, not STEPS")
        if spec.max_buffered_steps < 1:
            raise InvalidValueError(
                f"max_buffered_steps must be >= 1, got {spec.max_buffered_steps}"
            )
    elif spec.amount < 1:
        raise InvalidValueError(f"amount must be >= 1, got {spec.amount}")
    if spec.first_episode and spec.mode is not Mode.EPISODES:
        raise InvalidValueError(f"first_episode is for EPISODES requests, got {spec.mode.name}")
