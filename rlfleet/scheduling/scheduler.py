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
  units. Enough that a refill's round trip ends before its queue runs dry,
  and that it reports many episodes per message (each result costs the
  coordinator and the learner about a millisecond of CPU: one per episode
  cost the fleet 3x its throughput).
* Refills come in batches: a worker is topped up to capacity once its
  spare units fall to half, so one Task carries many units instead of one
  per finished episode. Every idle env slot is filled before any worker
  gets spare units, and spare units are dealt round-robin in slices of
  ``num_envs``, so that every worker works near the front of the request
  (the prefix rule below waits for the lowest indices) and no slot idles
  while another worker hoards.
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

import abc
import enum
import heapq
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from rlfleet.core.seeding import episode_seeds_many
from rlfleet.errors import ConfigError, InternalError, InvalidValueError
from rlfleet.protocol.modes import Footer, Mode

#: Default extra units a worker may hold per env slot beyond the one it
#: runs, whatever the episode length: a slot whose episode ends finds its
#: next unit already on the worker. The floor of a worker's capacity.
DEFAULT_PREFETCH_FACTOR = 1

#: Default steps of work a worker holds (see the module docstring). Workers
#: report after 0.1 s of work or 8192 steps (their default flush_seconds and
#: flush_steps), so a refill at half capacity still leaves them 8192 steps
#: (~140 ms of CartPole on one core, ~30 ms of a native vector env) to cover
#: its round trip. Measured with the fleet benchmark: 8192 and 24576 were
#: within noise of this. Larger is not free: when a request stops
#: generating, each worker still runs the queue it holds, so a slower
#: worker's queue sets the request's tail. Surplus is no concern: a STEPS
#: request never hands out more than it still needs.
DEFAULT_CAPACITY_STEPS = 16384

#: Episodes over which the fleet's running mean episode length forgets.
_MEAN_LENGTH_MEMORY = 256

#: Fragment windows a subscription keeps outstanding per worker: one being
#: stepped and one queued behind it.
SUBSCRIPTION_WINDOWS_PER_WORKER = 2


class Verdict(enum.Enum):
    """What to do with an arriving result."""

    #: It completes outstanding units of a live request: forward it.
    ACCEPT = "accept"
    #: It is late (request finished, units cancelled): drop it quietly.
    IGNORE = "ignore"
    #: The worker broke the protocol (units it never got, twice the same).
    REJECT = "reject"


class Unit(NamedTuple):
    """One episode to run, with its seeds.

    A NamedTuple, not a frozen dataclass: one is made per episode the fleet
    runs, and a frozen dataclass took 3.8 us to build where this takes 0.5.
    """

    episode_index: int
    env_seed: int
    policy_seed: int


@dataclass(frozen=True)
class TaskOrder:
    """Work to send to one worker (becomes a ``Task`` message).

    Attributes:
        task_id: Unique per scheduler.
        worker_id: The worker that runs it.
        request_id: The request it serves.
        mode: The request's mode.
        agent_version: Version every episode must be produced with (-1:
            the latest the worker has, for subscriptions).
        env_generation: Env generation every episode must run in.
        units: Episodes to run (STEPS, EPISODES).
        fragment_length: Steps per window (FRAGMENTS).
        rounds: Windows to run (FRAGMENTS).
        base_seed: Seed of the episodes fragment streams start (FRAGMENTS).
        streams: The stream each slot runs (FRAGMENTS, to workers that can
            take streams over; empty: the worker's own, from its first).
    """

    task_id: int
    worker_id: int
    request_id: int
    mode: Mode
    agent_version: int
    env_generation: int
    units: tuple[Unit, ...] = ()
    fragment_length: int = 0
    rounds: int = 0
    base_seed: int = 0
    streams: tuple[int, ...] = ()


