"""The numpy form of a native worker's step index and step types: tests only.

The compiled ``step_index`` (rlfleet/worker/_finished_pass.c) writes, in one
pass over the steps, what these functions compute in about ten numpy passes;
tests/test_finished_pass.py checks it against them on random rows, and
tests/test_native_columns.py pins them to hand-worked examples.
"""

from __future__ import annotations

import numpy as np

from rlfleet.core import StepType

_MID = int(StepType.MID)
_FIRST = int(StepType.FIRST)


def split_rows(
    starts: np.ndarray, lengths: np.ndarray, slots: np.ndarray, capacity: int
) -> np.ndarray:
    """The flat ring index of every step of the episodes, in order.

    Episode i's steps are vector steps ``starts[i] .. starts[i] + lengths[i] - 1``
    of slot ``slots[i]``. The ring is stored slot by slot: step t of slot j
    is element ``j * capacity + t % capacity`` of a column's storage seen as
    ``(n_slots * capacity, ...)`` (``rlfleet.worker._native_columns.flat_column``).

    Args:
        starts: First vector step of each episode (int64).
        lengths: Steps of each episode (>= 1).
        slots: Slot of each episode.
        capacity: Rows of the ring.

    Returns:
        ``lengths.sum()`` flat indices: ``np.take(flat_column(c), index, axis=0)``
        gathers column c's steps of every episode, concatenated in order (one
        ``np.take`` copies rows several times faster than a 2-D fancy index).
    """
    offsets = np.cumsum(lengths) - lengths
    index = np.arange(int(lengths.sum()), dtype=np.int64)
    # Each step's ring row, below twice the capacity (an episode fits in the
    # ring); the rows past its end wrap. A subtraction where a comparison
    # holds, not a modulo: an integer division per step cost more than the
    # rest of the index.
    index += np.repeat(starts % capacity - offsets, lengths)
    np.subtract(index, capacity, out=index, where=index >= capacity)
    index += np.repeat(slots * capacity, lengths)
    return index


def step_types_of(lengths: np.ndarray, lasts: np.ndarray) -> np.ndarray:
    """Step types of whole episodes: FIRST, MID..., the episode's last type.

    A one-step episode's only step takes its last type (as garage).
    """
    ends = np.cumsum(lengths)
    step_types = np.full(int(ends[-1]) if len(ends) else 0, _MID, dtype=np.uint8)
    step_types[ends - lengths] = _FIRST
    step_types[ends - 1] = lasts
    return step_types
