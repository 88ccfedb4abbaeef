"""A task's units found and booked in one call (rlfleet/scheduling/_unit_book.c)
answer as the numpy reference does, and the scheduler's batches book as its
results one at a time.

The C calls read a worker's result header (network input): random columns,
random results (foreign, repeated, not outstanding, empty, not ints, past
int64) and random lengths are held to the numpy search the scheduler made
before (``_positions``, its reference) and numpy's indexing; random batches
of a scheduler with units moved away are held to :meth:`Scheduler.classify`
and :meth:`Scheduler.complete` one result at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import positions_in
from rlfleet.scheduling._unit_book import outstanding, scatter
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler

_INT64 = 1 << 63


def _positions(
    held: np.ndarray, out: np.ndarray, count: int, columns: list[np.ndarray]
) -> np.ndarray | None:
    """Where held[:count] holds the results' episodes if all are outstanding,
    none twice: the scheduler's numpy search, one sorted search for all."""
    indices = np.concatenate(columns)
    positions, found = positions_in(held[:count], indices)
    if not found.all() or not out[positions].all():
        return None
    ordered = np.sort(positions)
    return None if (ordered[1:] == ordered[:-1]).any() else positions


def _reference(held: np.ndarray, out: np.ndarray, count: int, results: list[Any]) -> bool:
    """What the numpy path says: every result a non-empty run of int64 ints,
    all units of held[:count] outstanding, none twice."""
    if not results:
        return False
    columns = []
    for result in results:
        if not isinstance(result, tuple | list) or not result:
            return False
        if not all(type(v) is int and -_INT64 <= v < _INT64 for v in result):
            return False
        columns.append(np.array(result, dtype=np.int64))
    return _positions(held, out, count, columns) is not None


def _lengths_fit(results: list[Any], lengths: list[Any]) -> bool:
    return len(lengths) == len(results) and all(
        isinstance(ls, tuple | list)
        and len(ls) == len(r)
        and all(type(v) is int and -_INT64 <= v < _INT64 for v in ls)
        for r, ls in zip(results, lengths, strict=True)
    )


_value = st.one_of(
    st.integers(0, 40),
    st.integers(0, 40),
    st.sampled_from([-1, _INT64 - 1, _INT64, -_INT64 - 1, 1 << 70]),
    st.sampled_from([np.int64(3), 3.0, "3", None, True]),
)
_result = st.one_of(
    st.lists(_value, max_size=6),
    st.lists(st.integers(0, 40), max_size=6).map(tuple),
    st.just(np.arange(2, dtype=np.int64)),
)


@st.composite
def _columns(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    held = sorted(set(draw(st.lists(st.integers(0, 40), max_size=30))))
    count = draw(st.integers(0, len(held)))
    spare = draw(st.integers(0, 4))  # room to grow past count, as TaskUnits keeps
    index = np.array([*held, *range(100, 100 + spare)], dtype=np.int64)
    out = np.array(draw(st.lists(st.booleans(), min_size=len(index), max_size=len(index))))
    return index, out.astype(bool), count


@settings(max_examples=800, deadline=None)
@given(_columns(), st.lists(_result, max_size=4), st.booleans())
@example((np.array([1, 2, 3], dtype=np.int64), np.ones(3, dtype=bool), 3), [(1, 2), [3, 1]], True)
@example((np.array([1, 2, 3], dtype=np.int64), np.ones(3, dtype=bool), 3), [(3, 2), (2,)], False)
@example((np.array([1, 2, 3], dtype=np.int64), np.ones(3, dtype=bool), 2), [(3,)], False)
def test_outstanding_answers_as_the_numpy_path(
    columns: tuple[np.ndarray, np.ndarray, int], results: list[Any], mark: bool
) -> None:
    held, out, count = columns
    expected = _reference(held, out.copy(), count, results)
    before = out.copy()
    assert outstanding(held, out, count, results, None, mark) is expected
    if mark and expected:
        columns64 = [np.array(r, dtype=np.int64) for r in results]
        positions = _positions(held, before, count, columns64)
        assert positions is not None
        before[positions] = False
        assert out.tolist() == before.tolist()  # the same units marked back
    else:
        assert out.tolist() == before.tolist()  # nothing changed


@settings(max_examples=400, deadline=None)
@given(_columns(), st.lists(_result, max_size=3), st.lists(_result, max_size=3))
def test_outstanding_with_lengths_also_needs_as_many_int_lengths(
    columns: tuple[np.ndarray, np.ndarray, int], results: list[Any], lengths: list[Any]
) -> None:
    held, out, count = columns
    expected = _reference(held, out, count, results) and _lengths_fit(results, lengths)
    before = out.copy()
    assert outstanding(held, out, count, results, lengths, True) is expected
    assert (out.tolist() != before.tolist()) is expected


def test_outstanding_refuses_columns_not_the_schedulers() -> None:
    held, out = np.arange(4, dtype=np.int64), np.ones(4, dtype=bool)
    with pytest.raises(ValueError, match="count 5 is outside its columns"):
        outstanding(held, out, 5, [(1,)], None, False)
    with pytest.raises(ValueError, match="count -1"):
        outstanding(held, out, -1, [(1,)], None, False)
    with pytest.raises(TypeError, match="held must be a 1-D C-contiguous int64 array"):
        outstanding(held.astype(np.int32), out, 4, [(1,)], None, False)
    with pytest.raises(ValueError, match="not C-contiguous"):  # numpy's refusal
        outstanding(np.arange(8, dtype=np.int64)[::2], out, 4, [(1,)], None, False)
    with pytest.raises(TypeError, match="out must be a 1-D C-contiguous bool array"):
        outstanding(held, out.astype(np.uint8), 4, [(1,)], None, False)
    out.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        outstanding(held, out, 4, [(1,)], None, True)  # marking needs a writable column
    assert outstanding(held, out, 4, [(1,)], None, False) is True


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(-3, 40),
    st.lists(st.tuples(_value, _value), max_size=6),
)
def test_scatter_writes_as_numpy_indexing_or_refuses_leaving_known_whole(
    size: int, base: int, pairs: list[tuple[Any, Any]]
) -> None:
    known = np.full(size, -1, dtype=np.int64)
    indices, lengths = [i for i, _ in pairs], tuple(v for _, v in pairs)
    ints = all(type(v) is int and -_INT64 <= v < _INT64 for pair in pairs for v in pair)
    fits = ints and all(0 <= i - base < size for i in indices)
    if fits:
        expected = known.copy()
        expected[np.array(indices, dtype=np.int64) - base] = np.array(lengths, dtype=np.int64)
        scatter(known, base, indices, lengths)
        assert known.tolist() == expected.tolist()
    else:
        with pytest.raises((TypeError, ValueError)):
            scatter(known, base, indices, lengths)
        assert known.tolist() == [-1] * size


