"""Episode units as columns: the Task's two wire forms, a task's books, the STEPS prefix.

The scheduler books units, a Task carries them and a worker takes them in
as int64 columns (rlfleet.protocol.unit_columns); these check each stage
against the per-unit rules it replaced.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import types
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.unit_path import SLOTS, one_round
from rlfleet.core.seeding import episode_seed_columns, episode_seeds
from rlfleet.envs import EnvConfig
from rlfleet.protocol.join import TaskAssignment
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.scheduling.orders import RequestSpec
from rlfleet.scheduling.task_units import TaskUnits
from rlfleet.scheduling.units import EpisodeRequest
from rlfleet.v1 import worker_pb2
from rlfleet.wire import decode_task, encode_task
from rlfleet.worker import units as units_module
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.units import EpisodeUnit, UnitRow
from rlfleet.worker.vec import VecWorker
from tests.test_result_message import python_calls

unit_rows = st.lists(
    st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    max_size=60,
)


def task_of(units: UnitColumns) -> TaskAssignment:
    return TaskAssignment(9, 4, Mode.EPISODES.value, 3, 2, units=units)


def over_the_wire(task: TaskAssignment, *, unit_columns: bool) -> TaskAssignment:
    data = encode_task(task, unit_columns=unit_columns).SerializeToString()
    return decode_task(worker_pb2.Task.FromString(data))


# --- the Task's two forms ------------------------------------------------------------


def test_a_task_books_units_reach_its_vec_worker_as_rows_built_without_a_call_each() -> None:
    """A TaskBook hands its VecWorker each unit as a ``UnitRow`` of its task's
    columns (about one per 21 steps of a native CartPole): tuples, built with no
    Python call per unit, holding the fields of the checked ``EpisodeUnit``; the
    VecWorker gives back ``EpisodeUnit`` objects when it drops them unstarted."""
    columns = UnitColumns.seeded(7, 3, np.arange(5, 45))
    expected = [
        EpisodeUnit(int(i), int(e), int(p), 3)
        for i, e, p in zip(
            columns.episode_indices, columns.env_seeds, columns.policy_seeds, strict=True
        )
    ]
    gc.disable()  # a collection may run the test runner's Python callbacks
    try:
        few = python_calls(lambda: UnitRow.of_columns(columns, 3, slice(0, 2)))
        many = python_calls(lambda: UnitRow.of_columns(columns, 3, slice(0, 40)))
    finally:
        gc.enable()
    assert few == many == 2  # the lambda and of_columns
    rows = UnitRow.of_columns(columns, 3, slice(10, 30))
    assert [row.unit() for row in rows] == expected[10:30]
    assert all(type(row) is UnitRow for row in rows)
    env = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
    vec = VecWorker(n_envs=4, env=env, policy="mlp-categorical")
    try:
        book = TaskBook(vec)
        book.add(EpisodeTask(task_id=3, request_id=1, agent_version=-1, env_generation=0), columns)
        queued = list(vec._units.queue)
        assert queued and all(type(unit) is UnitRow for unit in queued)
        dropped = vec.drop_queued()
        assert dropped == expected[: len(queued)]
        assert all(type(unit) is EpisodeUnit for unit in dropped)
    finally:
        vec.shutdown()


def test_units_run_from_rows_give_the_batch_of_the_same_units_submitted() -> None:
    """The same units give the same batch, bit for bit, whether a VecWorker got
    them as ``EpisodeUnit`` objects or as a TaskBook's rows."""
    columns = UnitColumns.seeded(7, 3, np.arange(40))
    env = EnvConfig("CartPole-v1", vectorization="vector_entry_point")
    batches = []
    for rows in (False, True):
        vec = VecWorker(n_envs=8, env=env, policy="mlp-categorical", seed=1)
        try:
            if rows:
                vec.submit_rows(UnitRow.of_columns(columns, 3, slice(None)))
            else:
                vec.submit(EpisodeUnit.many(columns, 3))
            while not vec.idle:
                vec.step()
            batches.append(vec.take_finished())
        finally:
            vec.shutdown()
    first, second = batches
    assert first is not None and second is not None and first.n_episodes == 40
    assert first.episode_infos["episode_index"].tolist() == list(range(40))
    for name in ("observations", "actions", "rewards", "step_types", "last_observations"):
        assert np.array_equal(getattr(first, name), getattr(second, name)), name
    for key, value in first.episode_infos.items():
        assert np.array_equal(value, second.episode_infos[key]), key


