"""A learner's answer from its results' arrays: one C call per field, no Python per episode.

:func:`placed_episodes` and :func:`placed_fragments` build the answer of
:func:`~rlfleet.wire.results.assemble_episodes` and
:func:`~rlfleet.wire.results.assemble_fragments`. A native worker's result
holds hundreds of episodes, a per-env fleet's answer tens of results: where
each result's pieces go is worked out with array operations over the
pieces, as (result, first row, rows) pieces of the answer's rows, then each
field of the answer is one call into the compiled gather
(:func:`~rlfleet.wire._gather.gather`, rlfleet/wire/_gather.c), which copies
those rows' bytes straight from the results' arrays, views of the received
frames, into the answer's buffer: one copy, no numpy view or
``np.concatenate`` per result, every piece checked against its frame:

* where each result's kept pieces (episodes, or fragments) are neighbours in
  the answer, as when episodes are dealt in slices, the pieces are the
  results' blocks, in the answer's order;
* where results interleave (as a native worker's do, in runs of a few
  episodes), they are the runs, however short: one copy, where numpy took
  each result's rows into one scratch buffer first.

Results left in their chunks (:class:`~rlfleet.wire.scattered.Scattered`)
are gathered from the chunks' byte pieces (interleaved in short runs, joined
first); arrays of different dtypes (which the answer promotes), of objects,
or not C-contiguous take numpy's ``np.concatenate``, and ``np.take`` where
results interleave.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from rlfleet._util.compiled import compiled
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.wire.scattered import Scattered, ScatteredBatch

with compiled("gather", "rlfleet/wire/_gather.c"):
    from rlfleet.wire._gather import gather

#: What a result is placed from: its batch, or its chunks not joined.
Arrays: TypeAlias = "EpisodeBatch | ScatteredBatch"
#: One array of one result: an array, or its pieces in the chunks.
_Part: TypeAlias = "np.ndarray | Scattered"
#: Makes an array of the answer (``np.empty``'s arguments): ``np.empty``, or
#: a sampler's reused memory (rlfleet.transport.receive_buffers).
Empty: TypeAlias = Callable[[tuple[int, ...], np.dtype], np.ndarray]


_KEYS = operator.methodcaller("keys")
_LENGTHS = operator.attrgetter("lengths")
_DTYPE = operator.attrgetter("dtype")


class _MisfitError(Exception):
    """The results cannot be placed here (internal: the public functions return None)."""


def placed_episodes(
    batches: Sequence[Arrays], num_episodes: int, empty: Empty = np.empty
) -> EpisodeBatch | None:
    """The episodes 0..num_episodes-1 of ``batches``, in index order.

    ``empty`` makes the answer's arrays.

    Returns:
        The answer, or None (for the caller's general path, which names
        what is wrong) if a result's indices are missing or not ascending,
        the kept episodes are not 0..num_episodes-1 once each, or the
        results' arrays differ in structure or trailing shape.
    """
    try:
        return _placed_episodes(batches, num_episodes, empty)
    except _MisfitError:
        return None


def _placed_episodes(batches: Sequence[Arrays], num_episodes: int, empty: Empty) -> EpisodeBatch:
    indices = [batch.episode_infos.get("episode_index") for batch in batches]
    if not all(isinstance(index, np.ndarray) and index.ndim == 1 for index in indices):
        raise _MisfitError
    joined = _joined(indices)  # type: ignore[arg-type]
    counts = list(map(len, indices))  # type: ignore[arg-type]
    kept, placed, known = _kept_episodes(joined, counts, num_episodes, empty)
    return _placed_answer(batches, kept, placed, empty, known)


def _kept_episodes(
    joined: np.ndarray, counts: Sequence[int], num_episodes: int, empty: Empty
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Which of the results' episodes the answer holds, and where.

    Args:
        joined: The results' episode indices, one result's after the other.
        counts: Each result's number of episodes.
        num_episodes: The answer's.
        empty: Makes the answer's arrays.

    Returns:
        ``kept`` and ``dest`` of :func:`_placed_answer`, and the answer's
        episode indices where they are made, not placed (by key).

    Raises:
        _MisfitError: If a result's indices are not ascending, or the kept
            ones are not 0..num_episodes-1 once each.
    """
    every = joined.astype(np.int64, copy=False)
    ends = itertools.accumulate(counts)
    if every.size > 1:
        rising = np.diff(every) > 0
        # From one result to the next, any order.
        rising[[end - 1 for end in ends if 0 < end < every.size]] = True
        if not rising.all():
            raise _MisfitError
    # Ascending, so the episodes a result keeps are its first ones.
    kept = every < num_episodes
    placed = every[kept]
    if placed.size != num_episodes or (placed.size and placed.min() < 0):
        raise _MisfitError
    if not np.array_equal(
        np.bincount(placed, minlength=num_episodes), np.ones(num_episodes, dtype=np.int64)
    ):
        raise _MisfitError
    known: dict[str, np.ndarray] = {}
    if joined.dtype.kind in "iu":
        # The answer's indices are 0..num_episodes-1 (just checked): made,
        # not placed, which would take a view of each result's once more.
        known["episode_index"] = index = empty((num_episodes,), joined.dtype)
        index[:] = np.arange(num_episodes, dtype=joined.dtype)
    return np.flatnonzero(kept), placed, known