@dataclass(frozen=True)
class CancelOrder:
    """Units a worker should drop (becomes a ``Cancel`` message).

    Attributes:
        worker_id: The worker holding them.
        task_id: Their task.
        episode_indices: The units; empty means the whole task.
    """

    worker_id: int
    task_id: int
    episode_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class RequestSpec:
    """What a learner asked for, with the state it must be served in.

    Attributes:
        mode: STEPS, EPISODES or FRAGMENTS.
        amount: Steps (STEPS, FRAGMENTS) or episodes (EPISODES); ignored
            for subscriptions, which run until cancelled.
        seed: Base seed of the episode seeds (FRAGMENTS: the stream seed).
        request_index: Second component of the episode seeds.
        agent_version: Version the episodes must be produced with; -1 for
            "the latest" (subscriptions).
        env_generation: Env generation the episodes must run in.
        fragment_length: Window length (FRAGMENTS).
        max_buffered_steps: Subscriptions only: steps accepted but not yet
            sent to the subscriber beyond which no new work is handed out.
    """

    mode: Mode
    amount: int
    seed: int
    request_index: int
    agent_version: int
    env_generation: int
    fragment_length: int = 0
    max_buffered_steps: int = 0


@dataclass(frozen=True)
class ResultRuling:
    """The scheduler's answer to a result.

    Attributes:
        verdict: Forward, drop or reject the result.
        request_id: The request it belongs to (0 if unknown).
        reason: Why it was rejected or ignored, for logs and the error.
        done: The request is complete now (call :meth:`Scheduler.finish`).
        subscription: The request is a subscription.
    """

    verdict: Verdict
    request_id: int = 0
    reason: str = ""
    done: bool = False
    subscription: bool = False


# --- per-worker and per-task bookkeeping ------------------------------------


@dataclass
class _Worker:
    worker_id: int
    num_envs: int
    min_capacity: int  # units, whatever the episode length, with no envs leased
    eligible: bool = False
    streams: tuple[int, ...] = ()  # its fragment streams, one per slot
    takeover: bool = False  # it runs the streams a task names
    units: int = 0  # outstanding episode units, over all its tasks
    windows: int = 0  # outstanding fragment windows of subscriptions
    tasks: set[int] = field(default_factory=set)
    leased: int = 0  # of its env slots, held by leased envs

    @property
    def slots(self) -> int:
        """Env slots left for sampling."""
        return max(self.num_envs - self.leased, 0)

    def wants_refill(self, capacity: int) -> bool:
        """Whether to top the worker up now (to ``capacity`` units).

        At once when an env slot may be idle; otherwise only once half of
        its spare units are used, so that refills are few and large.
        """
        if self.units < self.slots:
            return True
        spare = capacity - self.slots
        return self.units < capacity and self.units - self.slots <= spare // 2


class _MeanLength:
    """Running mean length of the fleet's recent complete episodes.

    Sizes worker capacities, and estimates the units a request needs before
    its own first episodes are back (requests of one learner usually run
    the same env with a slowly changing agent).
    """

    def __init__(self, memory: int = _MEAN_LENGTH_MEMORY) -> None:
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


@dataclass
class _Task:
    task_id: int
    worker_id: int
    request_id: int
    # Episode tasks: every index given, and those not back yet.
    assigned: frozenset[int] = frozenset()
    outstanding: set[int] = field(default_factory=set)
    # ... and each index's (env_seed, policy_seed), against which results are checked.
    seeds: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Fragment tasks (rounds >= 1): windows asked for and received.
    rounds: int = 0
    received: int = 0
    steps_per_window: int = 0
    streams: tuple[int, ...] = ()
    takeover: bool = False  # runs orphaned streams, not its worker's own

    @property
    def is_windows(self) -> bool:
        return self.rounds > 0

    @property
    def windows_left(self) -> int:
        return self.rounds - self.received


# --- requests -----------------------------------------------------------------


class _Request(abc.ABC):
    """State shared by every kind of request."""

    def __init__(self, request_id: int, spec: RequestSpec, *, subscription: bool) -> None:
        self.request_id = request_id
        self.spec = spec
        self.subscription = subscription
        self.tasks: set[int] = set()
        self.workers_used: set[int] = set()
        self.reassigned_units = 0
        self.accepted_steps = 0
        self.buffered_steps = 0  # subscriptions: accepted, not yet sent

    @property
    @abc.abstractmethod
    def done(self) -> bool:
        """Whether the request has all it asked for (a subscription never has)."""

    def has_buffer_room(self, in_flight_steps: float) -> bool:
        """Whether a subscription may get more work (always True for Sample requests).

        Args:
            in_flight_steps: Steps the work handed out and not back yet is
                expected to bring.
        """
        # Backpressure: a subscriber that reads slowly stops the fleet's work
        # for it instead of growing the coordinator's memory. Work in flight
        # counts too, or a reader would receive it all, stale, after an update.
        return (
            not self.subscription
            or self.buffered_steps + in_flight_steps < self.spec.max_buffered_steps
        )

    @abc.abstractmethod
    def footer(self) -> Footer:
        """What the request's answer ends with."""


