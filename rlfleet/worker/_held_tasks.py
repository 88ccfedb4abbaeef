"""Tasks and Cancels of the lease data connection, in order with the Join stream's updates.

With ``rlfleet.data-tasks`` agreed, the coordinator sends a worker's Tasks
and Cancels on its lease data connection once it is accepted, while agent
and env updates stay on the Join stream. The two connections do not keep
each other's order, so a Task may arrive before the update it was made for
(its agent version or env generation ahead of what the worker runs), or
after the next one (behind it). :class:`HeldTasks` lets a Task into the
worker's task path only when the worker runs exactly its agent version
(unless it says -1: any) and env generation; holds one that is ahead until
the update that brings the worker there was applied; and drops one that is
behind, as :meth:`TaskBook.drop_stale` drops a task held when an update
arrives (versions and generations only grow, and the coordinator cancels a
version's tasks before it sends the next one).

A Cancel reaches the Tasks held here as well as those let through. A Cancel
of a task not seen yet (an id above every task seen this session: a
coordinator numbers its tasks in the order it sends them) is kept, the last
:data:`EARLY_CANCELS` of them, and applied when the Task arrives. A Cancel of
a task seen already is not kept: a later Task of the same id (a refill) may
bring back units it took, re-queued after another worker lost them.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import numpy as np

from rlfleet.protocol.join import TaskAssignment, TaskCancel
from rlfleet.protocol.modes import Mode

logger = logging.getLogger("rlfleet.worker")

#: Cancels of tasks not seen yet kept at most (the oldest forgotten first).
EARLY_CANCELS = 256


class HeldTasks:
    """The data connection's Tasks waiting for an update, and Cancels waiting for a Task.

    Used from the session's main thread only.

    Args:
        run: Hands a Task to the worker's task path (the Join stream's).
        cancel: Hands a Cancel to the worker's task path.
        installed: The agent version and env generation the worker runs now.
    """

    def __init__(
        self,
        run: Callable[[TaskAssignment], None],
        cancel: Callable[[TaskCancel], None],
        installed: Callable[[], tuple[int, int]],
    ) -> None:
        self._run = run
        self._cancel = cancel
        self._installed = installed
        self._held: list[TaskAssignment] = []
        self._early: collections.OrderedDict[int, list[TaskCancel]] = collections.OrderedDict()
        self._seen = False  # a Task came on the data connection this session
        self._last_id = 0  # the highest task id seen this session, on either carrier

    @property
    def held(self) -> int:
        """Tasks waiting for an update."""
        return len(self._held)

    def seen(self, task_id: int) -> None:
        """A Task of the Join stream (its Cancels come on either carrier)."""
        self._last_id = max(self._last_id, task_id)

    def on_task(self, task: TaskAssignment) -> None:
        """A Task of the data connection: run, held, or dropped as stale."""
        self.seen(task.task_id)
        if not self._seen:
            self._seen = True
            logger.info("this session's tasks come on the lease data channel")
        rest: TaskAssignment | None = task
        for cancel in self._early.pop(task.task_id, []):
            if rest is not None:
                rest = _without(rest, cancel)
        if rest is not None:
            self._place(rest)

    def on_cancel(self, cancel: TaskCancel) -> None:
        """A Cancel of the data connection: applied to a held Task, or to the task
        path, and kept if its Task has not arrived yet."""
        for i, task in enumerate(self._held):
            if task.task_id == cancel.task_id:
                rest = _without(task, cancel)
                if rest is None:
                    del self._held[i]
                else:
                    self._held[i] = rest
                return
        self._cancel(cancel)
        if cancel.task_id <= self._last_id:
            return
        self._early.setdefault(cancel.task_id, []).append(cancel)
        while len(self._early) > EARLY_CANCELS:
            self._early.popitem(last=False)

    def update_applied(self) -> None:
        """An agent or env update was applied: held Tasks it made runnable run,
        in the order they came; those it made stale are dropped."""
        held, self._held = self._held, []
        for task in held:
            self._place(task)

    def clear(self) -> None:
        """Drops every held Task (the worker leaves)."""
        self._held.clear()

    def _place(self, task: TaskAssignment) -> None:
        agent, generation = self._installed()
        wanted = task.agent_version
        if task.env_generation < generation or 0 <= wanted < agent:
            logger.debug(
                "dropped task %d of the data channel: made for agent version %d and env "
                "generation %d, this worker runs %d and %d",
                task.task_id,
                wanted,
                task.env_generation,
                agent,
                generation,
            )
        elif task.env_generation > generation or wanted > agent:
            self._held.append(task)
        else:
            self._run(task)


def _without(task: TaskAssignment, cancel: TaskCancel) -> TaskAssignment | None:
    """The task less the units a Cancel takes back (None: nothing of it is left)."""
    if not cancel.episode_indices:
        return None
    if task.mode == Mode.FRAGMENTS:
        return task  # as TaskBook.cancel: only a Cancel of the whole task drops windows
    dropped = np.asarray(cancel.episode_indices, dtype=np.int64)
    units = task.units.without(dropped)
    return task._replace(units=units) if len(units) else None