def placed_fragments(batches: Sequence[Arrays], empty: Empty = np.empty) -> EpisodeBatch | None:
    """Every piece of ``batches`` in LocalSampler's order (stream, episode, fragment).

    ``empty`` makes the answer's arrays.

    Returns:
        The answer, or None (for the caller's general path) if a result
        lacks one of the fragment infos, or the results' arrays differ in
        structure or trailing shape.
    """
    try:
        return _placed_fragments(batches, empty)
    except _MisfitError:
        return None


def _placed_fragments(batches: Sequence[Arrays], empty: Empty) -> EpisodeBatch:
    keys: list[np.ndarray] = []
    for name in ("fragment_index", "episode_index", "stream"):
        columns = [batch.episode_infos.get(name) for batch in batches]
        if not all(isinstance(column, np.ndarray) for column in columns):
            raise _MisfitError
        keys.append(_joined(columns))  # type: ignore[arg-type]
    # sort_fragments' order of the concatenated pieces; piece j goes to position[j].
    order = np.lexsort(keys)
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    return _placed_answer(batches, np.arange(len(order)), position, empty)


def _placed_answer(
    batches: Sequence[Arrays],
    kept: np.ndarray,
    dest: np.ndarray,
    empty: Empty = np.empty,
    known: dict[str, np.ndarray] | None = None,
) -> EpisodeBatch:
    """The answer made of some pieces of ``batches``, each at its place.

    Args:
        batches: The results.
        kept: Ascending numbers of the pieces the answer holds, among the
            results' pieces laid end to end; a result's kept pieces are its
            first ones.
        dest: Where each of them goes in the answer: together, a permutation
            of the answer's pieces.
        empty: Makes the answer's arrays.
        known: Episode infos of the answer worked out already, by key (the
            results' must still be there).

    Raises:
        _MisfitError: If the results' arrays differ in structure or trailing shape.
    """
    pieces, steps, lengths = _layouts(batches, kept, dest)
    scattered = any(isinstance(batch, ScatteredBatch) for batch in batches)

    def field(name: str, layout: _Layout, known: dict[str, np.ndarray] | None = None) -> Any:
        parts = list(map(operator.attrgetter(name), batches))
        return _place(parts, layout, scattered, empty, known)

    return EpisodeBatch(
        env_spec=batches[0].env_spec,
        episode_infos=field("episode_infos", pieces, known),
        observations=field("observations", steps),
        last_observations=field("last_observations", pieces),
        actions=field("actions", steps),
        rewards=field("rewards", steps),
        env_infos=field("env_infos", steps),
        agent_infos=field("agent_infos", steps),
        step_types=field("step_types", steps),
        lengths=lengths,
    )


@dataclasses.dataclass(frozen=True)
class _Runs:
    """Interleaved: the answer's rows as runs of consecutive rows of one result,
    in the answer's order (arrays, one entry per run).

    Attributes:
        results: Each run's result.
        begins: Its first row in that result.
        ends: The row past it.
    """

    results: np.ndarray
    begins: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.results)

    def listed(self) -> list[tuple[int, int, int]]:
        """(result, begin, end) of each run, as Python ints."""
        return list(
            zip(self.results.tolist(), self.begins.tolist(), self.ends.tolist(), strict=True)
        )


