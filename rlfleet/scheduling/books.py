"""The scheduler's books: workers, tasks and requests, and how tasks come and go.

Every other part of the scheduler (unit planning in ``units``, tail moves
in ``tail_moves``, fragment windows in ``windows``, lost workers and their
streams in ``failures``)
reads and changes the state kept here; :class:`Books` is the one place a
task is created, retired or cancelled, so the counts on its worker and
request stay in step.
"""

from __future__ import annotations

import abc
import itertools
from dataclasses import dataclass, field

import numpy as np

from rlfleet._util.prebuilt import prebuilt
from rlfleet.protocol.modes import Footer, Mode
from rlfleet.protocol.unit_columns import EMPTY_UNITS, UnitColumns
from rlfleet.scheduling.orders import CancelOrder, RequestSpec, TaskOrder
from rlfleet.scheduling.task_units import TaskUnits


@dataclass
class WorkerLoad:
    """A worker as the scheduler sees it: its slots, streams and the work it holds."""

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
    #: Steps of the largest result it sent since the env last changed: what
    #: it reports at a time, so what one refill must cover (UnitPlanner).
    result_steps: int = 0
    #: Whether it may be handed episode units: eligible, with an env slot no
    #: leased env holds (Scheduler._dispatch_request, UnitPlanner.surely_full).
    #: A plain attribute, kept by :meth:`set_eligible` and :meth:`set_leased`
    #: (the only writers of ``eligible`` and ``leased``): surely_full reads it
    #: for every worker after every result, and a property (a Python call per
    #: worker) made a dispatch to 16 full workers take 39% more instructions.
    takes_units: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self._keep_takes_units()

    def set_eligible(self, eligible: bool) -> None:
        """Whether it may get new work (keeps :attr:`takes_units`)."""
        self.eligible = eligible
        self._keep_takes_units()

    def set_leased(self, leased: int) -> None:
        """How many of its env slots leased envs hold (keeps :attr:`takes_units`)."""
        self.leased = leased
        self._keep_takes_units()

    def _keep_takes_units(self) -> None:
        self.takes_units = self.eligible and self.num_envs > self.leased

    @property
    def slots(self) -> int:
        """Env slots left for sampling."""
        return max(self.num_envs - self.leased, 0)

    def refill_mark(self, capacity: int, low: int = 0) -> int:
        """The most units the worker holds when it is to be topped up (to
        ``capacity`` units): it wants a refill while ``units`` is at most this.

        At once when an env slot may be idle; otherwise only once half of
        its spare units are used, so that refills are few and large, or
        once no more than ``low`` of them are left, whichever comes first;
        never when it holds ``capacity``.

        Args:
            capacity: The units it may hold.
            low: Spare units below which it is topped up even before half
                of them are used (UnitPlanner: two of its results).
        """
        slots = self.slots
        return max(slots - 1, min(capacity - 1, slots + max((capacity - slots) // 2, low)))


@dataclass
class TaskRecord:
    """A task sent and not retired: the units or windows it still owes."""

    task_id: int
    worker_id: int
    request_id: int
    # Episode tasks: every unit given (refills add to it), with the seeds
    # results are checked against, and those not back yet.
    units: TaskUnits = field(default_factory=TaskUnits)
    # Fragment tasks (rounds >= 1): windows asked for and received.
    rounds: int = 0
    received: int = 0
    steps_per_window: int = 0
    streams: tuple[int, ...] = ()
    takeover: bool = False  # runs orphaned streams, not its worker's own

    @property
    def is_windows(self) -> bool:
        """Whether it runs fragment windows (not episode units)."""
        return self.rounds > 0

    @property
    def windows_left(self) -> int:
        """Windows asked for and not received yet."""
        return self.rounds - self.received


class RequestState(abc.ABC):
    """State shared by every kind of request (see units.py and windows.py)."""

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
    def drop(self, task: TaskRecord) -> None:
        """Forgets the work a cancelled task of this request still owed."""

    @abc.abstractmethod
    def lose(self, task: TaskRecord, *, keep_streams: bool) -> int:
        """Takes back the work a lost worker's task still owed.

        Returns:
            The number of episode units re-queued.
        """

    @abc.abstractmethod
    def footer(self) -> Footer:
        """What the request's answer ends with."""


class Books:
    """The workers, live tasks and live requests of one scheduler."""

    def __init__(self) -> None:
        self.workers: dict[int, WorkerLoad] = {}
        self.tasks: dict[int, TaskRecord] = {}
        self.requests: dict[int, RequestState] = {}
        self._task_ids = itertools.count(1)
        self.last_task_id = 0

    def new_task(self, worker: WorkerLoad, request: RequestState) -> TaskRecord:
        """Opens a task of ``request`` on ``worker``."""
        task_id = next(self._task_ids)
        self.last_task_id = task_id
        task = TaskRecord(task_id, worker.worker_id, request.request_id)
        self.tasks[task_id] = task
        worker.tasks.add(task_id)
        request.tasks.add(task_id)
        return task

    def live_task(self, worker: WorkerLoad, request: RequestState) -> TaskRecord | None:
        """The worker's newest live task of ``request``, if it has one (episode
        requests hold one, or more once units came back to the worker after
        they were taken from one of its tasks)."""
        live = None
        for task_id in worker.tasks:
            task = self.tasks[task_id]
            mine = task.request_id == request.request_id and not task.is_windows
            if mine and (live is None or task_id > live.task_id):
                live = task
        return live

    def task_for(
        self, worker: WorkerLoad, request: RequestState, indices: np.ndarray
    ) -> TaskRecord:
        """The task that takes these units (ascending) on ``worker``: its live
        task of the request, unless that task held one of them before (they
        were taken from it: a result of it that names one is ignored), then
        a new one."""
        task = self.live_task(worker, request)
        if task is None or task.units.holds_any(indices):
            task = self.new_task(worker, request)
        return task

    def retire(self, task: TaskRecord) -> None:
        """Closes a task whose work all came back."""
        del self.tasks[task.task_id]
        self.workers[task.worker_id].tasks.discard(task.task_id)
        self.requests[task.request_id].tasks.discard(task.task_id)

    def cancel(self, task: TaskRecord, request: RequestState) -> CancelOrder:
        """Drops a task's outstanding work from the books; the order tells its worker."""
        del self.tasks[task.task_id]
        request.drop(task)
        worker = self.workers.get(task.worker_id)
        if worker is not None:
            worker.tasks.discard(task.task_id)
            worker.units -= task.units.outstanding
            if request.subscription and task.is_windows:
                worker.windows -= task.windows_left
        if task.is_windows:
            return CancelOrder(task.worker_id, task.task_id)
        indices = task.units.outstanding_indices().tolist()
        return CancelOrder(task.worker_id, task.task_id, tuple(indices))

    def order(
        self,
        task: TaskRecord,
        request: RequestState,
        *,
        units: UnitColumns = EMPTY_UNITS,
        fragment_length: int = 0,
        rounds: int = 0,
    ) -> TaskOrder:
        """The order that sends ``task`` to its worker (made without the frozen
        ``__init__``: its fields are the books' own)."""
        spec = request.spec
        return prebuilt(
            TaskOrder,
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
            streams=task.streams if self.workers[task.worker_id].takeover else (),
        )
