"""A native worker's finished episodes, split from its step columns with array operations.

A native backend (:mod:`rlfleet.worker._native_slots`) steps every slot at
once, and its episodes end a few at a time, nearly every vector step. So a
finished episode costs only a few Python operations: it becomes a
:class:`Span` (its slot, first vector step and length in the step ring's
columns), never a set of arrays. The arrays are made when episodes are
taken, for all of them at once: :func:`split_rows` turns the spans into one
flat ring index per step, and each column is gathered with one
``np.take``, straight into a contiguous array in the batch's order.

So a step's data is copied once after stepping: into the batch
(:func:`build_span_batch`), or into the outgoing messages
(:func:`build_span_pieces`). For the messages, the gathered columns are
what the wire encoding joins (:func:`rlfleet.wire.serialize_batch_messages`),
except a column whose episodes are large (Atari frames): there each
episode's rows, contiguous in the ring (it is stored slot by slot), go to
the serializer as they are, which copies them once, into the messages.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlfleet.core._arrays import NestedArrays
from rlfleet.core._pieces import EpisodePieces, RowPieces
from rlfleet.core._validation import check_per_step_space
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.worker._episode_buffer import MIN_PIECE_BYTES, Columns, concat_infos

_MID = int(StepType.MID)
_FIRST = int(StepType.FIRST)


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
        row: ``(start, length, slot, last, *infos)``: what taking it turns
            into arrays, every span's row in one ``np.fromiter``.
    """

    __slots__ = (
        "__weakref__",
        "columns",
        "env_spec",
        "infos",
        "key",
        "last",
        "length",
        "row",
        "slot",
        "start",
    )

    def __init__(  # noqa: PLR0917 -- built once per episode, positionally (fastest)
        self,
        key: tuple[int, ...],
        infos: tuple[int, ...],
        slot: int,
        start: int,
        length: int,
        last: int,
        columns: Columns,
        env_spec: EnvSpec,
    ) -> None:
        self.key = key
        self.infos = infos
        self.slot = slot
        self.start = start
        self.length = length
        self.last = last
        self.columns = columns
        self.env_spec = env_spec
        self.row = (start, length, slot, last, *infos)

    def __repr__(self) -> str:
        return (
            f"Span(key={self.key}, slot={self.slot}, start={self.start}, length={self.length}, "
            f"last={self.last})"
        )


def split_rows(
    starts: np.ndarray, lengths: np.ndarray, slots: np.ndarray, capacity: int
) -> np.ndarray:
    """The flat ring index of every step of the episodes, in order.

    Episode i's steps are vector steps ``starts[i] .. starts[i] + lengths[i] - 1``
    of slot ``slots[i]``. The ring is stored slot by slot: step t of slot j
    is element ``j * capacity + t % capacity`` of a column's storage seen as
    ``(n_slots * capacity, ...)`` (:func:`flat_column`).

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
    index += np.repeat(starts - offsets, lengths)
    index %= capacity
    index += np.repeat(slots * capacity, lengths)
    return index


def flat_column(column: np.ndarray) -> np.ndarray:
    """A ring column ``[row, slot, ...]`` as its storage, ``[slot * capacity + row, ...]``.

    A view: the ring's arrays are stored slot by slot.
    """
    storage = column.swapaxes(0, 1)
    return storage.reshape(storage.shape[0] * storage.shape[1], *storage.shape[2:])


def step_types_of(lengths: np.ndarray, lasts: np.ndarray) -> np.ndarray:
    """Step types of whole episodes: FIRST, MID..., the episode's last type.

    A one-step episode's only step takes its last type (as garage).
    """
    ends = np.cumsum(lengths)
    step_types = np.full(int(ends[-1]) if len(ends) else 0, _MID, dtype=np.uint8)
    step_types[ends - lengths] = _FIRST
    step_types[ends - 1] = lasts
    return step_types


_ROW = operator.attrgetter("row")


def _table(spans: Sequence[Span]) -> np.ndarray:
    """Every span's :attr:`Span.row`, one row each: ``(n, 4 + number of infos)`` int64."""
    n, width = len(spans), len(spans[0].row)
    rows = itertools.chain.from_iterable(map(_ROW, spans))
    return np.fromiter(rows, dtype=np.int64, count=n * width).reshape(n, width)


#: Per-step fields of the batch, in the order of :class:`Columns`.
_STEP_FIELDS = ("observations", "actions", "rewards")