_NO_RUNS = _Runs(*(np.empty(0, np.int64) for _ in range(3)))


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where the rows of the results go in the answer, for fields of one kind of row.

    A result's rows in the answer are its first ``held`` ones.

    Attributes:
        rows: The answer's rows.
        held: Rows of each result the answer holds.
        starts: Each result's first row among the results' rows laid end to
            end, then their number.
        order: Blocks: the results whose rows the answer holds, in the order
            their blocks follow each other there; None when they interleave.
        cut: Blocks: position in ``order`` -> rows held, for the results the
            answer holds only part of (a few: past a STEPS answer's end, or
            with speculative episodes).
        runs: Interleaved: the answer's rows as runs of each result's rows.
    """

    rows: int
    held: list[int]
    starts: list[int]
    order: tuple[int, ...] | None = None
    cut: dict[int, int] = dataclasses.field(default_factory=dict)
    runs: _Runs = _NO_RUNS

    @functools.cached_property
    def row_pieces(self) -> np.ndarray:
        """The answer's rows as (result, first row, rows) pieces, in its order:
        the blocks', or the runs' (int64, one row a piece)."""
        if self.order is None:
            runs = self.runs
            return np.stack([runs.results, runs.begins, runs.ends - runs.begins], axis=1)
        order = np.asarray(self.order, dtype=np.int64)
        held = np.asarray(self.held, dtype=np.int64)[order]
        return np.stack([order, np.zeros_like(order), held], axis=1)

    def byte_pieces(self, row_bytes: int) -> np.ndarray:
        """:attr:`row_pieces` in bytes, for rows of ``row_bytes`` (kept per
        row size: the fields of one kind share a few)."""
        pieces = self._byte_pieces.get(row_bytes)
        if pieces is None:
            pieces = self.row_pieces * np.array([1, row_bytes, row_bytes], dtype=np.int64)
            self._byte_pieces[row_bytes] = pieces
        return pieces

    @functools.cached_property
    def _byte_pieces(self) -> dict[int, np.ndarray]:
        return {}

    @functools.cached_property
    def unheld(self) -> list[int]:
        """Blocks: the results the answer holds nothing of (worked out once for
        every field of their kind)."""
        held = set(self.order or ())
        return [i for i in range(len(self.held)) if i not in held]

    @functools.cached_property
    def gather(self) -> np.ndarray:
        """Interleaved: for each row of the answer, its row among the results'
        rows laid end to end (made only for a field that gathers its rows)."""
        runs = self.runs
        sizes = runs.ends - runs.begins
        firsts = np.asarray(self.starts, dtype=np.int64)[runs.results] + runs.begins
        # Row i of run k is firsts[k] + (i - the run's first row in the answer).
        shifts = firsts - (np.cumsum(sizes) - sizes)
        return np.repeat(shifts, sizes) + np.arange(self.rows, dtype=np.int64)


def _layouts(
    batches: Sequence[Arrays], kept: np.ndarray, dest: np.ndarray
) -> tuple[_Layout, _Layout, np.ndarray]:
    """The layouts of the pieces' rows and of the steps' rows, and the answer's lengths.

    Array operations over the pieces and over the results (a hundred of
    them in a per-env answer): no Python step per result but the order of
    the blocks' lookup.
    """
    own_lengths = list(map(_LENGTHS, batches))
    own = _joined(own_lengths).astype(np.int64, copy=False)
    counts = np.fromiter(map(len, own_lengths), np.int64, len(own_lengths))
    return _row_layouts(own, counts, kept, dest)


def _row_layouts(
    own: np.ndarray, counts: np.ndarray, kept: np.ndarray, dest: np.ndarray
) -> tuple[_Layout, _Layout, np.ndarray]:
    """:func:`_layouts` from the results' lengths one after the other (int64)
    and each result's number of pieces (int64)."""
    starts = np.zeros(len(counts) + 1, np.int64)  # of each result's pieces, then their number
    np.cumsum(counts, out=starts[1:])
    held = np.diff(np.searchsorted(kept, starts))
    first_steps = np.zeros(len(own) + 1, np.int64)  # of each piece, then the total
    np.cumsum(own, out=first_steps[1:])
    step_starts = first_steps[starts]
    held_steps = first_steps[starts[:-1] + held] - step_starts[:-1]
    lengths = np.empty(len(dest), dtype=np.int64)
    lengths[dest] = own[kept]
    total = int(lengths.sum())
    offsets = np.zeros(len(held) + 1, np.int64)  # of each result's pieces in ``dest``
    np.cumsum(held, out=offsets[1:])
    following = np.diff(dest) == 1
    ends = offsets[1:-1]
    following[ends[(ends > 0) & (ends < len(dest))] - 1] = True  # across results
    piece_starts, step_list = starts.tolist(), step_starts.tolist()
    held_list, held_step_list = held.tolist(), held_steps.tolist()
    if following.all():
        # The usual case: each result is one block of the answer, and the
        # blocks, in the order of their first piece, are the answer.
        holding = np.flatnonzero(held)
        order = holding[np.argsort(dest[offsets[holding]], kind="stable")]
        cut = held[order] < counts[order]  # results the answer holds only part of
        partial = order[cut].tolist()
        positions = np.flatnonzero(cut).tolist()
        order_tuple = tuple(order.tolist())
        return (
            _Layout(
                len(dest),
                held_list,
                piece_starts,
                order_tuple,
                {p: held_list[i] for p, i in zip(positions, partial, strict=True)},
            ),
            _Layout(
                total,
                held_step_list,
                step_list,
                order_tuple,
                {p: held_step_list[i] for p, i in zip(positions, partial, strict=True)},
            ),
            lengths,
        )
    pieces, steps = _interleaved_runs(kept, dest, starts, first_steps)
    return (
        _Layout(len(dest), held_list, piece_starts, runs=pieces),
        _Layout(total, held_step_list, step_list, runs=steps),
        lengths,
    )


