"""The episode units of one task: every unit given, its seeds, and which are still out.

A worker holds one task per request, topped up by refills, so a task of a
long request gathers tens of thousands of units, and each result books
hundreds. The units are kept as columns sorted by episode index, with a
mask of those not back yet: a refill, a result's checks and its booking
are a few numpy operations each, whatever their number of units.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet._util.flags import all_set, any_set
from rlfleet.protocol.unit_columns import EMPTY_UNITS, UnitColumns, positions_in

with compiled("unit booking", "rlfleet/scheduling/_unit_book.c"):
    from rlfleet.scheduling._unit_book import outstanding


#: The columns of a task given no units yet.
_NO_INDICES = np.empty(0, dtype=np.int64)
_NO_FLAGS = np.empty(0, dtype=bool)


class TaskUnits:
    """A task's units as sorted columns, and which of them are outstanding."""

    def __init__(self) -> None:
        # Columns with room to grow: the first _count entries hold units.
        # Shared empty ones until the first add (a task per request and
        # worker: five arrays made per task were a tenth of a request's
        # first hand-out); none is ever written in place while empty.
        self._index = self._env = self._policy = _NO_INDICES
        self._out = _NO_FLAGS
        self._count = 0
        #: Units given and not back yet.
        self.outstanding = 0
        # Indices taken away from the task while outstanding (moved to
        # another worker, or re-queued), ascending: a result of the task
        # that names one is ignored, never booked here.
        self._taken = _NO_INDICES
        # The snapshot :attr:`given` made last, until units are added: a
        # task's results are checked against it batch after batch.
        self._given: UnitColumns = EMPTY_UNITS
        self._given_count = 0  # its length, compared without UnitColumns.__len__'s call

    def __len__(self) -> int:
        return self._count

    def add(self, units: UnitColumns) -> None:
        """Takes units given to the task (ascending by index, none held already)."""
        new = len(units)
        if not new:
            return
        held = self._count
        total = held + new
        if not held and units.episode_indices.flags.c_contiguous:
            # A new task's first units: its columns are theirs, with no room,
            # so that the next units grow new ones (the columns are never
            # written in place but past their held units); a request's first
            # hand-out makes no copy of them. (The unit book reads the index
            # column as a C-contiguous one: any other is copied below.)
            self._index = units.episode_indices
            self._env = units.env_seeds
            self._policy = units.policy_seeds
            self._out = np.ones(total, dtype=bool)
            self._count = total
            self.outstanding += new
            return
        follows = not held or units.episode_indices[0] > self._index[held - 1]
        if follows and total <= len(self._index):
            # Past the held units: a snapshot of them (given) is unchanged.
            for column, values in (
                (self._index, units.episode_indices),
                (self._env, units.env_seeds),
                (self._policy, units.policy_seeds),
            ):
                column[held:total] = values
            self._out[held:total] = True
        else:
            # New arrays, never the held ones rewritten: a result being
            # checked outside the scheduler's lock may read a snapshot.
            size = max(2 * total, 64)
            order = (
                None
                if follows
                else np.argsort(
                    np.concatenate([self._index[:held], units.episode_indices]), kind="stable"
                )
            )
            self._index, self._env, self._policy = (
                _grown(old[:held], values, size, order)
                for old, values in (
                    (self._index, units.episode_indices),
                    (self._env, units.env_seeds),
                    (self._policy, units.policy_seeds),
                )
            )
            out = np.zeros(size, dtype=bool)
            out[:total] = np.concatenate([self._out[:held], np.ones(new, dtype=bool)])[
                slice(None) if order is None else order
            ]
            self._out = out
        self._count = total
        self._given = EMPTY_UNITS  # made again when next asked for
        self._given_count = 0
        self.outstanding += new

    @property
    def given(self) -> UnitColumns:
        """Every unit given to the task, ascending by index (a snapshot: views
        that later refills leave as they are; the same object until units
        are added)."""
        n = self._count
        if n and self._given_count != n:
            self._given = UnitColumns(self._index[:n], self._env[:n], self._policy[:n])
            self._given_count = n
        return self._given

    def check(self, indices: np.ndarray, task_id: int) -> tuple[str, np.ndarray]:
        """Whether a result of these episodes can be booked.

        Args:
            indices: The result's episode indices (int64).
            task_id: The task, for the message.

        Returns:
            Why not ("" if it can), and where the units are held (for
            :meth:`complete`).
        """
        positions, found = positions_in(self._index[: self._count], indices)
        if not all_set(found):
            foreign = indices[~found][:5].tolist()
            return f"episodes {foreign} are not units of task {task_id}", positions
        out = self._out[positions]
        # A worker sends its episodes ascending (so none twice): sorting is for the others.
        if all_set(out) and all_set(indices[1:] > indices[:-1]):
            return "", positions
        again = indices[~out]
        ordered = np.sort(indices)
        if again.size or any_set(ordered[1:] == ordered[:-1]):
            shown = (again if again.size else indices)[:5].tolist()
            return f"episodes {shown} of task {task_id} came twice", positions
        return "", positions

    def all_outstanding(self, results: Sequence[object]) -> bool:
        """Whether every episode of these results is a unit of the task not
        back yet, none twice, each result holding one at least: one call,
        no array made (``_unit_book.c``).

        Args:
            results: The results' episode indices, each a tuple or list of
                ints (a result header's); any other form answers False.

        Returns:
            False also where :meth:`check` would accept indices in another
            form: False leaves the caller's general path to judge.
        """
        return outstanding(self._index, self._out, self._count, results, None, False)

    def take_back(self, indices: Iterable[int], lengths: Iterable[int]) -> bool:
        """Marks a result's units back if :meth:`all_outstanding` holds for it
        and its lengths are as many ints as its indices (tuples or lists);
        else changes nothing (any other form of either answers False).

        Returns:
            Whether it marked them.
        """
        if outstanding(self._index, self._out, self._count, (indices,), (lengths,), True):
            self.outstanding -= len(indices)  # type: ignore[arg-type]  # a tuple or list
            return True
        return False

    def complete(self, positions: np.ndarray) -> None:
        """Marks the units at these positions back (:meth:`check` found them outstanding)."""
        self._out[positions] = False
        self.outstanding -= len(positions)

    def holds_any(self, indices: np.ndarray) -> bool:
        """Whether any of these indices (int64, ascending) was ever given to the task."""
        held = self._count
        if not held or not indices.size or indices[-1] < self._index[0]:
            return False
        if indices[0] > self._index[held - 1]:
            # Past every unit given: a refill's new units, the common case,
            # need no search of the task's (often tens of thousands of) units.
            return False
        return any_set(positions_in(self._index[:held], indices)[1])

    def taken_in(self, indices: np.ndarray) -> np.ndarray:
        """Those of these indices that were taken away from the task (:meth:`take_away`)."""
        if not self._taken.size:
            return self._taken
        return indices[np.isin(indices, self._taken)]

    def outstanding_among(self, indices: np.ndarray) -> np.ndarray:
        """Those of these indices (int64) that are units of the task not back yet."""
        positions, found = positions_in(self._index[: self._count], indices)
        return indices[found & self._out[positions]]

    def take_away(self, indices: np.ndarray) -> None:
        """Takes outstanding units away from the task (int64 indices, each
        outstanding here): they are no longer its to complete, and a result
        of the task that names one is ignored (:meth:`taken_in`)."""
        if not indices.size:
            return
        positions, _ = positions_in(self._index[: self._count], indices)
        self._out[positions] = False
        self.outstanding -= len(indices)
        self._taken = np.union1d(self._taken, indices)

    def outstanding_indices(self) -> np.ndarray:
        """The indices of the units not back yet, ascending."""
        n = self._count
        return self._index[:n][self._out[:n]]


def _grown(held: np.ndarray, added: np.ndarray, size: int, order: np.ndarray | None) -> np.ndarray:
    """A column of ``size`` entries that starts with ``held`` then ``added`` (in ``order``)."""
    column = np.empty(size, dtype=np.int64)
    joined = np.concatenate([held, added])
    column[: len(joined)] = joined if order is None else joined[order]
    return column


__all__ = ["TaskUnits"]
