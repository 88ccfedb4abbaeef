"""Episode units: the work a sampler hands to a worker, one episode each.

A unit carries the seeds of its episode, derived by the sampler (or the
coordinator) with :func:`rlfleet.core.seeding.episode_seeds`. A worker only uses
the seeds, never derives them: that is what makes episode k the same episode
whichever worker, env slot or retry runs it.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

from rlfleet._util.values import check_int
from rlfleet.core.seeding import SEED_BITS, episode_seeds, episode_seeds_many
from rlfleet.errors import ConfigError
from rlfleet.protocol.unit_columns import UnitColumns

_SEED_LIMIT = 1 << SEED_BITS


@dataclass(frozen=True, slots=True)
class EpisodeUnit:
    """One episode to run: its index within its request and its two seeds.

    Args:
        episode_index: Index of the episode within its request (>= 0).
            Batches are ordered by it.
        env_seed: Passed to ``env.reset(seed=env_seed)`` at the episode start.
        policy_seed: Seeds the episode's own action-sampling generator,
            ``numpy.random.default_rng(policy_seed)``.
        request: The sampling request the episode belongs to (>= 0); lets a
            worker cancel or take one request's episodes.

    Raises:
        ConfigError: If a field is not an int, is negative, or a seed does not
            fit in 32 bits (the wire carries seeds as uint32).
    """

    episode_index: int
    env_seed: int
    policy_seed: int
    request: int = 0

    def __post_init__(self) -> None:
        for name in ("episode_index", "env_seed", "policy_seed", "request"):
            # bool is an int subclass; a True index is a bug, not episode 1.
            check_int(f"EpisodeUnit.{name}", getattr(self, name), minimum=0)
        for name in ("env_seed", "policy_seed"):
            if getattr(self, name) >= _SEED_LIMIT:
                raise ConfigError(
                    f"EpisodeUnit.{name} must fit in {SEED_BITS} bits, got {getattr(self, name)}; "
                    "derive seeds with rlfleet.core.seeding.episode_seeds"
                )

    @classmethod
    def many(cls, units: UnitColumns, request: int) -> list[EpisodeUnit]:
        """The units of columns, all of one request.

        The checks of construction, made once over all rows: the rows the
        in-process sampler hands its workers (:meth:`UnitRow.many`), each
        made an object here.

        Raises:
            ConfigError: As the constructor.
        """
        return cls.of_rows(UnitRow.many(units, request))

    @classmethod
    def of_rows(cls, rows: list[UnitRow]) -> list[EpisodeUnit]:
        """The units of rows checked already (:meth:`UnitRow.many`, :meth:`UnitRow.of_columns`)."""
        # Each field through its slot's own setter, over all rows by map(),
        # whose loop runs in C: object.__setattr__ looks the name up again (a
        # unit cost about 6,700 instructions that way), and one Python-level
        # call per field and unit cost about 1,000 more than map's loop does.
        built: list[EpisodeUnit] = list(map(object.__new__, repeat(cls, len(rows))))
        for set_field, column in zip(_SLOT_SETTERS, zip(*rows, strict=True), strict=False):
            _consume(map(set_field, built, column))
        return built

    @classmethod
    def seeded(cls, base_seed: int, request: int, episode_index: int) -> EpisodeUnit:
        """Builds the unit of episode ``episode_index`` of ``request``.

        Args:
            base_seed: The sampler's seed.
            request: Index of the sampling request.
            episode_index: Index of the episode within the request.

        Returns:
            The unit, with seeds from :func:`rlfleet.core.seeding.episode_seeds`.
        """
        env_seed, policy_seed = episode_seeds(base_seed, request, episode_index)
        return cls(episode_index, env_seed, policy_seed, request)


def make_units(base_seed: int, request: int, episode_indices: Iterable[int]) -> list[EpisodeUnit]:
    """Builds the units of several episodes of one request.

    Args:
        base_seed: The sampler's seed.
        request: Index of the sampling request.
        episode_indices: The episodes, e.g. ``range(n)``.

    Returns:
        One :meth:`EpisodeUnit.seeded` unit per index, in the given order.
    """
    indices = list(episode_indices)
    seeds = episode_seeds_many(base_seed, request, indices)
    return [
        EpisodeUnit(index, env_seed, policy_seed, request)
        for index, (env_seed, policy_seed) in zip(indices, seeds, strict=True)
    ]


class UnitRow(NamedTuple):
    """A checked unit as a worker queues it: an :class:`EpisodeUnit`'s four fields, a tuple.

    Units arrive as columns: a remote worker's checked as their task arrives
    (:meth:`UnitColumns.check`), its TaskBook handing them to its VecWorker
    as rows (:meth:`of_columns`); the in-process sampler's checked and made
    rows at once (:meth:`many`). A VecWorker reads a row by field name as it
    reads an ``EpisodeUnit``. A row costs about half an ``EpisodeUnit`` to
    build (a native worker of 64 CartPoles builds one every 20-odd
    delivered steps), and is made an
    ``EpisodeUnit`` only where one leaves the VecWorker
    (``VecWorker.drop_queued``).
    """

    episode_index: int
    env_seed: int
    policy_seed: int
    request: int

    @classmethod
    def many(cls, units: UnitColumns, request: int) -> list[UnitRow]:
        """The rows of columns not checked yet, all of one request.

        The checks of :class:`EpisodeUnit`'s construction, made once over
        all rows (:meth:`UnitColumns.check`): the in-process sampler's units
        reach its workers this way. (A remote worker checks a task's columns
        as the task arrives, and makes rows of them as its TaskBook feeds
        them: :meth:`of_columns`.)

        Raises:
            ConfigError: As :class:`EpisodeUnit`'s constructor.
        """
        check_int("EpisodeUnit.request", request, minimum=0)
        units.check()
        return cls.of_columns(units, request, slice(None))

    @classmethod
    def of_columns(cls, units: UnitColumns, request: int, rows: slice) -> list[UnitRow]:
        """The rows of some rows of columns checked already, all of one request."""
        new = tuple.__new__  # a NamedTuple's own __new__ is a Python function
        columns = zip(
            units.episode_indices[rows].tolist(),
            units.env_seeds[rows].tolist(),
            units.policy_seeds[rows].tolist(),
            repeat(request),
        )
        return list(map(new, repeat(cls), columns))

    def unit(self) -> EpisodeUnit:
        """The row as an :class:`EpisodeUnit` (checked as any)."""
        return EpisodeUnit(*self)


#: A unit in a VecWorker's queue or slots: submitted, or a TaskBook's row.
QueuedUnit = EpisodeUnit | UnitRow

#: The setters of EpisodeUnit's slots, in field order (frozen: its own
#: ``__setattr__`` refuses).
_SLOT_SETTERS = tuple(
    getattr(EpisodeUnit, name).__set__
    for name in ("episode_index", "env_seed", "policy_seed", "request")
)

#: Runs an iterator to its end, keeping nothing (a deque of length 0).
_consume: Callable[[Iterable[object]], None] = collections.deque[object](maxlen=0).extend

__all__ = ["EpisodeUnit", "QueuedUnit", "UnitRow", "make_units"]