def _interleaved_runs(
    kept: np.ndarray, dest: np.ndarray, piece_starts: np.ndarray, first_steps: np.ndarray
) -> tuple[_Runs, _Runs]:
    """The runs of the answer's pieces, and of its steps (the same runs, in steps).

    Args:
        kept: As for :func:`_placed_answer`.
        dest: As for :func:`_placed_answer`.
        piece_starts: Each result's first piece among the results' pieces
            laid end to end, then their number.
        first_steps: Each of those pieces' first step, then the steps' number.
    """
    if not len(dest):
        return _NO_RUNS, _NO_RUNS
    # ``source[p]``: the piece (results laid end to end) the answer's piece p is.
    source = np.empty(len(dest), dtype=np.int64)
    source[dest] = kept
    first_of_result = np.zeros(int(piece_starts[-1]) + 1, dtype=bool)
    first_of_result[piece_starts] = True
    # A run ends where the next piece is not the next one of the same result.
    breaks = np.flatnonzero((np.diff(source) != 1) | first_of_result[source[1:]]) + 1
    firsts = source[np.concatenate(([0], breaks))]
    lasts = source[np.concatenate((breaks - 1, [len(source) - 1]))] + 1
    results = np.searchsorted(piece_starts, firsts, side="right") - 1
    begins = firsts - piece_starts[results]
    step_bases = first_steps[piece_starts[results]]
    return (
        _Runs(results, begins, lasts - piece_starts[results]),
        _Runs(results, first_steps[firsts] - step_bases, first_steps[lasts] - step_bases),
    )


def _place(
    parts: Sequence[Any],
    layout: _Layout,
    scattered: bool,
    empty: Empty,
    known: dict[str, np.ndarray] | None = None,
) -> Any:
    """One field of the answer (a nested dict of them, for infos) from each result's
    (``known``: a dict's entries worked out already, by key)."""
    first = parts[0]
    if isinstance(first, Mapping):
        keys = first.keys()
        if not _same_keys(parts, keys):
            raise _MisfitError
        known = known or {}
        return {
            key: known[key]
            if key in known
            else _place(list(map(operator.itemgetter(key), parts)), layout, scattered, empty)
            for key in keys
        }
    copied = _copied(parts, layout, empty)
    if copied is not None:
        return copied
    if layout.order is None:
        return _gathered(parts, layout, scattered, empty)
    heads = [parts[i] for i in layout.order]
    for position, rows in layout.cut.items():
        head = heads[position]
        heads[position] = head.head(rows) if isinstance(head, Scattered) else head[:rows]
    if len(heads) < len(parts):
        # A result the answer holds nothing of must fit all the same (the heads'
        # shapes are the concatenation's to check): a step per such result,
        # not one per result for every field.
        shapes = {_trailing(parts[i]) for i in layout.unheld}
        if heads:
            shapes.add(_trailing(heads[0]))
        if len(shapes) != 1:
            raise _MisfitError
    return _end_to_end(heads, layout.rows, parts, scattered, empty)


