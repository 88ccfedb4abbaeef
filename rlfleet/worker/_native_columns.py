"""A native worker's finished episodes, split from its step columns in compiled passes.

A native backend (:mod:`rlfleet.worker._native_slots`) steps every slot at
once, and its episodes end a few at a time, nearly every vector step. So a
finished episode costs only a few Python operations and no object: it
becomes a row of ints of a :class:`FinishedTable` (its slot, first vector
step and length in the step ring's columns, its last step type, infos and
request), never a set of arrays. The arrays are made when episodes are
taken, for all of them at once, by compiled passes
(rlfleet/worker/_finished_pass.c): the table's list is read and its rows
ordered in one call (filtered as one array when only some are taken), one
pass over the steps writes each step's flat ring index and step type, and
each column is gathered a run of rows per episode, in the batch's order.

So a step's data is copied once after stepping: into the batch's arrays
(:func:`build_rows_batch`), or into the outgoing message
(:func:`build_rows_pieces`). For the message, each column is a
:class:`EpisodeRows` (the ring's rows, the index and the episodes' rows),
which the encoder gathers straight into the message's buffer
(:func:`rlfleet.wire.chunks.serialize_batch_behind`), except a column whose
episodes are large (Atari frames): there each episode's rows, contiguous in
the ring (it is stored slot by slot), go to the serializer as they are,
which copies them once, into the messages.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet.core._arrays import NestedArrays
from rlfleet.core._pieces import EpisodePieces, RowPieces, TakenRows
from rlfleet.core._validation import check_per_step_space
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.worker._episode_buffer import MIN_PIECE_BYTES, Columns, StepRing, concat_infos

with compiled("finished-episodes pass", "rlfleet/worker/_finished_pass.c"):
    from rlfleet.worker._finished_pass import gather_runs, sort_rows, step_index


#: A finished episode's row of a :class:`FinishedTable`: where its steps are
#: in the ring, its step type, its episode_infos (``EPISODE_INFO_KEYS``) and
#: its request.
START, LENGTH, SLOT, LAST = 0, 1, 2, 3
INFOS = slice(4, 9)
INDEX = 7  # episode_index, among the infos
REQUEST = 9
WIDTH = 10

#: Finished episodes of one :class:`Columns`: their rows, in the order taken.
RowsPart = tuple[Columns, np.ndarray]


class _Chunk:
    """Rows of finished episodes whose steps are in one :class:`Columns`, of one env.

    The ring keeps the rows of its steps while the chunk lives (``StepRing.pin``
    from its oldest start).
    """

    __slots__ = ("__weakref__", "columns", "env_spec", "pinned", "ring", "rows")

    def __init__(self, ring: StepRing, env_spec: EnvSpec) -> None:
        self.ring = ring
        self.columns = ring.columns
        self.env_spec = env_spec
        self.rows: list[int] = []  # WIDTH ints per episode
        self.pinned: int | None = None  # the step it pins the ring's rows from

    def pin(self, first_start: int) -> None:
        """Keeps the ring's rows from ``first_start`` on while the chunk lives."""
        if self.pinned is None or first_start < self.pinned:
            self.pinned = first_start
            self.ring.pin(self, first_start)

    def table(self) -> np.ndarray:
        """The rows as ``(episodes, WIDTH)`` int64 (read-only).

        ``struct`` packs the list's ints in one C loop, at under half
        ``np.fromiter``'s cost per int (no iterator call, no numpy setitem
        each): with ``np.fromiter`` the conversion was half of a native
        flush's taking.
        """
        rows = self.rows
        packed = struct.pack(f"{len(rows)}q", *rows)
        return np.frombuffer(packed, dtype=np.int64).reshape(-1, WIDTH)

    def sorted_table(self) -> np.ndarray:
        """:meth:`table`'s rows in (request, episode index) order, ties in list order.

        One compiled call (rlfleet/worker/_finished_pass.c) reads the list
        and orders its rows: ``np.lexsort`` and a fancy index over
        :meth:`table` give the same rows.
        """
        rows = self.rows
        table = np.empty(len(rows), dtype=np.int64)
        sort_rows(rows, table)
        return table.reshape(-1, WIDTH)