def _gather(
    spans: Sequence[Span], table: np.ndarray, min_piece_bytes: int | None
) -> dict[str, Any]:
    """The fields of the spans' batch (spans of one :class:`Columns`), in order.

    ``table`` holds the spans' rows (:func:`_table`). With ``min_piece_bytes``,
    a per-step field holding at least that many bytes per episode on average
    is :class:`RowPieces` of each episode's rows in the ring instead (views,
    unless the rows wrap around its end).
    """
    columns = spans[0].columns
    capacity = columns.capacity
    n = len(spans)
    starts, lengths, slots = table[:, 0], table[:, 1], table[:, 2]
    index = split_rows(starts, lengths, slots, capacity)
    assert columns.actions is not None  # a span ended after a step
    least = None if min_piece_bytes is None else min_piece_bytes * n
    total = len(index)

    def take(column: np.ndarray, at: np.ndarray = index) -> np.ndarray:
        return flat_column(column).take(at, axis=0)  # np.take's wrapper: two calls more

    def field(column: np.ndarray) -> np.ndarray | RowPieces:
        # strides[0]: the bytes of one slot's row (the ring is stored slot by slot).
        if least is None or column.strides[0] * total < least:
            return take(column)
        pieces = []
        for span in spans:
            first = span.start % capacity
            if first + span.length <= capacity:
                pieces.append(column[first : first + span.length, span.slot])
            else:  # wraps around the ring's end
                rows = np.arange(span.start, span.start + span.length) % capacity
                pieces.append(column[rows, span.slot])
        return RowPieces(tuple(pieces))

    env_infos: NestedArrays = {}
    if columns.obs_flags is not None:
        # nan_observations="flag": a step is flagged if its observation or the next one is.
        after = index + 1
        after[after % capacity == 0] -= capacity
        env_infos["nonfinite_obs"] = take(columns.obs_flags) | take(columns.obs_flags, after)
    return {
        "observations": field(columns.obs),
        "last_observations": take(columns.obs, slots * capacity + (starts + lengths) % capacity),
        "actions": field(columns.actions),
        "rewards": field(columns.rewards),
        "agent_infos": {key: field(value) for key, value in columns.agent_infos.items()},
        "env_infos": env_infos,
        "lengths": lengths.copy(),
        "lasts": table[:, 3],
    }


def _fields(
    spans: Sequence[Span], info_keys: Sequence[str], min_piece_bytes: int | None = None
) -> dict[str, Any]:
    """All fields of the spans' batch, in the spans' order (see :func:`_gather`)."""
    table = _table(spans)
    # Nearly always one run of spans in the same arrays: the ring's arrays
    # change only when it grows or the policy changes.
    first = spans[0].columns
    if all(s.columns is first for s in spans):
        fields = _gather(spans, table, min_piece_bytes)
    else:
        bounds = [0]
        bounds += [i for i in range(1, len(spans)) if spans[i].columns is not spans[i - 1].columns]
        bounds.append(len(spans))
        parts = [_gather(spans[a:b], table[a:b], None) for a, b in itertools.pairwise(bounds)]
        fields = {
            key: np.concatenate([p[key] for p in parts])
            for key in (*_STEP_FIELDS, "last_observations", "lengths", "lasts")
        }
        fields["agent_infos"] = concat_infos(
            [p["agent_infos"] for p in parts], "agent info", "agent_infos"
        )
        fields["env_infos"] = concat_infos([p["env_infos"] for p in parts], "env info", "env_infos")
    # One contiguous array per key: the rows of the table's transposed info columns.
    infos = np.ascontiguousarray(table[:, 4:].T)
    fields["episode_infos"] = dict(zip(info_keys, infos, strict=True))
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
    env_spec: EnvSpec,
    spans: Sequence[Span],
    info_keys: Sequence[str],
    *,
    actions_checked: bool,
    min_piece_bytes: int = MIN_PIECE_BYTES,
) -> EpisodePieces:
    """:func:`build_span_batch` for a remote worker's serializer, copied once into messages.

    Columns holding fewer than ``min_piece_bytes`` per episode on average
    are gathered (one ``np.take`` each: handing the serializer each
    episode's small piece would cost more than copying it); larger ones are
    each episode's rows in the ring, which the serializer joins straight
    into the messages. The bytes are those of :func:`build_span_batch`'s batch.

    Raises:
        InvalidBatchError: If ``actions_checked`` is False and an action does
            not fit the action space.
    """
    fields = _fields(spans, info_keys, min_piece_bytes)
    if not actions_checked:
        actions = fields["actions"]
        for part in actions.arrays if isinstance(actions, RowPieces) else (actions,):
            check_per_step_space(
                "EpisodeBatch.actions", part, env_spec.action_space, "action_space"
            )
    return EpisodePieces(env_spec=env_spec, **fields)


__all__ = [
    "Span",
    "build_span_batch",
    "build_span_pieces",
    "flat_column",
    "split_rows",
    "step_types_of",
]