@settings(max_examples=150, deadline=None)
@given(rows=unit_rows)
def test_columns_and_episode_unit_messages_carry_the_same_units(
    rows: list[tuple[int, int, int]],
) -> None:
    units = UnitColumns.of_rows(rows)
    as_columns = encode_task(task_of(units), unit_columns=True)
    as_messages = encode_task(task_of(units), unit_columns=False)
    # One form or the other, never both; nothing at all for no units.
    assert not as_columns.units
    assert not as_messages.HasField("unit_columns")
    assert as_columns.HasField("unit_columns") == bool(rows)
    assert [(u.episode_index, u.env_seed, u.policy_seed) for u in as_messages.units] == rows
    for form in (True, False):
        back = over_the_wire(task_of(units), unit_columns=form)
        assert back.units == units and list(back.units) == rows
        assert back.unreadable == ""
        assert back._replace(units=units) == task_of(units)


def test_columns_are_little_endian_arrays_of_one_length() -> None:
    units = UnitColumns([1, 2**40], [7, 2**32 - 1], [0, 5])
    columns = encode_task(task_of(units), unit_columns=True).unit_columns
    assert columns.episode_indices == np.array([1, 2**40], "<i8").tobytes()
    assert columns.env_seeds == np.array([7, 2**32 - 1], "<u4").tobytes()
    assert columns.policy_seeds == np.array([0, 5], "<u4").tobytes()


@pytest.mark.parametrize(
    ("mangle", "why"),
    [
        (lambda t: setattr(t.unit_columns, "env_seeds", b"\0" * 7), "env_seeds holds 7 bytes"),
        (lambda t: setattr(t.unit_columns, "policy_seeds", b"\0" * 4), "differ in length"),
        (lambda t: t.units.add(episode_index=1), "both units and unit_columns"),
        (
            lambda t: setattr(
                t.unit_columns, "episode_indices", np.array([0, -3], "<i8").tobytes()
            ),
            "episode_indices[1]: -3 is negative",
        ),
    ],
)
def test_malformed_columns_make_the_task_unreadable_not_the_stream(
    mangle: Callable[[worker_pb2.Task], object], why: str
) -> None:
    message = encode_task(task_of(UnitColumns([0, 1], [2, 3], [4, 5])), unit_columns=True)
    mangle(message)
    task = decode_task(worker_pb2.Task.FromString(message.SerializeToString()))
    assert task.task_id == 9 and len(task.units) == 0
    assert task.unreadable.startswith("units it cannot decode") and why in task.unreadable


def test_episode_seed_columns_are_episode_seeds() -> None:
    for indices in (np.arange(5), np.arange(100, 400), np.array([2**32 - 1, 2**32, 0])):
        env, policy = episode_seed_columns(7, 3, indices)
        expected = [episode_seeds(7, 3, i) for i in indices.tolist()]
        assert list(zip(env.tolist(), policy.tolist(), strict=True)) == expected
        assert env.dtype == policy.dtype == np.int64


