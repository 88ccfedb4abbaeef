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
    observations: np.ndarray | RowPieces
    last_observations: np.ndarray
    actions: np.ndarray | RowPieces
    rewards: np.ndarray | RowPieces
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
