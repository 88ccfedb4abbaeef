"""A native worker's finished episodes, split from its step columns with array operations.

A native backend (:mod:`rlfleet.worker._native_slots`) steps every slot at
once, and its episodes end a few at a time, nearly every vector step. So a
finished episode costs only a few Python operations: it becomes a
:class:`Span` (its slot, first vector step and length in the step ring's
columns), never a set of arrays. The arrays are made when episodes are
taken, for all of them at once: :func:`split_rows` turns the spans into one
(row, slot) index pair per step, and each column is gathered with one fancy
index, straight into a contiguous array in the batch's order. Those arrays
are the batch's fields and what the wire encoding joins
(:func:`rlfleet.wire.serialize_batch_messages` copies each one once).

So a step's data is copied once after stepping, whatever the episodes'
lengths: into the batch (:func:`build_span_batch`) or into the pieces a
remote worker serializes (:func:`build_span_pieces`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlfleet.core._arrays import NestedArrays
from rlfleet.core._pieces import EpisodePieces
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.worker._episode_buffer import Columns, concat_infos

_MID = int(StepType.MID)
_FIRST = int(StepType.FIRST)


@dataclass(slots=True, weakref_slot=True)
class Span:
    """A finished episode of a native worker: where its steps are in the ring.

    The ring keeps its rows while the span lives (``StepRing.pin``); its
    ``columns`` are the ring's arrays when it ended (a ring that grows, or
    whose policy changes, moves to new arrays; the old ones live on with
    the spans in them).

    Attributes:
        key: Sort key (request, episode index).
        infos: Its episode_infos values (``EPISODE_INFO_KEYS`` order).
        slot: The slot (column) it ran on.
        start: Vector step of its first step; its observations are the rows
            ``start .. start + length`` (the last one is its last observation).
        length: Number of steps.
        last: StepType of its last step (TERMINAL or TIMEOUT).
        columns: The ring's arrays its rows are in.
        env_spec: Spec of the env that produced it.
    """

    key: tuple[int, ...]
    infos: tuple[int, ...]
    slot: int
    start: int
    length: int
    last: int
    columns: Columns
    env_spec: EnvSpec


def split_rows(
    starts: np.ndarray, lengths: np.ndarray, slots: np.ndarray, capacity: int, n_slots: int
) -> np.ndarray:
    """The flat ring index of every step of the episodes, in order.

    Episode i's steps are vector steps ``starts[i] .. starts[i] + lengths[i] - 1``
    of slot ``slots[i]``; step t of slot j is row ``t % capacity`` of the
    ring, flat index ``(t % capacity) * n_slots + j`` of a column reshaped
    to ``(capacity * n_slots, ...)``.

    Args:
        starts: First vector step of each episode (int64).
        lengths: Steps of each episode (>= 1).
        slots: Slot of each episode.
        capacity: Rows of the ring.
        n_slots: Slots (columns) of the ring.

    Returns:
        ``lengths.sum()`` flat indices: ``np.take(flat_column, index, axis=0)``
        gathers a column's steps of every episode, concatenated in order (one
        ``np.take`` copies rows several times faster than a 2-D fancy index).
    """
    offsets = np.cumsum(lengths) - lengths
    index = np.arange(int(lengths.sum()), dtype=np.int64)
    index += np.repeat(starts - offsets, lengths)
    index %= capacity
    index *= n_slots
    index += np.repeat(slots, lengths)
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


def _gather(spans: Sequence[Span]) -> dict[str, Any]:
    """The fields of the spans' batch (one run of spans in the same columns)."""
    columns = spans[0].columns
    capacity = columns.capacity
    n_slots = columns.rewards.shape[1]
    n = len(spans)
    meta = np.fromiter(
        itertools.chain.from_iterable((s.start, s.length, s.slot, s.last) for s in spans),
        dtype=np.int64,
        count=4 * n,
    ).reshape(n, 4)
    starts, lengths, slots = meta[:, 0], meta[:, 1], meta[:, 2]
    index = split_rows(starts, lengths, slots, capacity, n_slots)
    assert columns.actions is not None  # a span ended after a step

    def take(column: np.ndarray, at: np.ndarray = index) -> np.ndarray:
        # The native ring is stored row by row: the reshape is a view.
        return np.take(column.reshape(capacity * n_slots, *column.shape[2:]), at, axis=0)

    env_infos: NestedArrays = {}
    if columns.obs_flags is not None:
        # nan_observations="flag": a step is flagged if its observation or the next one is.
        after = index + n_slots
        after[after >= capacity * n_slots] -= capacity * n_slots
        env_infos["nonfinite_obs"] = take(columns.obs_flags) | take(columns.obs_flags, after)
    last = (starts + lengths) % capacity * n_slots + slots
    return {
        "observations": take(columns.obs),
        "last_observations": take(columns.obs, last),
        "actions": take(columns.actions),
        "rewards": take(columns.rewards),
        "agent_infos": {key: take(value) for key, value in columns.agent_infos.items()},
        "env_infos": env_infos,
        "lengths": lengths.copy(),
        "lasts": meta[:, 3],
    }