def _copied(parts: Sequence[Any], layout: _Layout, empty: Empty) -> np.ndarray | None:
    """One array of the answer copied from the results' arrays in one call
    (:func:`~rlfleet.wire._gather.gather`): each block, or each run, of rows
    straight from the frame it arrived in, with no numpy view or concatenate
    per result.

    Returns:
        The array; None (for numpy's ways, which promote dtypes and refuse
        what does not fit) where the arrays differ in dtype (the gather
        compares their buffers' formats with the answer's), hold objects,
        are scalars, are not C-contiguous buffers (a result left in its
        chunks) or their rows differ in shape (the results the answer holds
        nothing of included).
    """
    first = parts[0]
    dtype = first.dtype
    if dtype.hasobject or not first.ndim:
        return None
    row_shape = first.shape[1:]
    row_bytes = dtype.itemsize * math.prod(row_shape)
    out = empty((layout.rows, *row_shape), dtype)
    if not gather(out, parts, layout.byte_pieces(row_bytes), True):
        return None
    return out


def _joined(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """1-D arrays (a column of each result) one after the other, in one
    :func:`~rlfleet.wire._gather.gather` where they share a dtype, else as
    ``np.concatenate`` joins them."""
    first = arrays[0]
    dtype = first.dtype
    if (
        first.ndim == 1
        and not dtype.hasobject
        and not any(map(operator.ne, map(_DTYPE, arrays), itertools.repeat(dtype)))
    ):
        out = np.empty(sum(map(len, arrays)), dtype)
        if gather(out, arrays, None, True):
            return out
    return np.concatenate(arrays)


def _same_keys(parts: Sequence[Any], keys: Any) -> bool:
    """Whether every part is a mapping of ``keys``, checked in C: a hundred
    results, a few maps each.

    Dicts (every decoded result's) are counted and asked for each key, a few
    hundred instructions a dict, where comparing each one's ``keys()`` took
    2,000-3,000 (an empty dict's too); other mappings compare their keys.
    """
    repeat = itertools.repeat
    if all(map(isinstance, parts, repeat(dict))):
        if any(map(operator.ne, map(len, parts), repeat(len(keys)))):
            return False
        return all(all(map(operator.contains, parts, repeat(key))) for key in keys)
    try:
        return not any(map(operator.ne, map(_KEYS, parts), repeat(keys)))
    except AttributeError:
        return False


#: Where some results are left in their chunks and results interleave in
#: runs of at least this many rows on average (a native worker's results:
#: runs of a few episodes, hundreds of steps), or of this many bytes, the
#: answer's array is the runs' byte pieces one after the other: one gather,
#: the one copy, and a slice of Python per run (about 0.2 us). Shorter runs
#: are joined into one scratch array first and taken from it (``np.take``).
_RUN_ROWS = 64
_RUN_BYTES = 4096


def _gathered(parts: Sequence[Any], layout: _Layout, scattered: bool, empty: Empty) -> np.ndarray:
    """One array of the answer from results whose rows interleave there, where
    :func:`_copied` cannot copy them (results left in their chunks, arrays of
    different dtypes, of objects, or not C-contiguous)."""
    first = parts[0]
    row_bytes = first.dtype.itemsize * math.prod(first.shape[1:])
    one_dtype = len({part.dtype for part in parts}) == 1
    if one_dtype and not first.dtype.hasobject and _long_runs(layout, row_bytes):
        return _in_runs(parts, layout, empty)
    every = _end_to_end(parts, layout.starts[-1], parts, scattered, np.empty)  # scratch
    out = empty((layout.rows, *every.shape[1:]), every.dtype)
    np.take(every, layout.gather, axis=0, out=out, mode="clip")
    return out


def _long_runs(layout: _Layout, row_bytes: int) -> bool:
    """Whether the layout's runs are long enough to copy one by one."""
    if not layout.rows:
        return False
    runs = len(layout.runs)
    return layout.rows >= _RUN_ROWS * runs or layout.rows * row_bytes >= _RUN_BYTES * runs


def _in_runs(parts: Sequence[Any], layout: _Layout, empty: Empty) -> np.ndarray:
    """One array of the answer, its runs of rows copied once from the results
    where some are left in their chunks (:class:`Scattered`): one gather of the
    runs' byte pieces of the chunks and slices of the other results' arrays
    (:func:`_copied` takes the rest).

    Raises:
        _MisfitError: If the results' trailing shapes differ.
    """
    shapes = {_trailing(part) for part in parts}
    shape = shapes.pop()
    if shapes or shape is None:
        raise _MisfitError
    out = empty((layout.rows, *shape), parts[0].dtype)
    if not out.size:
        return out
    row_bytes = out.itemsize * (out.size // len(out))
    sources: list[Any] = []
    for r, start, stop in layout.runs.listed():
        part = parts[r]
        if isinstance(part, Scattered):
            sources += _byte_pieces(part, start * row_bytes, stop * row_bytes)
        else:
            sources.append(np.ascontiguousarray(part[start:stop]))
    _gathered_whole(out, sources)
    return out


def _byte_pieces(part: Scattered, begin: int, end: int) -> list[memoryview]:
    """The bytes ``begin:end`` of a scattered array, as views of its chunks."""
    pieces = []
    at = 0
    for piece in part.pieces:
        size = len(piece)
        if at + size > begin and at < end:
            pieces.append(piece[max(begin - at, 0) : end - at])
        at += size
        if at >= end:
            break
    return pieces


def _gathered_whole(out: np.ndarray, sources: list[Any]) -> None:
    """``sources`` (contiguous buffers: chunks' pieces, arrays) one after the
    other into ``out``, in one :func:`~rlfleet.wire._gather.gather`.

    Raises:
        _MisfitError: If one is not a contiguous buffer after all.
    """
    if not gather(out, sources, None):
        raise _MisfitError


def _trailing(part: Any) -> tuple[int, ...] | None:
    """The shape of a part's rows (None for a scalar, which has none)."""
    return tuple(part.shape[1:]) if part.ndim else None


def _end_to_end(
    heads: Sequence[Any], rows: int, parts: Sequence[Any], scattered: bool, empty: Empty
) -> np.ndarray:
    """A new array of ``heads`` one after the other, of the dtype all ``parts`` fit.

    One ``np.concatenate``: of the arrays (views of the wire, aligned or
    not, copy as fast as any), or, when some are in pieces
    (:class:`Scattered`), of every head's bytes, straight from the chunks.

    Raises:
        _MisfitError: If the heads' trailing shapes differ.
    """
    if scattered and any(isinstance(part, Scattered) for part in parts):
        return _bytes_end_to_end(heads, rows, parts, empty)
    try:
        dtype = np.result_type(*parts)
        out = empty((rows, *np.shape(parts[0])[1:]), dtype)
        if heads:
            np.concatenate(heads, out=out)
    except ValueError:
        raise _MisfitError from None
    return out


def _bytes_end_to_end(
    heads: Sequence[Any], rows: int, parts: Sequence[Any], empty: Empty
) -> np.ndarray:
    """:func:`_end_to_end` where some part is :class:`Scattered`."""
    shapes = {_trailing(part) for part in parts}
    shape = shapes.pop()
    if shapes or shape is None:
        raise _MisfitError
    dtypes = {part.dtype for part in parts}
    out = empty((rows, *shape), np.result_type(*dtypes))
    if not out.size:
        return out
    if len(dtypes) == 1:
        sources: list[Any] = []
        for head in heads:
            if isinstance(head, Scattered):
                sources += head.pieces
            else:
                sources.append(np.ascontiguousarray(head))
        _gathered_whole(out, sources)
        return out
    joined = [head.joined() if isinstance(head, Scattered) else head for head in heads]
    np.concatenate(joined, out=out)
    return out


__all__ = ["Arrays", "Empty", "placed_episodes", "placed_fragments"]
