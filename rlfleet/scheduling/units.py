"""Unit planning: which episodes each worker runs, and how many it holds.

A worker holds about ``capacity_steps`` steps of episode units, sized with
the fleet's running mean episode length (:class:`MeanLength`), and at least
:data:`RESULTS_HELD` of its results' worth; refills come in batches and are
dealt round-robin (see the rules in
:mod:`rlfleet.scheduling.scheduler`). An :class:`EpisodeRequest` decides
which indices are still needed; :class:`UnitPlanner` decides who runs them,
and when a Sample request has none left to hand out, lets
:class:`~rlfleet.scheduling.tail_moves.TailMoves` even the workers' queues out.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet.errors import ConfigError
from rlfleet.protocol.modes import Footer, Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.scheduling.books import Books, RequestState, TaskRecord, WorkerLoad
from rlfleet.scheduling.orders import RequestSpec, TaskOrder
from rlfleet.scheduling.tail_moves import TailMoves

with compiled("unit booking", "rlfleet/scheduling/_unit_book.c"):
    from rlfleet.scheduling._unit_book import scatter
with compiled("refill dealing", "rlfleet/scheduling/_deal.c"):
    from rlfleet.scheduling._deal import deal

#: Default extra units a worker may hold per env slot beyond the one it
#: runs, whatever the episode length: a slot whose episode ends finds its
#: next unit already on the worker. The floor of a worker's capacity.
DEFAULT_PREFETCH_FACTOR = 1

#: Default steps of work a worker holds (see the module docstring). Workers
#: report after 0.1 s of work or 8192 steps (their default flush_seconds and
#: flush_steps): a per-env CartPole worker's results are mostly smaller and
#: this holds several of them; a native vector worker's are 16384 steps, and
#: :data:`RESULTS_HELD` of them set its capacity. Measured with the fleet
#: benchmark: 8192 and 24576 were within noise of this. Larger is not free: when a request stops
#: generating, each worker still runs the queue it holds, so a slower
#: worker's queue sets the request's tail. Surplus is no concern: a STEPS
#: request never hands out more than it still needs.
DEFAULT_CAPACITY_STEPS = 16384

#: A worker is topped up at the latest when it holds this many of its
#: results' worth of units beyond one per slot: a refill comes only after a
#: result, so when a result of a worker is booked, it must still hold two
#: results' worth not started, one to cover the time until its next result
#: and one for the refill's round trip. With one result's worth left
#: (``capacity_steps`` 16384 and results of 8192 steps, 64 slots), a native
#: CartPole worker stepped 0.5-1.0% of its env rows unrecorded in the middle
#: of requests, waiting for a refill; with two, none in three runs
#: (docs/data_plane.md, "Refills before the queue runs dry").
LOW_WATER_RESULTS = 2

#: A worker holds at least this many of its results' worth beyond one unit
#: per slot: its low-water mark and three more. It is topped up once half
#: of that spare is used, so a refill carries two and a half to three of its
#: results and one Task message spans that many results. Held to three and
#: so topped up by one result's worth at a time, a worker got a Task per
#: result: with results of 8,000 steps, 250-300 us of the coordinator's gRPC
#: CPU and a refill each (docs/performance.md, "An 8,000-step result").
RESULTS_HELD = LOW_WATER_RESULTS + 3

#: How much shorter than the fleet's mean length the refill marks a
#: dispatch keeps are worked out for (:meth:`UnitPlanner.dispatch`): a mark
#: never falls as the mean length shortens, so a kept mark bounds the
#: worker's while the mean stays above that, and it drifts by less than this
#: over most results.
MARK_SLACK = 1 / 32

#: Episodes over which the fleet's running mean episode length forgets.
MEAN_LENGTH_MEMORY = 256


#: A request's lengths past its prefix before any came back.
_NO_LENGTHS = np.full(0, -1, dtype=np.int64)


class MeanLength:
    """Running mean length of the fleet's recent complete episodes.

    Sizes worker capacities, and estimates the units a request needs before
    its own first episodes are back (requests of one learner usually run
    the same env with a slowly changing agent).
    """

    def __init__(self, memory: int = MEAN_LENGTH_MEMORY) -> None:
        self._keep = 1.0 - 1.0 / memory
        self.value: float | None = None

    def add(self, steps: int, episodes: int) -> None:
        """Takes ``episodes`` episodes totalling ``steps`` steps."""
        if episodes < 1:
            return
        mean = steps / episodes
        if self.value is None:
            self.value = mean
        else:
            # As if each of the episodes had been added one by one.
            self.value += (1.0 - self._keep**episodes) * (mean - self.value)


class EpisodeRequest(RequestState):
    """STEPS and EPISODES requests, and EPISODES subscriptions."""

    def __init__(self, request_id: int, spec: RequestSpec, *, subscription: bool) -> None:
        super().__init__(request_id, spec, subscription=subscription)
        self.requeued: list[int] = []  # min-heap: lost units, run before new ones
        self.next_index = spec.first_episode
        self.outstanding = 0  # units handed out and not back (requeued ones excluded)
        self.completed_count = 0
        # STEPS: the length of each episode past the contiguous prefix
        # 0..prefix_end-1 (whose total is prefix_steps), at index - prefix_end;
        # -1 while it is not back. Grown as needed, cut as the prefix grows.
        self.lengths_past_prefix = _NO_LENGTHS  # replaced, never written, while empty
        self.prefix_end = 0
        self.prefix_steps = 0
        self.num_episodes: int | None = None  # the answer, once known

    @property
    def done(self) -> bool:
        return self.num_episodes is not None

    @property
    def _end(self) -> int:
        """EPISODES: one past the last episode index the request runs."""
        return self.spec.first_episode + self.spec.amount

    def units(self, indices: np.ndarray) -> UnitColumns:
        """The units of these episode indices (int64, ascending), with their seeds.

        Derived for each refill, in one compiled call over the indices
        (``rlfleet.core.seeding.episode_seed_columns``): no block of seeds
        is derived ahead and kept.
        """
        return UnitColumns.seeded(self.spec.seed, self.spec.request_index, indices)

    def take(self, fleet_slots: int, prior_length: float | None) -> int | None:
        """The next episode index to hand out, or None if none is needed now.

        Args:
            fleet_slots: Env slots of the eligible workers.
            prior_length: The fleet's running mean episode length, used
                until this request's own episodes are back (None: unknown).
        """
        if self.done:
            return None
        if self.subscription and not self._subscription_room(fleet_slots, prior_length):
            return None
        if self.requeued:
            return heapq.heappop(self.requeued)
        if not self._may_generate(fleet_slots, self.average_length(prior_length)):
            return None
        index = self.next_index
        self.next_index += 1
        return index

    def take_many(self, count: int, fleet_slots: int, prior_length: float | None) -> np.ndarray:
        """Up to ``count`` indices to hand out (int64), each marked handed out.

        The same indices as ``count`` calls of :meth:`take` and
        :meth:`handed_out`, in one step: requeued units first, then new ones
        while the request needs them (the refill of a worker is hundreds of
        units, and per-unit calls were a tenth of the coordinator's CPU).
        """
        if self.subscription:  # its room changes with every unit: one at a time
            taken: list[int] = []
            while len(taken) < count:
                index = self.take(fleet_slots, prior_length)
                if index is None:
                    break
                taken.append(index)
                self.handed_out(1)
            return np.array(taken, dtype=np.int64)
        if self.done or count <= 0:
            return np.empty(0, dtype=np.int64)
        taken = [heapq.heappop(self.requeued) for _ in range(min(count, len(self.requeued)))]
        # A requeued unit popped and handed out leaves outstanding + requeued
        # unchanged, so what _may_generate allows is known now (the popped
        # ones count as outstanding: they are handed out below).
        average = self.average_length(prior_length)
        if self.spec.mode is Mode.EPISODES:
            new = self._end - self.next_index
        elif self.spec.amount - self.accepted_steps <= 0:
            new = 0
        else:
            remaining = self.spec.amount - self.accepted_steps
            needed = max(fleet_slots if average is None else math.ceil(remaining / average), 1)
            new = needed - (self.outstanding + len(taken) + len(self.requeued))
        new = max(min(new, count - len(taken)), 0)
        first = self.next_index
        self.next_index += new
        self.handed_out(len(taken) + new)
        if not taken:  # the usual case: one numpy call
            return np.arange(first, first + new, dtype=np.int64)
        return np.array([*taken, *range(first, first + new)], dtype=np.int64)

    def average_length(self, prior_length: float | None) -> float | None:
        """Mean length of this request's episodes, else the prior."""
        if self.completed_count:
            return self.accepted_steps / self.completed_count
        return prior_length

    def _subscription_room(self, fleet_slots: int, recent_length: float | None) -> bool:
        # The fleet's running mean, not the subscription's own average: a
        # subscription runs for long while its agent learns, and its lifetime
        # average lags far behind the episodes it runs now.
        if recent_length is None:
            # No length known yet: one unit per env slot of the fleet.
            return self.outstanding < max(fleet_slots, 1) and self.has_buffer_room(0)
        return self.has_buffer_room(self.outstanding * recent_length)

    def _may_generate(self, fleet_slots: int, average: float | None) -> bool:
        if self.subscription:
            return True
        if self.spec.mode is Mode.EPISODES:
            return self.next_index < self._end
        # STEPS: nothing new once the completed episodes reach the amount
        # (the missing prefix is outstanding or requeued and will come).
        remaining = self.spec.amount - self.accepted_steps
        if remaining <= 0:
            return False
        # No length known yet: one unit per env slot of the fleet.
        needed = max(fleet_slots if average is None else math.ceil(remaining / average), 1)
        return self.outstanding + len(self.requeued) < needed

    def handed_out(self, count: int) -> None:
        """``count`` more units are on workers."""
        self.outstanding += count

    def requeue(self, indices: np.ndarray, *, lost: bool) -> None:
        """Puts units back; ``lost``: their worker died (counted in the footer)."""
        self.requeued.extend(indices.tolist())
        heapq.heapify(self.requeued)
        self.outstanding -= len(indices)
        self.reassigned_units += len(indices) if lost else 0

    def drop(self, task: TaskRecord) -> None:
        """Nothing to forget: a task's units are counted on its worker, which the books update."""

    def lose(self, task: TaskRecord, *, keep_streams: bool) -> int:
        """Re-queues a lost worker's units ahead of new ones (counted in the footer)."""
        outstanding = task.units.outstanding_indices()
        self.requeue(outstanding, lost=True)
        return len(outstanding)

    def complete(
        self,
        indices: np.ndarray | Sequence[int],
        lengths: np.ndarray | Sequence[int],
        steps: int | None = None,
    ) -> None:
        """Episodes ``indices`` came back with ``lengths`` steps (int64 arrays,
        or a result header's tuples of ints with ``steps``, their total)."""
        count = len(indices)
        if steps is None:
            steps = int(np.asarray(lengths, dtype=np.int64).sum())
        self.outstanding -= count
        self.completed_count += count
        self.accepted_steps += steps
        if self.subscription:
            self.buffered_steps += steps
            return
        if self.spec.mode is Mode.EPISODES:
            if self.completed_count >= self.spec.amount:
                self.num_episodes = self.spec.amount
            return
        if self.num_episodes is None:
            self._extend_prefix(indices, lengths)

    def _extend_prefix(
        self, indices: np.ndarray | Sequence[int], lengths: np.ndarray | Sequence[int]
    ) -> None:
        """STEPS: books lengths, then walks the contiguous prefix forward; the
        first index at which it reaches the amount fixes the answer (smallest m)."""
        if not len(indices):
            return
        # Offsets from prefix_end are >= 0: the prefix's episodes are back.
        if isinstance(indices, np.ndarray):
            largest = int(indices.max()) - self.prefix_end
        else:
            largest = max(indices) - self.prefix_end
        known = self.lengths_past_prefix
        if largest >= len(known):
            grown = np.full(max(largest + 1, 2 * len(known)), -1, dtype=np.int64)
            grown[: len(known)] = known
            known = self.lengths_past_prefix = grown
        if isinstance(indices, np.ndarray) or isinstance(lengths, np.ndarray):
            known[np.asarray(indices) - self.prefix_end] = lengths
        else:  # a header's tuples: no arrays made for its few episodes
            scatter(known, self.prefix_end, indices, lengths)
        # The episode at prefix_end is the first one missing (a walk stops
        # there): unless this result brings it, the prefix stays where it is.
        # Most results do not (each worker runs its own block of indices).
        if known[0] < 0:
            return
        missing = np.flatnonzero(known < 0)
        run = known[: missing[0] if missing.size else len(known)]
        if not run.size:
            return
        totals = self.prefix_steps + np.cumsum(run)
        reached = np.flatnonzero(totals >= self.spec.amount)
        walked = int(reached[0]) + 1 if reached.size else len(run)
        self.prefix_end += walked
        self.prefix_steps = int(totals[walked - 1])
        self.lengths_past_prefix = known[walked:]
        if reached.size:
            self.num_episodes = self.prefix_end

    def footer(self) -> Footer:
        num = self.num_episodes or 0
        steps = self.prefix_steps if self.spec.mode is Mode.STEPS else self.accepted_steps
        return Footer(num, steps, len(self.workers_used), self.reassigned_units)


class UnitPlanner:
    """Sizes worker capacities and hands episode units out.

    Args:
        books: The scheduler's books (tasks are opened there).
        prefetch_factor: Units a worker may hold beyond its env slots, per
            slot, whatever the episode length.
        capacity_steps: Steps of work a worker may hold (0: the floor only).
        move_units: At a Sample request's tail, move unstarted units from the
            busiest worker to one that runs out (:class:`TailMoves`).
    """

    def __init__(
        self,
        books: Books,
        *,
        prefetch_factor: int,
        capacity_steps: int,
        move_units: bool = False,
    ) -> None:
        if prefetch_factor < 0:
            raise ConfigError(f"prefetch_factor must be >= 0, got {prefetch_factor}")
        if capacity_steps < 0:
            raise ConfigError(f"capacity_steps must be >= 0, got {capacity_steps}")
        self._books = books
        self._prefetch_factor = prefetch_factor
        self._capacity_steps = capacity_steps
        self.mean_length = MeanLength()
        #: The units moved at Sample requests' tails, and their Cancels.
        self.moves = TailMoves(books, enabled=move_units)
        # Per worker id: (mean length, result_steps, leased, num_envs) and the
        # refill mark of those (surely_full).
        self._marks: dict[int, tuple[float, int, int, int, int]] = {}

    def min_capacity(self, num_envs: int) -> int:
        """The floor of a worker's capacity in units, whatever the episode length."""
        return num_envs * (1 + self._prefetch_factor)

    def capacity(self, worker: WorkerLoad) -> int:
        """Episode units the worker may hold now.

        ``capacity_steps`` of units, and at least one per slot plus
        :data:`RESULTS_HELD` of the worker's largest results (with
        ``capacity_steps`` 0, or no length known yet, the floor alone).
        """
        return self._limits(worker, self.mean_length.value)[0]

    def _limits(self, worker: WorkerLoad, mean: float | None) -> tuple[int, int]:
        """The worker's capacity, and its refill mark for that capacity and its
        low water (two of its results: ``WorkerLoad.refill_mark``), worked out
        once: a refill that hands out nothing, after most results, is this
        per worker and a comparison."""
        if mean is None or not self._capacity_steps:
            capacity, low = worker.min_capacity, 0
        else:
            mean = max(mean, 1.0)
            capacity = max(
                worker.min_capacity,
                math.ceil(self._capacity_steps / mean),
                # The results' worth come on top of the running episodes.
                worker.num_envs + math.ceil(RESULTS_HELD * worker.result_steps / mean),
            )
            low = math.ceil(LOW_WATER_RESULTS * worker.result_steps / mean)
        if worker.leased:
            capacity = math.ceil(capacity * worker.slots / worker.num_envs)
        return capacity, worker.refill_mark(capacity, low)

    def dispatch(
        self, request: EpisodeRequest, workers: list[WorkerLoad], *, looked: bool = False
    ) -> list[TaskOrder]:
        """Tops up the workers that want a refill with units of ``request``.

        When the request has no unit left to hand out, a Sample request's
        units are moved instead (with ``move_units``): see :meth:`TailMoves.move`.

        Args:
            request: The request.
            workers: The workers it may give units to, by id.
            looked: The caller found :meth:`surely_full` False over the fleet
                (which skips the workers that are given none): it is not
                asked again, the workers' marks are worked out at once.
        """
        if not looked and self.surely_full(workers):
            return []  # the common case after a result: nothing to send
        mean = self.mean_length.value
        limits = self._look(workers, mean)
        wanting = [w for w, (_, mark) in zip(workers, limits, strict=True) if w.units <= mark]
        if not wanting:
            return []
        # Top up every worker with room for a slice, not only the one that
        # asked: queues stay balanced, so when the request stops generating,
        # its last units are spread over the fleet instead of one worker
        # grinding through a block while the others idle.
        # First a unit for every idle env slot, then each worker's room up
        # to its capacity, in slices of its slots (_owners): worked out in
        # the one pass that picks the refilled workers.
        refilled = []
        slots = []
        idle = []
        room = []
        fleet_slots = 0
        for w, (limit, mark) in zip(workers, limits, strict=True):
            size = w.slots
            fleet_slots += size
            held = w.units
            if held <= mark or limit - held >= size:
                gap = size - held if held < size else 0
                refilled.append(w)
                slots.append(size)
                idle.append(gap)
                spare = limit - held - gap
                room.append(spare if spare > 0 else 0)
        # The request's units for every slice at once (as many takes one
        # after the other: test_take_many_hands_out_what_as_many_takes_would),
        # dealt in the slices' order; a slice the request cannot fill is the
        # last one, as when each slice was taken on its own.
        taken = request.take_many(sum(idle) + sum(room), fleet_slots, mean)
        if not taken.size:  # the request needs no more for now (its last units are out)
            return self.moves.move(request, workers, wanting, mean)
        orders = []
        for worker, units in zip(
            refilled, _dealt_units(request, taken, slots, idle, room), strict=True
        ):
            if not len(units):
                continue
            # A refill joins the worker's live task of the request: the
            # worker sends one result per task at each flush, and a task per
            # refill would split every flush that spans a refill in two.
            task = self._books.task_for(worker, request, units.episode_indices)
            task.units.add(units)
            worker.units += len(units)
            orders.append(self._books.order(task, request, units=units))
        return orders

    def forget(self, worker_id: int) -> None:
        """Drops what was kept for a worker that left (its refill mark)."""
        self._marks.pop(worker_id, None)

    def surely_full(self, workers: Iterable[WorkerLoad]) -> bool:
        """Whether :meth:`dispatch` would hand these workers nothing, known
        from their kept marks alone (False: not known, ask :meth:`dispatch`).
        Of every worker of the fleet: those that are not eligible or have
        every env slot leased are given no units, and are skipped, so that
        False means one of those :meth:`dispatch` is given may want a refill."""
        # Known from the marks kept for a shorter mean length than today's: a
        # worker holding more than such a mark, with the same result size and
        # env slots, holds more than its mark now. A few comparisons per
        # worker where working the marks out took most of a refill that
        # hands out nothing.
        mean = self.mean_length.value
        if mean is None:
            return False
        marks = self._marks
        for w in workers:
            if not w.takes_units:
                continue  # given no units (Scheduler._dispatch_request)
            kept = marks.get(w.worker_id)
            if (
                kept is None
                or w.units <= kept[4]
                or mean < kept[0]
                or kept[1] != w.result_steps
                or kept[2] != w.leased
                or kept[3] != w.num_envs
            ):
                return False
        return True

    def _look(self, workers: list[WorkerLoad], mean: float | None) -> list[tuple[int, int]]:
        """Each worker's capacity and refill mark (:meth:`_limits`), in one pass
        that also keeps its mark for a mean length :data:`MARK_SLACK` shorter
        than ``mean`` (a mark never rises with the mean length), for
        :meth:`surely_full`."""
        limits = self._limits
        if mean is None:
            return [limits(w, None) for w in workers]
        shorter = mean * (1.0 - MARK_SLACK)
        marks = self._marks
        looked = []
        for w in workers:
            looked.append(limits(w, mean))
            kept = marks.get(w.worker_id)
            if (
                kept is None
                or kept[0] != shorter
                or kept[1] != w.result_steps
                or kept[2] != w.leased
                or kept[3] != w.num_envs
            ):  # worked out again only if what it depends on changed
                mark = limits(w, shorter)[1]
                marks[w.worker_id] = (shorter, w.result_steps, w.leased, w.num_envs, mark)
        return looked

    def forfeit(self, task: TaskRecord, indices: np.ndarray) -> int:
        """Re-queues the units of an ignored result of ``task`` that it still
        held (the result also named units moved away, so none of it is
        booked, and its worker will not send these again).

        Returns:
            The number of units re-queued.
        """
        request = self._books.requests.get(task.request_id)
        if not isinstance(request, EpisodeRequest):
            return 0
        held = task.units.outstanding_among(indices)
        if not held.size:
            return 0
        task.units.take_away(held)
        worker = self._books.workers.get(task.worker_id)
        if worker is not None:
            worker.units -= len(held)
        request.requeue(held, lost=False)
        if not task.units.outstanding:
            self._books.retire(task)
        return len(held)

    def record(
        self,
        worker: WorkerLoad,
        task: TaskRecord,
        request: EpisodeRequest,
        indices: np.ndarray,
        lengths: np.ndarray,
        *,
        positions: np.ndarray,
    ) -> None:
        """Books the accepted episodes of a result of ``task``.

        Args:
            worker: Its worker.
            task: The task.
            request: Its request.
            indices: The episodes (int64).
            lengths: Their lengths (int64).
            positions: Where the task holds them (``TaskUnits.check``).
        """
        task.units.complete(positions)
        self.booked(worker, task, request, indices, lengths)

    def booked(
        self,
        worker: WorkerLoad,
        task: TaskRecord,
        request: EpisodeRequest,
        indices: np.ndarray | Sequence[int],
        lengths: np.ndarray | Sequence[int],
    ) -> None:
        """Books the accepted episodes of a result of ``task`` whose units the
        task already marked back (:meth:`record`, ``TaskUnits.take_back``).

        Args:
            worker: Its worker.
            task: The task.
            request: Its request.
            indices: The episodes (int64, or a result header's tuple of ints).
            lengths: Their lengths (alike).
        """
        worker.units -= len(indices)
        # A header's few ints add up faster in Python than numpy's call costs.
        steps = int(lengths.sum()) if isinstance(lengths, np.ndarray) else sum(lengths)
        worker.result_steps = max(worker.result_steps, steps)
        request.complete(indices, lengths, steps)
        self.mean_length.add(steps, len(lengths))
        if not task.units.outstanding:
            self._books.retire(task)


def _owners(slots: list[int], idle: list[int], room: list[int]) -> np.ndarray:
    """Who gets each unit a refill deals, in order (positions among the
    refilled workers, whose env slots, idle slots and room these are).

    First a unit for every idle env slot of every worker, then spare units,
    a slice of its slots at a time to each worker in turn, until each holds
    its capacity. Worked out as a grid of rounds by workers, not slice by
    slice: a worker of 8 env slots and hundreds of units of room is topped
    up by dozens of slices, and a Python step per slice, here and in the
    dealing, was most of a refill's CPU
    (``tests/test_scheduler.py::test_a_refill_deals_in_calls_per_worker_not_per_slice``).
    """
    workers = len(slots)
    positions = np.arange(workers)
    rounds = max(-(-spare // size) for spare, size in zip(room, slots, strict=True))
    per_slot = np.array(slots)
    # Round r gives worker i min(what is left of its room, its slots).
    left = np.array(room) - per_slot * np.arange(rounds)[:, None]
    sizes = np.minimum(np.maximum(left, 0), per_slot)
    turns = np.arange(rounds * workers) % workers
    return np.concatenate((positions.repeat(idle), turns.repeat(sizes.ravel())))


def _dealt_units(
    request: EpisodeRequest, taken: np.ndarray, slots: list[int], idle: list[int], room: list[int]
) -> list[UnitColumns]:
    """Each refilled worker's units of ``taken`` (whose env slots, idle slots
    and room these are), ascending, with their seeds: dealt as :func:`_owners`
    says, in one compiled call (``_deal.c``) and one seed call for them all
    where ``taken`` ascends, as it does (requeued units, then new ones); else
    with numpy, sorting each worker's
    (``tests/test_refill_dealing.py::test_the_compiled_dealing_gives_what_the_numpy_dealing_gives``)."""
    grouped = np.empty(len(taken), dtype=np.int64)
    ends = deal(taken, slots, idle, room, grouped)
    if ends is None:
        picked = _dealt(taken, _owners(slots, idle, room)[: len(taken)], len(slots))
        return [request.units(np.sort(mine)) for mine in picked]
    # Views of the three columns seeded at once: each worker's units follow
    # the one before's, ascending in the order dealt.
    seeded = request.units(grouped)
    starts = [0, *ends[:-1]]
    return [seeded.select(slice(start, end)) for start, end in zip(starts, ends, strict=True)]


def _dealt(taken: np.ndarray, owners: np.ndarray, workers: int) -> list[np.ndarray]:
    """``taken`` split by ``owners`` (a position in the refilled workers per unit)."""
    grouped = taken[owners.argsort(kind="stable")]
    ends = np.bincount(owners, minlength=workers).cumsum().tolist()
    return [grouped[start:end] for start, end in zip([0, *ends[:-1]], ends, strict=True)]