class _EpisodeRequest(_Request):
    """STEPS and EPISODES requests, and EPISODES subscriptions."""

    def __init__(self, request_id: int, spec: RequestSpec, *, subscription: bool) -> None:
        super().__init__(request_id, spec, subscription=subscription)
        self.requeued: list[int] = []  # min-heap: lost units, run before new ones
        self.next_index = 0
        self.outstanding = 0  # units handed out and not back (requeued ones excluded)
        self.completed_count = 0
        # STEPS: lengths of completed episodes past the contiguous prefix
        # 0..prefix_end-1, whose total is prefix_steps.
        self.completed: dict[int, int] = {}
        self.prefix_end = 0
        self.prefix_steps = 0
        self.num_episodes: int | None = None  # the answer, once known

    @property
    def done(self) -> bool:
        return self.num_episodes is not None

    def units(self, indices: list[int]) -> tuple[Unit, ...]:
        """The units of these episode indices, with their seeds."""
        seeds = episode_seeds_many(self.spec.seed, self.spec.request_index, indices)
        return tuple(Unit(i, env, policy) for i, (env, policy) in zip(indices, seeds, strict=True))

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

    def take_many(self, count: int, fleet_slots: int, prior_length: float | None) -> list[int]:
        """Up to ``count`` indices to hand out, each marked handed out.

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
            return taken
        if self.done or count <= 0:
            return []
        taken = [heapq.heappop(self.requeued) for _ in range(min(count, len(self.requeued)))]
        # A requeued unit popped and handed out leaves outstanding + requeued
        # unchanged, so what _may_generate allows is known now (the popped
        # ones count as outstanding: they are handed out below).
        average = self.average_length(prior_length)
        if self.spec.mode is Mode.EPISODES:
            new = self.spec.amount - self.next_index
        elif self.spec.amount - self.accepted_steps <= 0:
            new = 0
        else:
            remaining = self.spec.amount - self.accepted_steps
            needed = max(fleet_slots if average is None else math.ceil(remaining / average), 1)
            new = needed - (self.outstanding + len(taken) + len(self.requeued))
        new = max(min(new, count - len(taken)), 0)
        taken.extend(range(self.next_index, self.next_index + new))
        self.next_index += new
        self.handed_out(len(taken))
        return taken

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
            return self.next_index < self.spec.amount
        # STEPS: nothing new once the completed episodes reach the amount
        # (the missing prefix is outstanding or requeued and will come).
        remaining = self.spec.amount - self.accepted_steps
        if remaining <= 0:
            return False
        # No length known yet: one unit per env slot of the fleet.
        needed = max(fleet_slots if average is None else math.ceil(remaining / average), 1)
        return self.outstanding + len(self.requeued) < needed

    def handed_out(self, count: int) -> None:
        self.outstanding += count

    def requeue(self, indices: Iterable[int], *, lost: bool) -> None:
        """Puts units back; ``lost``: their worker died (counted in the footer)."""
        for index in indices:
            heapq.heappush(self.requeued, index)
            self.outstanding -= 1
            self.reassigned_units += int(lost)

    def complete(self, index: int, length: int) -> None:
        self.outstanding -= 1
        self.completed_count += 1
        self.accepted_steps += length
        if self.subscription:
            self.buffered_steps += length
            return
        if self.spec.mode is Mode.EPISODES:
            if self.completed_count == self.spec.amount:
                self.num_episodes = self.spec.amount
            return
        self.completed[index] = length
        # Walk the contiguous prefix forward; the first index at which it
        # reaches the amount fixes the answer (smallest m).
        while self.prefix_end in self.completed and self.num_episodes is None:
            self.prefix_steps += self.completed.pop(self.prefix_end)
            self.prefix_end += 1
            if self.prefix_steps >= self.spec.amount:
                self.num_episodes = self.prefix_end

    def footer(self) -> Footer:
        num = self.num_episodes or 0
        steps = self.prefix_steps if self.spec.mode is Mode.STEPS else self.accepted_steps
        return Footer(num, steps, len(self.workers_used), self.reassigned_units)


class _FragmentRequest(_Request):
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

    def deficit(self) -> int:
        """Steps that no planned window will deliver."""
        return self.spec.amount - self.accepted_steps - self.expected_steps

    def footer(self) -> Footer:
        return Footer(
            self.fragments, self.accepted_steps, len(self.workers_used), self.reassigned_units
        )


# --- the scheduler -----------------------------------------------------------


class Scheduler:
    """Hands out units to workers and decides when requests are complete.

    Not thread-safe: the coordinator calls it under its lock.

    Args:
        prefetch_factor: Units a worker may hold beyond its env slots, per
            slot, whatever the episode length: the floor of its capacity,
            ``num_envs * (1 + prefetch_factor)`` units.
        capacity_steps: Steps of work a worker may hold, converted to units
            with the running mean episode length (0: the floor only).
    """

    def __init__(
        self,
        *,
        prefetch_factor: int = DEFAULT_PREFETCH_FACTOR,
        capacity_steps: int = DEFAULT_CAPACITY_STEPS,
    ) -> None:
        if prefetch_factor < 0:
            raise ConfigError(f"prefetch_factor must be >= 0, got {prefetch_factor}")
        if capacity_steps < 0:
            raise ConfigError(f"capacity_steps must be >= 0, got {capacity_steps}")
        self._prefetch_factor = prefetch_factor
        self._capacity_steps = capacity_steps
        self._mean_length = _MeanLength()
        self._workers: dict[int, _Worker] = {}
        self._tasks: dict[int, _Task] = {}
        self._requests: dict[int, _Request] = {}
        self._sample: _Request | None = None
        self._subscriptions: list[_Request] = []
        self._request_ids = itertools.count(1)
        self._task_ids = itertools.count(1)
        self._last_task_id = 0
        self._next_stream = 0
        self._orphans: list[int] = []  # streams of lost workers, ascending

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
        if worker_id in self._workers:
            raise InvalidValueError(f"worker {worker_id} is already registered")
        adopted: list[int] = []
        if takeover:
            # Busy ones too: their windows in flight finish where they run,
            # and the adopter's own windows skip them until then.
            adopted = self._orphans[:num_envs]
            self._orphans = self._orphans[num_envs:]
        fresh = range(self._next_stream, self._next_stream + num_envs - len(adopted))
        self._next_stream += len(fresh)
        streams = (*adopted, *fresh)
        floor = num_envs * (1 + self._prefetch_factor)
        self._workers[worker_id] = _Worker(
            worker_id, num_envs, floor, streams=streams, takeover=takeover
        )
        return streams

    def _busy_orphans(self) -> set[int]:
        """Streams taken over that a request still has windows of (planned or running)."""
        busy = {s for t in self._tasks.values() if t.takeover for s in t.streams}
        for request in self._requests.values():
            if isinstance(request, _FragmentRequest):
                busy.update(s for streams, _ in request.takeovers for s in streams)
        return busy

    @property
    def orphaned_streams(self) -> tuple[int, ...]:
        """Streams of lost workers that no worker has adopted."""
        return tuple(self._orphans)

    def task_streams(self, task_id: int) -> tuple[int, ...]:
        """The streams a live fragment task runs (empty once it is retired)."""
        task = self._tasks.get(task_id)
        return () if task is None else task.streams

    def set_leased(self, worker_id: int, leased: int) -> None:
        """How many of the worker's env slots leased envs hold now (see the rules)."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.leased = leased

    def set_eligible(self, worker_id: int, eligible: bool) -> None:
        """Whether the worker may get new work (ready in the current state, not leaving)."""
        self._workers[worker_id].eligible = eligible

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
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            return 0
        if keep_streams:
            self._orphans = sorted({*self._orphans, *worker.streams})
        requeued = 0
        for task_id in sorted(worker.tasks):
            task = self._tasks.pop(task_id)
            request = self._requests.get(task.request_id)
            if request is None:
                continue
            request.tasks.discard(task_id)
            if isinstance(request, _EpisodeRequest):
                request.requeue(task.outstanding, lost=True)
                requeued += len(task.outstanding)
            elif isinstance(request, _FragmentRequest):
                left = task.windows_left
                if keep_streams and left and not request.subscription:
                    request.takeovers.append((task.streams, left))  # still expected
                else:
                    # Its streams died with it; dispatch plans replacement windows.
                    request.expected_steps -= left * task.steps_per_window
        return requeued

    def units_in_flight(self, worker_id: int) -> int:
        """Episode units and fragment windows the worker holds."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return 0
        return worker.units + sum(self._tasks[t].windows_left for t in worker.tasks)

    @property
    def eligible_workers(self) -> int:
        """Workers that may get work now."""
        return sum(1 for worker in self._workers.values() if worker.eligible)

    @property
    def mean_episode_length(self) -> float | None:
        """The fleet's running mean episode length (None before any episode)."""
        return self._mean_length.value

    def capacity(self, worker_id: int) -> int:
        """Episode units the worker may hold now."""
        return self._capacity(self._workers[worker_id])

    def _capacity(self, worker: _Worker) -> int:
        mean = self._mean_length.value
        if mean is None or not self._capacity_steps:
            capacity = worker.min_capacity
        else:
            capacity = max(worker.min_capacity, math.ceil(self._capacity_steps / max(mean, 1.0)))
        if worker.leased:
            capacity = math.ceil(capacity * worker.slots / worker.num_envs)
        return capacity

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

    def _new_request(self, spec: RequestSpec, *, subscription: bool) -> _Request:
        request_id = next(self._request_ids)
        request: _Request
        if spec.mode is Mode.FRAGMENTS:
            request = _FragmentRequest(request_id, spec, subscription=subscription)
        else:
            request = _EpisodeRequest(request_id, spec, subscription=subscription)
        self._requests[request_id] = request
        return request

    def request_spec(self, request_id: int) -> RequestSpec:
        """The spec of a live request (its env generation follows env updates)."""
        return self._requests[request_id].spec

    def request_of_task(self, task_id: int) -> int | None:
        """The request a live task serves, or None once the task is retired."""
        task = self._tasks.get(task_id)
        return None if task is None else task.request_id

    def unit_seeds(self, task_id: int) -> dict[int, tuple[int, int]]:
        """Episode index -> (env_seed, policy_seed) of a live episode task's units.

        Kept from dispatch, so checking a result's seeds derives none again.
        Empty for fragment tasks and retired tasks.
        """
        task = self._tasks.get(task_id)
        return {} if task is None else task.seeds

    def footer(self, request_id: int) -> Footer:
        """The footer of a done request."""
        return self._requests[request_id].footer()

    def finish(self, request_id: int) -> list[CancelOrder]:
        """Ends a request (done, failed or cancelled by the learner).

        Returns:
            Cancels for its units still on workers; their late results are
            ignored from now on.
        """
        request = self._requests.pop(request_id, None)
        if request is None:
            return []
        if self._sample is request:
            self._sample = None
        if request in self._subscriptions:
            self._subscriptions.remove(request)
        cancels = [self._cancel(self._tasks[task_id], request) for task_id in sorted(request.tasks)]
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
        self._mean_length = _MeanLength()  # the old env's lengths say nothing of the new
        cancels: list[CancelOrder] = []
        for request in self._subscriptions:
            request.spec = replace(request.spec, env_generation=generation)
            for task_id in sorted(request.tasks):
                task = self._tasks[task_id]
                if isinstance(request, _EpisodeRequest):
                    request.requeue(task.outstanding, lost=False)
                cancels.append(self._cancel(task, request))
            request.tasks.clear()
        return cancels

    def _cancel(self, task: _Task, request: _Request) -> CancelOrder:
        """Drops a task's outstanding work from the books; the order tells its worker."""
        del self._tasks[task.task_id]
        if isinstance(request, _FragmentRequest):
            request.expected_steps -= task.windows_left * task.steps_per_window
        worker = self._workers.get(task.worker_id)
        if worker is not None:
            worker.tasks.discard(task.task_id)
            worker.units -= len(task.outstanding)
            if request.subscription and task.is_windows:
                worker.windows -= task.windows_left
        if task.is_windows:
            return CancelOrder(task.worker_id, task.task_id)
        return CancelOrder(task.worker_id, task.task_id, tuple(sorted(task.outstanding)))

    def consumed(self, request_id: int, steps: int) -> None:
        """A subscriber was sent ``steps`` buffered steps (frees buffer room)."""
        request = self._requests.get(request_id)
        if request is not None:
            request.buffered_steps -= steps

    # --- dispatch -----------------------------------------------------------

    def dispatch(self) -> list[TaskOrder]:
        """Hands out work to eligible workers with free capacity.

        Call after every event that may free capacity or create work.
        """
        if self._sample is not None:
            return self._dispatch_request(self._sample)
        orders: list[TaskOrder] = []
        # Rotate so that no subscription starves the others of free slots.
        for request in list(self._subscriptions):
            orders.extend(self._dispatch_request(request))
        if self._subscriptions:
            self._subscriptions.append(self._subscriptions.pop(0))
        return orders

    def _dispatch_request(self, request: _Request) -> list[TaskOrder]:
        workers = [w for _, w in sorted(self._workers.items()) if w.eligible]
        if isinstance(request, _EpisodeRequest):
            workers = [w for w in workers if w.slots]
            return self._dispatch_units(request, workers) if workers else []
        if isinstance(request, _FragmentRequest):
            workers = [w for w in workers if not w.leased]
            return self._dispatch_windows(request, workers) if workers else []
        raise InternalError(f"unknown request type {type(request).__name__}")

    def _dispatch_units(self, request: _EpisodeRequest, workers: list[_Worker]) -> list[TaskOrder]:
        capacity = {w.worker_id: self._capacity(w) for w in workers}
        if not any(w.wants_refill(capacity[w.worker_id]) for w in workers):
            return []  # the common case after a result: nothing to send
        # Top up every worker with room for a slice, not only the one that
        # asked: queues stay balanced, so when the request stops generating,
        # its last units are spread over the fleet instead of one worker
        # grinding through a block while the others idle.
        refilled = [
            w
            for w in workers
            if w.wants_refill(capacity[w.worker_id]) or capacity[w.worker_id] - w.units >= w.slots
        ]
        fleet_slots = sum(w.slots for w in workers)
        prior = self._mean_length.value
        picked: dict[int, list[int]] = {w.worker_id: [] for w in refilled}

        def room(worker: _Worker, limit: int) -> int:
            return limit - worker.units - len(picked[worker.worker_id])

        def give(worker: _Worker, count: int) -> bool:
            """Hands the worker up to ``count`` units; False once the request has none."""
            taken = request.take_many(count, fleet_slots, prior)
            picked[worker.worker_id].extend(taken)
            return len(taken) >= count  # count may be <= 0: a worker already full

        # First a unit for every idle env slot of every worker, then spare
        # units, a slice of its slots at a time to each worker in turn.
        more = all(give(w, room(w, w.slots)) for w in refilled)
        hungry = [w for w in refilled if room(w, capacity[w.worker_id]) > 0]
        while more and hungry:
            for worker in hungry:
                more = give(worker, min(room(worker, capacity[worker.worker_id]), worker.slots))
                if not more:
                    break
            hungry = [w for w in hungry if room(w, capacity[w.worker_id]) > 0]
        orders = []
        for worker in refilled:
            indices = picked[worker.worker_id]
            if not indices:
                continue
            task = self._new_task(worker, request)
            task.assigned = frozenset(indices)
            task.outstanding = set(indices)
            worker.units += len(indices)
            units = request.units(sorted(indices))
            task.seeds = {index: (env, policy) for index, env, policy in units}
            orders.append(self._order(task, request, units=units))
        return orders

    def _dispatch_windows(
        self, request: _FragmentRequest, workers: list[_Worker]
    ) -> list[TaskOrder]:
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
        running = {s for t in self._tasks.values() if t.is_windows for s in t.streams}
        waiting = [
            s
            for w in self._workers.values()
            if w.takeover and w.worker_id not in own
            for s in w.streams
        ]
        return tuple(sorted(s for s in {*self._orphans, *waiting} if s not in running))

    def _take_over(
        self,
        request: _FragmentRequest,
        takers: list[_Worker],
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
        request: _FragmentRequest,
        worker: _Worker,
        rounds: int,
        length: int,
        *,
        streams: tuple[int, ...] | None = None,
        takeover: bool = False,
        counted: bool = False,
    ) -> TaskOrder:
        task = self._new_task(worker, request)
        task.rounds = rounds
        task.streams = worker.streams if streams is None else streams
        task.takeover = takeover
        task.steps_per_window = len(task.streams) * length
        if not counted:
            request.expected_steps += rounds * task.steps_per_window
        return self._order(task, request, fragment_length=length, rounds=rounds)

    def _new_task(self, worker: _Worker, request: _Request) -> _Task:
        task_id = next(self._task_ids)
        self._last_task_id = task_id
        task = _Task(task_id, worker.worker_id, request.request_id)
        self._tasks[task_id] = task
        worker.tasks.add(task_id)
        request.tasks.add(task_id)
        return task

    def _order(
        self,
        task: _Task,
        request: _Request,
        *,
        units: tuple[Unit, ...] = (),
        fragment_length: int = 0,
        rounds: int = 0,
    ) -> TaskOrder:
        spec = request.spec
        return TaskOrder(
            task_id=task.task_id,
            worker_id=task.worker_id,
            request_id=request.request_id,
            mode=spec.mode,
            agent_version=spec.agent_version,
            env_generation=spec.env_generation,
            units=units,
            fragment_length=fragment_length,
            rounds=rounds,
            base_seed=spec.seed if spec.mode is Mode.FRAGMENTS else 0,
            streams=task.streams if self._workers[task.worker_id].takeover else (),
        )

    # --- results --------------------------------------------------------------

    def classify(
        self, worker_id: int, task_id: int, episode_indices: Iterable[int]
    ) -> ResultRuling:
        """Judges a result without changing any state.

        The coordinator calls this before decoding a result (no need to
        check a batch it will drop) and :meth:`complete` after.
        """
        task = self._tasks.get(task_id)
        if task is None:
            if 0 < task_id <= self._last_task_id:
                # Retired: its request ended or its units were cancelled.
                return ResultRuling(Verdict.IGNORE, reason=f"task {task_id} is over")
            return ResultRuling(Verdict.REJECT, reason=f"task {task_id} was never sent")
        request = self._requests[task.request_id]

        def outcome(verdict: Verdict, reason: str = "") -> ResultRuling:
            return ResultRuling(
                verdict, request.request_id, reason, subscription=request.subscription
            )

        if task.worker_id != worker_id:
            return outcome(Verdict.REJECT, f"task {task_id} belongs to another worker")
        indices = list(episode_indices)
        if not indices:
            return outcome(Verdict.REJECT, "a result must hold at least one episode")
        if task.is_windows:
            return outcome(Verdict.ACCEPT)  # every window is a new piece of its streams
        foreign = [i for i in indices if i not in task.assigned]
        if foreign:
            return outcome(
                Verdict.REJECT, f"episodes {foreign[:5]} are not units of task {task_id}"
            )
        again = [i for i in indices if i not in task.outstanding]
        if again or len(set(indices)) != len(indices):
            return outcome(
                Verdict.REJECT, f"episodes {(again or indices)[:5]} of task {task_id} came twice"
            )
        return outcome(Verdict.ACCEPT)

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
        indices = list(episode_indices)
        lengths = list(lengths)
        outcome = self.classify(worker_id, task_id, indices)
        if outcome.verdict is not Verdict.ACCEPT:
            return outcome
        task = self._tasks[task_id]
        request = self._requests[task.request_id]
        request.workers_used.add(worker_id)
        if isinstance(request, _EpisodeRequest):
            worker = self._workers[worker_id]
            for index, length in zip(indices, lengths, strict=True):
                task.outstanding.discard(index)
                worker.units -= 1
                request.complete(index, length)
            self._mean_length.add(sum(lengths), len(lengths))
            if not task.outstanding:
                self._retire(task)
        elif isinstance(request, _FragmentRequest):
            steps = sum(lengths)
            task.received += 1
            request.fragments += len(indices)
            request.accepted_steps += steps
            request.expected_steps -= task.steps_per_window
            if request.subscription:
                request.buffered_steps += steps
                self._workers[worker_id].windows -= 1
            if task.windows_left == 0:
                self._retire(task)
        return ResultRuling(
            Verdict.ACCEPT,
            request_id=request.request_id,
            done=request.done,
            subscription=request.subscription,
        )

    def _retire(self, task: _Task) -> None:
        del self._tasks[task.task_id]
        self._workers[task.worker_id].tasks.discard(task.task_id)
        self._requests[task.request_id].tasks.discard(task.task_id)


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