# --- a task's books --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_task_units_book_as_a_set_of_indices_would(data: st.DataObject) -> None:
    book, given_, outstanding = TaskUnits(), set[int](), set[int]()
    snapshots: list[tuple[UnitColumns, list[int]]] = []
    # The units added, and a copy: a task takes a new task's first units'
    # columns as its own, and never writes into them.
    added: list[tuple[UnitColumns, UnitColumns]] = []
    next_index = 1000
    for _ in range(data.draw(st.integers(1, 8))):
        if data.draw(st.booleans()):
            # A refill: new indices past the held ones, or requeued lower ones.
            low = data.draw(st.booleans())
            start = data.draw(st.integers(0, 999)) if low else next_index
            count = data.draw(st.integers(1, 150))
            fresh = [i for i in range(start, start + count) if i not in given_]
            if not low:
                next_index = start + count
            units = UnitColumns.seeded(5, 1, fresh)
            if data.draw(st.booleans()):  # columns that are strided views
                units = UnitColumns.of_rows(units)
            book.add(units)
            added.append((units, UnitColumns.of_rows(units)))
            given_.update(fresh)
            outstanding.update(fresh)
            snapshots.append((book.given, sorted(given_)))
            continue
        # A result: some outstanding units, maybe one foreign or repeated.
        pool = sorted(outstanding)
        result = data.draw(st.lists(st.sampled_from(pool), unique=True)) if pool else []
        bad = data.draw(st.sampled_from(["", "foreign", "again", "twice"]))
        if bad == "foreign":
            result.append(next_index + 7)
        elif bad == "again" and given_ - outstanding:
            result.append(min(given_ - outstanding))
        elif bad == "twice" and result:
            result.append(result[0])
        if not result:
            continue
        indices = np.array(result, dtype=np.int64)
        problem, positions = book.check(indices, 3)
        assert not book.all_outstanding([tuple(result)]) or not problem  # the compiled look
        foreign = [i for i in result if i not in given_]
        again = [i for i in result if i not in outstanding]
        if foreign:
            assert problem == f"episodes {foreign[:5]} are not units of task 3"
        elif again or len(set(result)) != len(result):
            assert problem == f"episodes {(again or result)[:5]} of task 3 came twice"
        else:
            assert problem == ""
            book.complete(positions)
            outstanding.difference_update(result)
        assert book.outstanding == len(outstanding)
        assert book.outstanding_indices().tolist() == sorted(outstanding)
    # Every unit keeps its seeds, and a snapshot stays what it was.
    assert book.given == UnitColumns.seeded(5, 1, sorted(given_))
    for snapshot, held in snapshots:
        assert snapshot == UnitColumns.seeded(5, 1, held)
    for units, copy in added:
        assert units == copy


# --- the STEPS prefix --------------------------------------------------------------------


def prefix_answer(lengths: list[int], amount: int) -> tuple[int | None, int]:
    """The per-episode rule: the smallest m whose first m lengths reach the amount."""
    total = 0
    for m, length in enumerate(lengths, start=1):
        total += length
        if total >= amount:
            return m, total
    return None, total


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=80),
    amount=st.integers(1, 600),
    data=st.data(),
)
def test_steps_answer_is_the_prefix_rule_whatever_the_order_and_split_of_results(
    lengths: list[int], amount: int, data: st.DataObject
) -> None:
    request = EpisodeRequest(1, RequestSpec(Mode.STEPS, amount, 7, 0, 0, 0), subscription=False)
    request.handed_out(len(lengths))
    order = data.draw(st.permutations(range(len(lengths))))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(order)), max_size=6)))
    for start, end in zip([0, *cuts], [*cuts, len(order)], strict=True):
        part = sorted(order[start:end])  # a result's indices are ascending
        if part and not request.done:
            request.complete(np.array(part), np.array([lengths[i] for i in part]))
    # Every episode is back: the answer is known if the lengths reach the amount.
    num, steps = prefix_answer(lengths, amount)
    assert request.num_episodes == num
    if num is not None:
        assert request.footer().num_episodes == num and request.footer().total_steps == steps


def test_requeued_units_come_back_lowest_first() -> None:
    request = EpisodeRequest(1, RequestSpec(Mode.EPISODES, 50, 7, 0, 0, 0), subscription=False)
    assert request.take_many(20, 4, None).tolist() == list(range(20))
    request.requeue(np.array([12, 3, 17]), lost=True)
    assert heapq.nsmallest(3, request.requeued) == [3, 12, 17]
    assert request.take_many(5, 4, None).tolist() == [3, 12, 17, 20, 21]
    assert request.reassigned_units == 3 and request.outstanding == 22


# --- the worker's intake --------------------------------------------------------------------