def _fields(spans: Sequence[Span], info_keys: Sequence[str]) -> dict[str, Any]:
    """All fields of the spans' batch, in the spans' order."""
    # Nearly always one run: the ring's arrays change only when it grows or
    # the policy's outputs change, and a take holds a few hundred steps.
    runs = [list(run) for _, run in itertools.groupby(spans, key=lambda s: id(s.columns))]
    parts = [_gather(run) for run in runs]
    if len(parts) == 1:
        fields = parts[0]
    else:
        fields = {
            key: np.concatenate([p[key] for p in parts])
            for key in ("observations", "last_observations", "actions", "rewards", "lengths")
        }
        fields["lasts"] = np.concatenate([p["lasts"] for p in parts])
        fields["agent_infos"] = concat_infos(
            [p["agent_infos"] for p in parts], "agent info", "agent_infos"
        )
        fields["env_infos"] = concat_infos([p["env_infos"] for p in parts], "env info", "env_infos")
    table = np.array([s.infos for s in spans], dtype=np.int64).T
    fields["episode_infos"] = dict(zip(info_keys, table, strict=True))
    fields["step_types"] = step_types_of(fields["lengths"], fields.pop("lasts"))
    return fields


def build_span_batch(
    env_spec: EnvSpec, spans: Sequence[Span], info_keys: Sequence[str], *, actions_checked: bool
) -> EpisodeBatch:
    """The spans' EpisodeBatch, in the given order (each column gathered once).

    Its fields fit the spaces by construction (the ring has their shapes
    and dtypes, the observations were checked while stepping), so it is
    not re-checked, except its actions unless ``actions_checked``.
    """
    return EpisodeBatch.prechecked(
        env_spec=env_spec, **_fields(spans, info_keys), check_actions=not actions_checked
    )


def build_span_pieces(
    env_spec: EnvSpec, spans: Sequence[Span], info_keys: Sequence[str], *, actions_checked: bool
) -> EpisodePieces:
    """:func:`build_span_batch` for a remote worker's serializer.

    The gathered columns are contiguous: the serializer copies each one
    once, into the outgoing messages.

    Raises:
        InvalidBatchError: If ``actions_checked`` is False and an action does
            not fit the action space.
    """
    joined = build_span_batch(env_spec, spans, info_keys, actions_checked=actions_checked)
    return EpisodePieces(
        env_spec=env_spec,
        episode_infos=joined.episode_infos,
        observations=joined.observations,
        last_observations=joined.last_observations,
        actions=joined.actions,
        rewards=joined.rewards,
        env_infos=joined.env_infos,
        agent_infos=joined.agent_infos,
        step_types=joined.step_types,
        lengths=joined.lengths,
    )


__all__ = ["Span", "build_span_batch", "build_span_pieces", "split_rows", "step_types_of"]
