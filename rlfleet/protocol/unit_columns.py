"""Episode units as columns, the form they keep from the scheduler to a worker's slots.

A unit is one episode to run: its index within its request and its two
seeds. A worker's refill is hundreds of them, and a fleet of native vector
envs runs tens of thousands of episodes a second; one Python object per
unit at each stage (scheduler, Task message, worker intake) cost the
coordinator about 2 us and the worker about 1 us per episode. So units are
three int64 arrays from the moment the scheduler picks them until a worker
starts them, and each stage does a few numpy operations per batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from rlfleet.core.seeding import episode_seed_columns
from rlfleet.errors import ConfigError, InvalidValueError

#: Seeds are uint32 on the wire (rlfleet.core.seeding.SEED_BITS).
_SEED_LIMIT = 1 << 32

_new = object.__new__


class Unit(NamedTuple):
    """One episode to run, with its seeds: a row of :class:`UnitColumns`."""

    episode_index: int
    env_seed: int
    policy_seed: int


class UnitColumns:
    """Episode units as three equally long int64 columns.

    Iterating yields :class:`Unit` rows (for tests and the local path; the
    hot paths use the arrays).

    Args:
        episode_indices: Index of each episode within its request.
        env_seeds: Each episode's ``env.reset`` seed.
        policy_seeds: Each episode's action-sampling seed.

    Raises:
        InvalidValueError: If the columns are not 1-D or differ in length.
    """

    __slots__ = ("env_seeds", "episode_indices", "policy_seeds")

    def __init__(
        self, episode_indices: ArrayLike, env_seeds: ArrayLike, policy_seeds: ArrayLike
    ) -> None:
        self.episode_indices = np.asarray(episode_indices, dtype=np.int64)
        self.env_seeds = np.asarray(env_seeds, dtype=np.int64)
        self.policy_seeds = np.asarray(policy_seeds, dtype=np.int64)
        shapes = {c.shape for c in (self.episode_indices, self.env_seeds, self.policy_seeds)}
        if len(shapes) != 1 or self.episode_indices.ndim != 1:
            raise InvalidValueError(
                f"unit columns must be three 1-D arrays of one length, got shapes {sorted(shapes)}"
            )

    @classmethod
    def seeded(cls, base_seed: int, request_index: int, episode_indices: ArrayLike) -> UnitColumns:
        """The units of these episodes of a request, with their seeds
        (:func:`~rlfleet.core.seeding.episode_seed_columns`).

        Raises:
            InvalidValueError: If a seed component or index is negative.
        """
        indices = np.asarray(episode_indices, dtype=np.int64).reshape(-1)
        env, policy = episode_seed_columns(base_seed, request_index, indices)
        # Three 1-D int64 columns of one length: made without the checks (a
        # refill's, once per request at least).
        made = _new(cls)
        made.episode_indices = indices
        made.env_seeds = env
        made.policy_seeds = policy
        return made

    @classmethod
    def of_rows(cls, rows: Iterable[tuple[int, int, int]]) -> UnitColumns:
        """The columns of ``(episode_index, env_seed, policy_seed)`` rows."""
        table = np.array(list(rows), dtype=np.int64).reshape(-1, 3)
        return cls(table[:, 0], table[:, 1], table[:, 2])

    @classmethod
    def concat(cls, parts: Iterable[UnitColumns]) -> UnitColumns:
        """The units of ``parts``, one after the other."""
        parts = list(parts)
        if not parts:
            return EMPTY_UNITS
        if len(parts) == 1:
            return parts[0]
        return cls(
            np.concatenate([p.episode_indices for p in parts]),
            np.concatenate([p.env_seeds for p in parts]),
            np.concatenate([p.policy_seeds for p in parts]),
        )

    def __len__(self) -> int:
        return len(self.episode_indices)

    def __iter__(self) -> Iterator[Unit]:
        columns = (self.episode_indices, self.env_seeds, self.policy_seeds)
        return map(Unit._make, zip(*(c.tolist() for c in columns), strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, UnitColumns):
            return NotImplemented
        return (
            np.array_equal(self.episode_indices, other.episode_indices)
            and np.array_equal(self.env_seeds, other.env_seeds)
            and np.array_equal(self.policy_seeds, other.policy_seeds)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays

    def __repr__(self) -> str:
        return f"UnitColumns({len(self)} units: {self.episode_indices.tolist()[:8]}...)"

    def select(self, which: slice | np.ndarray) -> UnitColumns:
        """The units a slice, a boolean mask or positions pick."""
        if isinstance(which, slice):
            # Slices of three 1-D int64 columns of one length are too: made
            # without the checks (a refill's units are a slice per worker).
            made = _new(UnitColumns)
            made.episode_indices = self.episode_indices[which]
            made.env_seeds = self.env_seeds[which]
            made.policy_seeds = self.policy_seeds[which]
            return made
        return UnitColumns(
            self.episode_indices[which], self.env_seeds[which], self.policy_seeds[which]
        )

    def without(self, episode_indices: np.ndarray) -> UnitColumns:
        """The units whose episode index is not among ``episode_indices`` (a
        Cancel's: what is left of a task's units it took some back from)."""
        return self.select(~np.isin(self.episode_indices, episode_indices))

    def sorted(self) -> UnitColumns:
        """The units in ascending episode index order."""
        order = np.argsort(self.episode_indices, kind="stable")
        return self.select(order)

    def check(self) -> None:
        """Checks every unit at once, as ``EpisodeUnit`` checks one.

        Raises:
            ConfigError: If an index or seed is negative, or a seed does not
                fit in 32 bits (the wire carries seeds as uint32), naming the field.
        """
        if not len(self):
            return
        for name, column in (
            ("episode_index", self.episode_indices),
            ("env_seed", self.env_seeds),
            ("policy_seed", self.policy_seeds),
        ):
            low, high = int(column.min()), int(column.max())
            if low < 0:
                raise ConfigError(f"EpisodeUnit.{name} must be an int >= 0, got {low}")
            if name != "episode_index" and high >= _SEED_LIMIT:
                raise ConfigError(
                    f"EpisodeUnit.{name} must fit in 32 bits, got {high}; derive seeds with "
                    "rlfleet.core.seeding.episode_seeds"
                )

    def positions(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``indices`` is held, for columns sorted by episode index.

        Args:
            indices: Episode indices to look up (int64).

        Returns:
            ``(positions, found)``: each index's position in these columns,
            and whether it is held at all (where not, its position is
            meaningless).
        """
        return positions_in(self.episode_indices, indices)


def positions_in(held: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`UnitColumns.positions` in the sorted column ``held``."""
    if not len(held):
        return np.zeros(len(indices), dtype=np.intp), np.zeros(len(indices), dtype=bool)
    # The array's method: numpy's function wrapper costs more than the search.
    positions = np.minimum(held.searchsorted(indices), len(held) - 1)
    return positions, held[positions] == indices


def _frozen_empty() -> np.ndarray:
    column = np.empty(0, dtype=np.int64)
    column.flags.writeable = False
    return column


#: No units.
EMPTY_UNITS = UnitColumns(_frozen_empty(), _frozen_empty(), _frozen_empty())

__all__ = ["EMPTY_UNITS", "Unit", "UnitColumns", "positions_in"]
