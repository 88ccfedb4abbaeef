"""An EpisodeBatch not joined yet: its per-step fields as lists of row pieces.

A remote worker's finished episodes view their rows in its step ring.
Joining them into an :class:`~rlfleet.core.EpisodeBatch` and then
serializing that batch into the outgoing messages copies the step data
twice; handing the serializer the pieces themselves copies it once, into
the message bytes (:func:`rlfleet.wire.serialize_batch_messages`). The bytes
are those of the joined batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import InvalidBatchError


@dataclass(frozen=True)
class RowPieces:
    """One array given as arrays to join along their first axis, not joined yet.

    Attributes:
        arrays: At least one array; all of one dtype and trailing shape.

    Raises:
        InvalidBatchError: If the arrays' dtypes or trailing shapes differ.
    """

    arrays: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        first = self.arrays[0]
        for array in self.arrays[1:]:
            if array.dtype != first.dtype or array.shape[1:] != first.shape[1:]:
                raise InvalidBatchError(
                    f"RowPieces: a piece of dtype {array.dtype} and shape {array.shape} "
                    f"does not join the first ({first.dtype}, {first.shape}); pass the "
                    "joined array instead"
                )


class TakenRows:
    """One array given as rows of another, not gathered yet: ``source.take(index, axis=0)``.

    A native worker's step columns are gathered straight into the message
    being written (:func:`rlfleet.wire.tensors.join_parts`): one copy, from
    the ring into the message, with no array in between.

    Args:
        source: A C-contiguous array whose rows are taken.
        index: The rows, in order (int64, each in ``[0, len(source))``).
    """

    __slots__ = ("dtype", "index", "nbytes", "shape", "source")

    def __init__(self, source: np.ndarray, index: np.ndarray) -> None:
        self.source = source
        self.index = index
        self.dtype = source.dtype
        self.shape = (len(index), *source.shape[1:])
        self.nbytes = len(index) * (source.nbytes // len(source) if len(source) else 0)

    def __len__(self) -> int:
        """Its bytes (as a part of a message being written, like a byte view)."""
        return self.nbytes

    def array(self) -> np.ndarray:
        """The rows gathered into an array of their own."""
        return self.source.take(self.index, axis=0)

    def take_into(self, buffer: memoryview, offset: int) -> None:
        """Writes the rows' bytes into ``buffer`` from ``offset``, with one ``np.take``.

        The rows are taken as opaque items of their size, which any offset
        holds (an array of the source's dtype there would be unaligned, and
        numpy would take into a temporary and copy it over).
        """
        rows = self.source
        if not self.nbytes:
            return
        item = np.dtype((np.void, self.nbytes // len(self.index)))
        opaque = rows.reshape(len(rows), -1).view(np.uint8).view(item).reshape(len(rows))
        out = np.frombuffer(buffer, item, len(self.index), offset)
        # mode="clip": numpy takes straight into ``out`` (mode="raise" buffers);
        # the index is the worker's own, in range by construction.
        opaque.take(self.index, out=out, mode="clip")


@dataclass(frozen=True)
class EpisodePieces:
    """The fields of an EpisodeBatch, the per-step ones possibly as RowPieces.

    Built only by rlfleet's worker from its finished segments, whose fields
    fit the spaces by construction (as :meth:`EpisodeBatch.prechecked`); the
    serializer writes it exactly as it writes the joined batch.

    Attributes:
        env_spec: As EpisodeBatch's; the other fields too.
    """

    env_spec: EnvSpec
    episode_infos: Mapping[str, np.ndarray]
    observations: np.ndarray | RowPieces | TakenRows
    last_observations: np.ndarray | TakenRows
    actions: np.ndarray | RowPieces | TakenRows
    rewards: np.ndarray | RowPieces | TakenRows
    env_infos: Mapping[str, Any]
    agent_infos: Mapping[str, Any]
    step_types: np.ndarray
    lengths: np.ndarray

    @property
    def n_episodes(self) -> int:
        """Number of episodes."""
        return len(self.lengths)

    @property
    def total_steps(self) -> int:
        """Number of steps over all episodes."""
        return int(self.lengths.sum())