class FinishedTable:
    """A native worker's finished episodes not taken yet, one row of ints each.

    An episode that ends is a row (:data:`WIDTH` ints: start, length, slot,
    last step type, episode_infos, request) appended to a flat list: no
    object per episode. Rows of one ring's arrays share a chunk, which pins
    the ring's rows they are in; taking them sorts and filters the rows as
    arrays, and the encoder gathers each column once (:func:`build_rows_pieces`).
    """

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self.count = 0
        self.steps = 0

    def __len__(self) -> int:
        return self.count

    def add(
        self, ring: StepRing, env_spec: EnvSpec, rows: list[int], steps: int, first_start: int
    ) -> None:
        """Appends the rows of the episodes that ended at one vector step.

        Args:
            ring: The ring their steps are in.
            env_spec: Spec of the env that produced them.
            rows: :data:`WIDTH` ints per episode.
            steps: Their steps in all.
            first_start: The earliest start among them.
        """
        chunks = self._chunks
        chunk = chunks[-1] if chunks else None
        if chunk is None or chunk.columns is not ring.columns or chunk.env_spec is not env_spec:
            chunk = _Chunk(ring, env_spec)
            chunks.append(chunk)
        chunk.rows += rows
        chunk.pin(first_start)
        self.count += len(rows) // WIDTH
        self.steps += steps

    def first_key(self) -> tuple[int, int] | None:
        """The lowest (request, episode index) held, if any."""
        if not self.count:
            return None
        table = np.concatenate([chunk.table() for chunk in self._chunks])
        first = np.lexsort((table[:, INDEX], table[:, REQUEST]))[0]
        return int(table[first, REQUEST]), int(table[first, INDEX])

    def take(
        self, max_episodes: int | None, request: int | None
    ) -> tuple[EnvSpec, list[RowsPart]] | None:
        """Removes episodes in (request, episode index) order, all of one env.

        Args:
            max_episodes: Take at most this many (the lowest-ordered ones).
            request: Take only this request's episodes.

        Returns:
            The env's spec and the rows taken, in order, in runs of one
            :class:`Columns`; None if none matched.
        """
        chunks = self._chunks
        if not self.count:
            return None
        # The usual case: everything, or a request's episodes when every one
        # held is of it (a session takes by request, and a native worker's
        # refills join one task).
        if len(chunks) == 1 and max_episodes is None:
            table = chunks[0].sorted_table()
            if request is None or bool((table[:, REQUEST] == request).all()):
                self.clear()
                return chunks[0].env_spec, [(chunks[0].columns, table)]
        tables = [chunk.table() for chunk in chunks]
        table = np.concatenate(tables)
        owner = np.repeat(np.arange(len(chunks)), [len(t) for t in tables])
        order = np.lexsort((table[:, INDEX], table[:, REQUEST]))
        if request is not None:
            order = order[table[order, REQUEST] == request]
        if not len(order):
            return None
        spec = chunks[owner[order[0]]].env_spec
        same = np.array([chunk.env_spec is spec for chunk in chunks])
        order = order[same[owner[order]]][:max_episodes]
        parts: list[RowsPart] = []
        owners = owner[order]
        bounds = [0, *(np.flatnonzero(owners[1:] != owners[:-1]) + 1).tolist(), len(order)]
        for a, b in itertools.pairwise(bounds):
            parts.append((chunks[owners[a]].columns, table[order[a:b]]))
        kept = np.ones(len(table), dtype=bool)
        kept[order] = False
        self._keep(tables, owner, kept)
        return spec, parts

    def drop(self, matches: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> list[int]:
        """Drops the episodes ``matches(requests, indices)`` marks; returns their indices."""
        if not self.count:
            return []
        tables = [chunk.table() for chunk in self._chunks]
        table = np.concatenate(tables)
        owner = np.repeat(np.arange(len(tables)), [len(t) for t in tables])
        dropped = matches(table[:, REQUEST], table[:, INDEX])
        if not dropped.any():
            return []
        self._keep(tables, owner, ~dropped)
        return table[dropped, INDEX].tolist()

    def _keep(self, tables: list[np.ndarray], owner: np.ndarray, kept: np.ndarray) -> None:
        """Keeps the rows ``kept`` marks (of the chunks' ``tables``, concatenated)."""
        chunks = []
        for number, (chunk, table) in enumerate(zip(self._chunks, tables, strict=True)):
            rest = table[kept[owner == number]]
            if len(rest):
                # A new chunk, pinning from its own oldest start: the old one's
                # pin goes with it.
                fresh = _Chunk(chunk.ring, chunk.env_spec)
                fresh.columns = chunk.columns
                fresh.rows = rest.ravel().tolist()
                fresh.pin(int(rest[:, START].min()))
                chunks.append(fresh)
        self._chunks = chunks
        rows = [chunk.table() for chunk in chunks]
        self.count = sum(len(t) for t in rows)
        self.steps = sum(int(t[:, LENGTH].sum()) for t in rows)

    def clear(self) -> None:
        """Forgets every episode."""
        self._chunks = []
        self.count = 0
        self.steps = 0


class EpisodeRows(TakenRows):
    """:class:`TakenRows` of whole episodes' steps in a ring column, gathered a run per episode.

    An episode's rows lie together in the ring's storage (slot by slot), so
    the compiled gather (``gather_runs``, rlfleet/worker/_finished_pass.c)
    copies each episode's rows at once (twice where they wrap around the
    ring's end), where ``np.take`` copies them one step at a time. The
    bytes are ``np.take``'s over ``index``.

    Args:
        source: The ring column seen slot by slot (:func:`flat_column`).
        index: Every step's row in it (``step_index``'s).
        table: The episodes' :class:`FinishedTable` rows, in order.
        capacity: Rows of the ring.
    """

    __slots__ = ("capacity", "table")

    def __init__(
        self, source: np.ndarray, index: np.ndarray, table: np.ndarray, capacity: int
    ) -> None:
        super().__init__(source, index)
        self.table = table
        self.capacity = capacity

    def take_into(self, buffer: memoryview, offset: int) -> None:
        """Writes the rows' bytes into ``buffer`` from ``offset``, a run per episode."""
        if self.nbytes:
            gather_runs(self.table, self.capacity, self.source, buffer, offset)


def flat_column(column: np.ndarray) -> np.ndarray:
    """A ring column ``[row, slot, ...]`` as its storage, ``[slot * capacity + row, ...]``.

    A view: the ring's arrays are stored slot by slot.
    """
    storage = column.swapaxes(0, 1)
    return storage.reshape(storage.shape[0] * storage.shape[1], *storage.shape[2:])


#: Per-step fields of the batch, in the order of :class:`Columns`.
_STEP_FIELDS = ("observations", "actions", "rewards")


def _gather(
    columns: Columns, table: np.ndarray, min_piece_bytes: int | None, *, deferred: bool = False
) -> dict[str, Any]:
    """The fields of the batch of ``table``'s episodes (rows of :class:`FinishedTable`), in order.

    With ``min_piece_bytes``, a per-step field holding at least that many
    bytes per episode on average is :class:`RowPieces` of each episode's rows
    in the ring instead (views, unless the rows wrap around its end). With
    ``deferred``, the other step fields are :class:`TakenRows`, gathered by
    the encoder straight into the message.
    """
    capacity = columns.capacity
    n = len(table)
    starts, lengths, slots = table[:, START], table[:, LENGTH], table[:, SLOT]
    # One compiled pass for every step's ring row and step type and the
    # last observations' rows (rlfleet/worker/_finished_pass.c; its numpy
    # reference: tests/native_columns_reference.py), which checks every
    # row against the ring.
    total = int(lengths.sum())
    index = np.empty(total, dtype=np.int64)
    step_types = np.empty(total, dtype=np.uint8)
    last_index = np.empty(n, dtype=np.int64)
    step_index(table, capacity, columns.rewards.shape[1], index, step_types, last_index)
    assert columns.actions is not None  # an episode ended after a step
    least = None if min_piece_bytes is None else min_piece_bytes * n

    def take(column: np.ndarray, at: np.ndarray | None = None) -> np.ndarray:
        source = flat_column(column)
        if at is not None:
            return source.take(at, axis=0)  # np.take's wrapper: two calls more
        steps = np.empty((total, *source.shape[1:]), source.dtype)
        gather_runs(table, capacity, source, steps, 0)
        return steps

    def rows(column: np.ndarray, at: np.ndarray | None = None) -> np.ndarray | TakenRows:
        if not deferred:
            return take(column, at)
        source = flat_column(column)
        return (
            TakenRows(source, at) if at is not None else EpisodeRows(source, index, table, capacity)
        )

    def field(column: np.ndarray) -> np.ndarray | RowPieces | TakenRows:
        # strides[0]: the bytes of one slot's row (the ring is stored slot by slot).
        if least is None or column.strides[0] * total < least:
            return rows(column)
        pieces = []
        for start, length, slot in zip(
            starts.tolist(), lengths.tolist(), slots.tolist(), strict=True
        ):
            first = start % capacity
            if first + length <= capacity:
                pieces.append(column[first : first + length, slot])
            else:  # wraps around the ring's end
                ring_rows = np.arange(start, start + length) % capacity
                pieces.append(column[ring_rows, slot])
        return RowPieces(tuple(pieces))

    env_infos: NestedArrays = {}
    if columns.obs_flags is not None:
        # nan_observations="flag": a step is flagged if its observation or the next one is.
        after = index + 1
        after[after % capacity == 0] -= capacity
        env_infos["nonfinite_obs"] = take(columns.obs_flags) | take(columns.obs_flags, after)
    return {
        "observations": field(columns.obs),
        "last_observations": rows(columns.obs, last_index),
        "actions": field(columns.actions),
        "rewards": field(columns.rewards),
        "agent_infos": {key: field(value) for key, value in columns.agent_infos.items()},
        "env_infos": env_infos,
        "lengths": lengths.copy(),
        "step_types": step_types,
    }


def _fields(
    parts: Sequence[RowsPart],
    info_keys: Sequence[str],
    min_piece_bytes: int | None = None,
    *,
    deferred: bool = False,
) -> dict[str, Any]:
    """All fields of the batch of the parts' episodes, in order (see :func:`_gather`)."""
    # Nearly always one part: the ring's arrays change only when it grows or
    # the policy changes.
    if len(parts) == 1:
        columns, table = parts[0]
        fields = _gather(columns, table, min_piece_bytes, deferred=deferred)
    else:
        gathered = [_gather(columns, table, None) for columns, table in parts]
        fields = {
            key: np.concatenate([p[key] for p in gathered])
            for key in (*_STEP_FIELDS, "last_observations", "lengths", "step_types")
        }
        fields["agent_infos"] = concat_infos(
            [p["agent_infos"] for p in gathered], "agent info", "agent_infos"
        )
        fields["env_infos"] = concat_infos(
            [p["env_infos"] for p in gathered], "env info", "env_infos"
        )
        table = np.concatenate([table for _, table in parts])
    # One contiguous array per key: the rows of the table's transposed info columns.
    infos = np.ascontiguousarray(table[:, INFOS].T)
    fields["episode_infos"] = dict(zip(info_keys, infos, strict=True))
    return fields


def build_rows_batch(
    env_spec: EnvSpec, parts: Sequence[RowsPart], info_keys: Sequence[str], *, actions_checked: bool
) -> EpisodeBatch:
    """The EpisodeBatch of finished episodes' rows, in the given order (each column gathered once).

    Its fields fit the spaces by construction (the ring has their shapes
    and dtypes, the observations were checked while stepping), so it is
    not re-checked, except its actions unless ``actions_checked``.
    """
    return EpisodeBatch.prechecked(
        env_spec=env_spec, **_fields(parts, info_keys), check_actions=not actions_checked
    )


def build_rows_pieces(
    env_spec: EnvSpec,
    parts: Sequence[RowsPart],
    info_keys: Sequence[str],
    *,
    actions_checked: bool,
    min_piece_bytes: int = MIN_PIECE_BYTES,
) -> EpisodePieces:
    """:func:`build_rows_batch` for a remote worker's serializer, copied once into messages.

    Columns holding fewer than ``min_piece_bytes`` per episode on average
    are :class:`TakenRows` (one ``np.take`` each, which the encoder runs
    straight into the message: handing it each episode's small piece would
    cost more than gathering them); larger ones are each episode's rows in
    the ring, which the serializer joins straight into the messages. The
    bytes are those of :func:`build_rows_batch`'s batch.

    Raises:
        InvalidBatchError: If ``actions_checked`` is False and an action does
            not fit the action space.
    """
    fields = _fields(parts, info_keys, min_piece_bytes, deferred=True)
    if not actions_checked:
        actions = fields["actions"]
        if isinstance(actions, TakenRows):
            actions = fields["actions"] = actions.array()
        for part in actions.arrays if isinstance(actions, RowPieces) else (actions,):
            check_per_step_space(
                "EpisodeBatch.actions", part, env_spec.action_space, "action_space"
            )
    return EpisodePieces(env_spec=env_spec, **fields)


__all__ = [
    "WIDTH",
    "FinishedTable",
    "RowsPart",
    "build_rows_batch",
    "build_rows_pieces",
    "flat_column",
]
