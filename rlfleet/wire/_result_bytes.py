"""The byte-level checks of :class:`~rlfleet.wire.result_layout.ResultLayoutCheck`'s one pass.

int64 columns written as the wire writes them, a task's units' seeds, and
a result's uint8 step types checked without numpy.
"""

from __future__ import annotations

import itertools
import operator
import struct

import numpy as np

from rlfleet._util.flags import all_set
from rlfleet.core.step_type import StepType
from rlfleet.protocol.unit_columns import UnitColumns

_FIRST, _MID = bytes([StepType.FIRST]), bytes([StepType.MID])
_ENDS = bytes([StepType.TERMINAL, StepType.TIMEOUT])
_ONE, _NEXT = 1, (1).__add__


def int64s(values: tuple[int, ...]) -> bytes:
    """Little-endian int64 bytes of ``values`` (raises struct.error past int64)."""
    return struct.pack(f"<{len(values)}q", *values)


def repeated(value: int, count: int) -> bytes:
    """Little-endian int64 bytes of ``value``, ``count`` times."""
    return value.to_bytes(8, "little", signed=True) * count


def unit_seeds(units: UnitColumns, indices: tuple[int, ...], index_bytes: bytes) -> bytes | None:
    """The env seeds, then the policy seeds, of the units ``indices`` (ascending)
    as int64 bytes; None if the task does not hold one of them."""
    held = units.episode_indices
    start = int(held.searchsorted(indices[0]))
    run = slice(start, start + len(indices))
    if held[run].tobytes() == index_bytes:  # a run of the task's units, as a task's results are
        return units.env_seeds[run].tobytes() + units.policy_seeds[run].tobytes()
    positions, found = units.positions(np.frombuffer(index_bytes, np.int64))
    if not all_set(found):
        return None
    return units.env_seeds[positions].tobytes() + units.policy_seeds[positions].tobytes()


def step_types_pass(types: bytes, lengths: tuple[int, ...]) -> bool:
    """:func:`~rlfleet.wire.result_checks.step_type_problems` of whole episodes
    finding none, on a result's uint8 step types, without numpy.

    Each episode's last step is TERMINAL or TIMEOUT, its first (if it has
    two or more) FIRST; then a count of MID steps as large as the steps
    left over means every other step is MID. The positions are walked by
    itertools and bytes in C: no Python line runs per episode.
    """
    lasts = list(itertools.accumulate(lengths, initial=-1))  # the step before each episode
    # Each episode of two steps or more: the step after the one before it.
    firsts = list(map(_NEXT, itertools.compress(lasts, map(_ONE.__lt__, lengths))))
    del lasts[0]
    # Every position read in one call (through a map, each read was a call
    # of its own, about half of this check for 80 episodes); the leading 0
    # keeps the answer a tuple for a single episode.
    found = bytes(operator.itemgetter(0, *lasts, *firsts)(types))
    ends = len(lasts) + 1
    if found[1:ends].translate(None, _ENDS):
        return False  # a last step neither TERMINAL nor TIMEOUT
    if found[ends:].translate(None, _FIRST):
        return False
    return types.count(_MID) == len(types) - len(lasts) - len(firsts)


__all__ = ["int64s", "repeated", "step_types_pass", "unit_seeds"]