def test_waiting_units_run_once_each_with_their_seeds_and_cancels_drop_them() -> None:
    vec = VecWorker(n_envs=2, env=EnvConfig("CartPole-v1"))
    try:
        book = TaskBook(vec)
        first = EpisodeTask(task_id=1, request_id=1, agent_version=-1, env_generation=0)
        book.add(first, UnitColumns.seeded(3, 1, range(6)))
        book.add(first, UnitColumns.seeded(3, 1, range(6, 9)))  # a refill
        second = EpisodeTask(task_id=2, request_id=2, agent_version=-1, env_generation=0)
        book.add(second, UnitColumns.seeded(3, 2, range(4)))
        book.add(EpisodeTask(3, 3, -1, 0), UnitColumns.seeded(3, 3, range(5)))
        # A block in the VecWorker: a unit per slot and as many again.
        assert book.queued_units == 18 and vec.queued_count == 4
        assert first.remaining == set(range(9))
        book.cancel(1, [2, 3, 7])
        book.drop([3])
        assert first.remaining == {0, 1, 4, 5, 6, 8}
        assert book.queued_units == 10
        while book.queued_units or vec.active_count:
            vec.step()
            book.feed()
        for task, request, indices in ((1, 1, [0, 1, 4, 5, 6, 8]), (2, 2, [0, 1, 2, 3])):
            batch = vec.take_finished(request=task)
            assert batch is not None
            infos = batch.episode_infos
            assert infos["episode_index"].tolist() == indices
            env, policy = infos["env_seed"].tolist(), infos["policy_seed"].tolist()
            seeds = list(zip(env, policy, strict=True))
            assert seeds == [episode_seeds(3, request, i) for i in indices]
        assert vec.take_finished() is None
    finally:
        vec.shutdown()


def test_the_unit_path_benchmark_times_each_stage() -> None:
    vec = VecWorker(n_envs=SLOTS, env=EnvConfig("CartPole-v1", vectorization="vector_entry_point"))
    try:
        for unit_columns in (True, False):
            # Results of 50: five of them and the slots stay within the
            # refill's capacity_steps, so the refill is the 200 booked.
            count, stages, booking = one_round(vec, 200, 50, unit_columns=unit_columns)
            assert count == 200 and len(stages) == 3
            assert min(stages) >= 0 and booking >= 0
    finally:
        vec.shutdown()


def test_units_of_columns_are_built_without_a_generic_setattr_per_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``EpisodeUnit.many`` builds its units' objects from checked rows: their
    fields are set through their slots' own setters, not ``object.__setattr__``,
    which looks each name up again. The units are those the checked
    constructor makes, and stay frozen."""
    calls = 0

    def counted_setattr(target: object, name: str, value: object) -> None:
        nonlocal calls
        calls += 1
        object.__setattr__(target, name, value)

    # Stands for ``object`` in the units module: counts generic setattrs.
    spy = types.SimpleNamespace(__new__=object.__new__, __setattr__=counted_setattr)
    monkeypatch.setattr(units_module, "object", spy, raising=False)
    columns = UnitColumns.seeded(7, 3, np.arange(5, 45))
    built = EpisodeUnit.of_rows(UnitRow.of_columns(columns, 3, slice(10, 30)))
    assert calls == 0
    monkeypatch.undo()
    assert built == [
        EpisodeUnit(int(i), int(e), int(p), 3)
        for i, e, p in zip(
            columns.episode_indices[10:30],
            columns.env_seeds[10:30],
            columns.policy_seeds[10:30],
            strict=True,
        )
    ]
    assert all(type(unit) is EpisodeUnit for unit in built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].request = 4  # type: ignore[misc]


@settings(max_examples=150, deadline=None)
@given(
    given_=st.lists(st.integers(0, 60), unique=True, max_size=30),
    asked=st.lists(st.integers(-5, 70), unique=True, max_size=10),
)
def test_holds_any_answers_as_a_set_of_the_units_given_would(
    given_: list[int], asked: list[int]
) -> None:
    # A refill's new units lie past every unit given: answered without a search.
    book = TaskUnits()
    ordered = np.array(sorted(given_), dtype=np.int64)
    book.add(UnitColumns(ordered, ordered, ordered))
    indices = np.array(sorted(asked), dtype=np.int64)
    assert book.holds_any(indices) == bool(set(given_) & set(asked))