def test_scatter_refuses_uneven_counts_and_other_forms() -> None:
    known = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match="2 indices and 1 lengths"):
        scatter(known, 0, (1, 2), (5,))
    with pytest.raises(TypeError, match="lists or tuples"):
        scatter(known, 0, np.arange(2), (5, 6))
    assert known.tolist() == [0, 0, 0, 0]


# --- the scheduler's batches ---------------------------------------------


def _fleet() -> tuple[Scheduler, dict[int, list[int]]]:
    """Two workers of 4 slots on a STEPS request, the second's tail moved to
    the first: each worker's task ids and the units they were dealt."""
    scheduler = Scheduler(prefetch_factor=2, capacity_steps=0, move_units=True)
    for worker_id in (1, 2):
        scheduler.add_worker(worker_id, 4)
        scheduler.set_eligible(worker_id, True)
    scheduler.start_sample(RequestSpec(Mode.EPISODES, 24, 7, 0, 0, 1))
    dealt = {o.task_id: o.units.episode_indices.tolist() for o in scheduler.dispatch()}
    # Worker 1 books 8 episodes and is refilled at the tail: units of worker
    # 2's task move to a new task of worker 1 (results naming them are ignored).
    first = min(dealt)
    scheduler.complete(1, first, dealt[first][:8], [50] * 8)
    for order in scheduler.dispatch():
        dealt.setdefault(order.task_id, []).extend(order.units.episode_indices.tolist())
    assert scheduler.moved_units
    return scheduler, dealt


def _state(scheduler: Scheduler, tasks: list[int]) -> list[Any]:
    books = scheduler._books
    return [
        scheduler.units_in_flight(1),
        scheduler.units_in_flight(2),
        sorted(books.tasks),
        [books.tasks[t].units.outstanding_indices().tolist() for t in sorted(books.tasks)],
        [(r.request_id, r.footer(), r.done) for r in books.requests.values()],
        scheduler.mean_episode_length,
    ]


_batch = st.lists(
    st.tuples(
        st.integers(1, 4),  # the task (4: never sent)
        st.one_of(
            st.lists(st.integers(0, 33), min_size=0, max_size=5),
            # Runs of the tasks' units: outstanding (4-7, 12-19), booked
            # (0-3, 8-11), moved away from task 2 (20-23).
            st.sampled_from([[4, 5], [6, 7], [12, 13, 14, 15], [16, 17], [18, 19], [20, 21]]),
            st.sampled_from([[4, 5, 6, 7], [14, 15], [19, 22], [2, 3], [13], [15, 14]]),
        ),
        st.sampled_from(["tuple", "list", "array"]),
        st.integers(1, 30),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2), _batch, st.booleans())
def test_batches_are_judged_and_booked_as_their_results_one_at_a_time(
    worker: int, drawn: list[tuple[int, list[int], str, int]], ascending: bool
) -> None:
    def form(values: list[int], kind: str) -> Any:
        if kind == "array":
            return np.array(values, dtype=np.int64)
        return tuple(values) if kind == "tuple" else list(values)

    results = []
    for task, drawn_indices, kind, length in drawn:
        indices = sorted(drawn_indices) if ascending else drawn_indices
        results.append((task, form(indices, kind), form([length] * len(indices), kind)))
    batched, alone = _fleet()[0], _fleet()[0]
    judged = batched.classify_many(worker, [(t, i) for t, i, _ in results])
    assert judged == [alone.classify(worker, t, i) for t, i, _ in results]
    rest, booked = list(results), []
    while rest:
        rulings = batched.complete_many(worker, rest)
        booked += rulings
        rest = rest[len(rulings) :]
    one_by_one = [alone.complete(worker, t, i, ls) for t, i, ls in results]
    assert booked == one_by_one
    tasks = sorted(batched._books.tasks)
    assert _state(batched, tasks) == _state(alone, tasks)
