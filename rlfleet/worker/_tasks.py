"""The tasks a remote worker holds, and the units it has not started yet.

The coordinator may hand a worker more units than it has env slots (the
prefetch). They wait here, not in the VecWorker: units given to the
VecWorker start at its next step, while units still here can be dropped at
once when the worker leaves or a task is cancelled. When the VecWorker holds
fewer units than it has slots, it is handed a block: enough for every slot
plus as many again (:data:`BLOCK_SHARE`), so that a slot that finished an
episode takes the next one on the following step, exactly as with the
VecWorker's own queue, while a hand-off (whose fixed cost is several units'
worth, and whose units cost less each the more of them are built at once)
happens once every twenty-odd vector steps of a native worker, whose slots
end a few episodes at each. While
leased envs hold slots no block is handed, and units queued beyond the
slots the leases leave free come back here. Units wait as the columns their Task brought
(:class:`~rlfleet.protocol.unit_columns.UnitColumns`): each becomes a
:class:`~rlfleet.worker.units.UnitRow` (a tuple, read as an ``EpisodeUnit``
is) only when it is handed to the VecWorker.

Inside the VecWorker a unit's ``request`` is its task id, so the worker can
take, cancel and report each task's episodes separately.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from rlfleet.protocol.join import TaskAssignment
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.stream_replay import StreamReplay
from rlfleet.protocol.unit_columns import EMPTY_UNITS, UnitColumns
from rlfleet.worker.units import EpisodeUnit, UnitRow
from rlfleet.worker.vec import VecWorker

#: A block handed to the VecWorker holds its slots over this many beyond the
#: free ones: a full set of slots more (a quarter more cost a native worker
#: about 60 instructions per step more, its blocks of about 18 units handed
#: over three times as often, each unit built dearer).
BLOCK_SHARE = 1


@dataclass
class EpisodeTask:
    """A STEPS or EPISODES task: units to run, each reported once.

    Attributes:
        task_id: The coordinator's task id.
        request_id: The learner request the task serves.
        agent_version: The version its episodes must be produced by (-1: latest).
        env_generation: The env generation its episodes must come from.
        remaining: Episode indices neither reported nor cancelled.
    """

    task_id: int
    request_id: int
    agent_version: int
    env_generation: int
    remaining: set[int] = field(default_factory=set)


@dataclass
class FragmentTask:
    """A FRAGMENTS task: ``rounds_left`` windows of ``fragment_length`` steps."""

    task_id: int
    request_id: int
    agent_version: int
    env_generation: int
    fragment_length: int
    base_seed: int
    rounds_left: int
    #: The streams its slots run (empty: Welcome.first_stream + slot).
    streams: tuple[int, ...] = ()
    #: Streams to rebuild before the first window (then cleared).
    replays: list[StreamReplay] = field(default_factory=list)


Task = EpisodeTask | FragmentTask


@dataclass
class _Waiting:
    """Units of one task that arrived together, those before ``start`` handed on."""

    task_id: int
    units: UnitColumns
    start: int = 0

    @property
    def left(self) -> int:
        return len(self.units) - self.start


def book_entry(assignment: TaskAssignment) -> tuple[Task, UnitColumns]:
    """The TaskBook's task of an assignment and, for episodes, its units, checked.

    Raises:
        ConfigError: If a unit's index or seeds are out of range.
    """
    a = assignment
    if a.mode == Mode.FRAGMENTS:
        fragments = FragmentTask(
            a.task_id,
            a.request_id,
            a.agent_version,
            a.env_generation,
            a.fragment_length,
            a.base_seed,
            a.rounds,
            a.streams,
            list(a.replays),
        )
        return fragments, EMPTY_UNITS
    episodes = EpisodeTask(a.task_id, a.request_id, a.agent_version, a.env_generation)
    a.units.check()
    return episodes, a.units


class TaskBook:
    """The worker's tasks, in arrival order, and their unstarted units.

    Args:
        vec: The VecWorker the units run on.
        leased: How many of the worker's env slots leased envs hold now
            (read before every vector step; a C call, as a session's
            ``LeaseHost.hosted_count`` is; default ``int``: none): units
            start only on the slots they leave free, and on one at least,
            so that units already held always finish (the coordinator
            sends none to a worker whose slots are all leased).
    """

    def __init__(self, vec: VecWorker, leased: Callable[[], int] = int) -> None:
        self._vec = vec
        self._leased = leased
        self.episode_tasks: dict[int, EpisodeTask] = {}
        self.fragment_tasks: collections.deque[FragmentTask] = collections.deque()
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._waiting_count = 0

    @property
    def queued_units(self) -> int:
        """Units waiting here plus those queued in the VecWorker."""
        return self._waiting_count + self._vec.queued_count

    def add(self, task: Task, units: UnitColumns = EMPTY_UNITS) -> None:
        """Takes a task (its mode already checked) and, for episodes, its units.

        Args:
            task: The task; an EpisodeTask already held gains the units.
            units: An EpisodeTask's units, checked (:func:`book_entry`).
        """
        if isinstance(task, FragmentTask):
            if task.rounds_left:
                self.fragment_tasks.append(task)
            return
        entry = self.episode_tasks.setdefault(task.task_id, task)
        if len(units):
            entry.remaining.update(units.episode_indices.tolist())
            self._waiting.append(_Waiting(task.task_id, units))
            self._waiting_count += len(units)
            # Units are fed a few at a time: their generators' states are
            # computed now, for the whole task in one vectorised call.
            self._vec.prepare(units)
        self.feed()

    def feed(self) -> None:
        """Gives the VecWorker a block of units once it holds fewer than its slots.

        With leased envs, it holds one per slot they leave free (one at
        least), and gives back what it queued beyond.
        """
        vec = self._vec
        active, queued = vec.unit_counts()
        n, held = vec.n_envs, active + queued
        if held >= n and not queued:
            return  # every slot runs, nothing queued
        leased = self._leased()
        cap = max(n - leased, 1)
        if leased:
            if held > cap and queued:
                self._take_back(held - cap)
            room = cap - held
        elif held >= n:
            return  # the block's units wait in the VecWorker (the common case)
        else:
            room = n - held + n // BLOCK_SHARE
        if room <= 0 or not self._waiting_count:
            return
        fed: list[UnitRow] = []
        while room > 0 and self._waiting:
            first = self._waiting[0]
            count = min(room, first.left)
            rows = slice(first.start, first.start + count)
            fed += UnitRow.of_columns(first.units, first.task_id, rows)
            first.start += count
            room -= count
            if not first.left:
                self._waiting.popleft()
        if fed:
            self._waiting_count -= len(fed)
            vec.submit_rows(fed)

    def _take_back(self, surplus: int) -> None:
        """Moves up to ``surplus`` of the VecWorker's last queued units back here, in order."""
        units = self._vec.drop_queued()
        back = units[max(len(units) - surplus, 0) :]
        if len(back) < len(units):
            self._vec.submit(units[: len(units) - len(back)])
        # Consecutive units of one task become one entry, at the front.
        groups: list[list[EpisodeUnit]] = []
        for unit in back:
            if groups and groups[-1][0].request == unit.request:
                groups[-1].append(unit)
            else:
                groups.append([unit])
        for group in reversed(groups):
            columns = UnitColumns(
                [u.episode_index for u in group],
                [u.env_seed for u in group],
                [u.policy_seed for u in group],
            )
            self._waiting.appendleft(_Waiting(group[0].request, columns))
        self._waiting_count += len(back)

    def reported(self, task_id: int, episode_indices: Iterable[int]) -> None:
        """Marks episodes as sent; forgets the task once all of them are."""
        entry = self.episode_tasks.get(task_id)
        if entry is None:
            return
        entry.remaining.difference_update(episode_indices)
        if not entry.remaining:
            del self.episode_tasks[task_id]

    def cancel(self, task_id: int, episode_indices: Iterable[int] = ()) -> None:
        """Drops units of a task wherever they are (all of them if none are named)."""
        indices = set(episode_indices)
        self.fragment_tasks = collections.deque(
            t for t in self.fragment_tasks if t.task_id != task_id or indices
        )
        entry = self.episode_tasks.get(task_id)
        if entry is None:
            return
        if not indices:
            self.drop([task_id])
            return
        dropped = np.fromiter(indices, dtype=np.int64, count=len(indices))
        for waiting in self._waiting:
            if waiting.task_id == task_id:
                rest = waiting.units.select(slice(waiting.start, None))
                waiting.units = rest.without(dropped)
                waiting.start = 0
        self._keep_waiting(lambda waiting: bool(waiting.left))
        self._vec.cancel(indices, request=task_id)
        self.reported(task_id, indices)

    def drop(self, task_ids: Iterable[int]) -> None:
        """Forgets tasks and drops all their units."""
        ids = set(task_ids)
        if not ids:
            return
        self._keep_waiting(lambda waiting: waiting.task_id not in ids)
        self.fragment_tasks = collections.deque(
            t for t in self.fragment_tasks if t.task_id not in ids
        )
        for task_id in ids:
            if self.episode_tasks.pop(task_id, None) is not None:
                self._vec.cancel(request=task_id)

    def drop_stale(
        self, *, agent_version: int | None = None, env_generation: int | None = None
    ) -> list[int]:
        """Drops tasks an update made impossible to serve; returns their ids.

        A task bound to another agent version (not -1) or env generation can
        no longer be produced as asked; the coordinator cancels such tasks
        before it sends an update, so this only catches stragglers.
        """
        stale = [
            task.task_id
            for task in self.tasks()
            if (agent_version is not None and task.agent_version not in (-1, agent_version))
            or (env_generation is not None and task.env_generation != env_generation)
        ]
        self.drop(stale)
        return stale

    def drop_unstarted(self) -> None:
        """Drops every unit not started yet and every fragment task (leaving).

        Units the VecWorker runs go on to their end (at most one per slot);
        those it holds unstarted are dropped too.
        """
        self._vec.drop_queued()
        self._keep_waiting(lambda waiting: False)
        self.fragment_tasks.clear()

    def _keep_waiting(self, keep: Callable[[_Waiting], bool]) -> None:
        """Keeps the waiting units ``keep`` holds to, in order; drops the others."""
        self._waiting = collections.deque(w for w in self._waiting if keep(w))
        self._waiting_count = sum(w.left for w in self._waiting)

    def tasks(self) -> list[Task]:
        """Every task held, episode tasks first."""
        return [*self.episode_tasks.values(), *self.fragment_tasks]

    def running_request(self) -> list[Task]:
        """The tasks of the request of the oldest task held (for errors).

        A VecWorker error does not say which task its episode belonged to;
        the coordinator serves one request at a time, so the oldest task's
        request is the one whose episodes are running.
        """
        tasks = sorted(self.tasks(), key=lambda t: t.task_id)
        if not tasks:
            return []
        return [t for t in tasks if t.request_id == tasks[0].request_id]
