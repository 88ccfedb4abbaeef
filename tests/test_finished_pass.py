"""A native worker's finished episodes taken by the compiled pass (rlfleet/worker/_finished_pass.c).

``sort_rows`` stands for ``struct.pack``, ``np.lexsort`` and the reordering
of a ``FinishedTable``'s rows; ``step_index`` for ``split_rows``,
``step_types_of`` and the last observations' rows; ``gather_runs`` for
``np.take`` of a column over the step index. Each is checked
against that numpy code, kept as the reference
(``split_rows`` and ``step_types_of`` in tests/native_columns_reference.py),
on random rows; the
result messages of a real native worker's flushes (time limits,
terminations, one-step episodes, an env that raises, several agent
versions) are the same bytes with the reference patched in. Also run
under ASan and UBSan (a ``-fsanitize=address,undefined`` build, libasan
preloaded).
"""

from __future__ import annotations

import struct
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import StepType
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import EnvError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.worker import VecWorker, _native_columns, make_units
from rlfleet.worker._finished_pass import gather_runs, sort_rows, step_index
from rlfleet.worker._join_messages import result_messages
from rlfleet.worker._native_columns import (
    INDEX,
    LAST,
    LENGTH,
    REQUEST,
    SLOT,
    START,
    WIDTH,
)
from tests.native_columns_reference import split_rows, step_types_of

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


def reference_sort_rows(rows: list[int], out: np.ndarray) -> None:
    """The numpy path ``sort_rows`` replaces: pack, ``np.lexsort``, reorder."""
    table = np.frombuffer(struct.pack(f"{len(rows)}q", *rows), np.int64).reshape(-1, WIDTH)
    out[:] = table[np.lexsort((table[:, INDEX], table[:, REQUEST]))].ravel()


def reference_step_index(  # noqa: PLR0917  # the compiled call's positional signature
    table: np.ndarray,
    capacity: int,
    n_slots: int,
    index_out: np.ndarray,
    types_out: np.ndarray,
    last_out: np.ndarray,
) -> None:
    """The numpy path ``step_index`` replaces."""
    starts, lengths, slots = table[:, START], table[:, LENGTH], table[:, SLOT]
    index_out[:] = split_rows(starts, lengths, slots, capacity)
    types_out[:] = step_types_of(lengths, table[:, LAST])
    last_out[:] = slots * capacity + (starts + lengths) % capacity


def reference_gather_runs(
    table: np.ndarray, capacity: int, source: np.ndarray, out: Any, offset: int
) -> None:
    """The numpy path ``gather_runs`` replaces: ``np.take`` over the step index."""
    index = split_rows(table[:, START], table[:, LENGTH], table[:, SLOT], capacity)
    rows = source.take(index, axis=0).tobytes()
    memoryview(out).cast("B")[offset : offset + len(rows)] = rows


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(INT64, min_size=WIDTH - 2, max_size=WIDTH - 2),
            st.integers(0, 3),  # few requests and indices: ties keep the list's order
            st.integers(-2, 6),
        ),
        max_size=60,
    )
)
def test_sorted_rows_are_the_lexsorted_table(
    rows: list[tuple[list[int], int, int]],
) -> None:
    flat: list[int] = []
    for values, request, index in rows:
        row = [*values[:INDEX], index, *values[INDEX:], request]
        flat += row[:WIDTH]
    expected = np.empty(len(flat), np.int64)
    reference_sort_rows(flat, expected)
    out = np.empty(len(flat), np.int64)
    sort_rows(flat, out)
    assert out.tolist() == expected.tolist()


@st.composite
def tables(draw: Any) -> tuple[np.ndarray, int, int]:
    """Rows of episodes in a ring: any start, lengths 1 to the capacity (wrapping)."""
    capacity = draw(st.integers(1, 70))
    n_slots = draw(st.integers(1, 6))
    n = draw(st.integers(0, 25))
    table = np.zeros((n, WIDTH), np.int64)
    for r in range(n):
        table[r, START] = draw(st.one_of(st.integers(0, 3 * capacity), st.integers(0, 1 << 40)))
        table[r, LENGTH] = draw(st.one_of(st.just(1), st.just(capacity), st.integers(1, capacity)))
        table[r, SLOT] = draw(st.integers(0, n_slots - 1))
        table[r, LAST] = draw(st.integers(0, 3))
        table[r, 4:] = draw(st.lists(INT64, min_size=WIDTH - 4, max_size=WIDTH - 4))
    return table, capacity, n_slots


def outputs(table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    total = int(table[:, LENGTH].sum())
    return np.full(total, -7, np.int64), np.full(total, 99, np.uint8), np.full(len(table), -7)


@settings(max_examples=300, deadline=None)
@given(tables())
def test_the_step_index_is_split_rows_and_step_types_of(
    drawn: tuple[np.ndarray, int, int],
) -> None:
    table, capacity, n_slots = drawn
    expected = outputs(table)
    reference_step_index(table, capacity, n_slots, *expected)
    got = outputs(table)
    step_index(table, capacity, n_slots, *got)
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.tolist() == theirs.tolist()
    assert bool((got[0] < capacity * n_slots).all()) and bool((got[0] >= 0).all())


@pytest.mark.parametrize(
    ("column", "value"),
    [(LENGTH, 0), (LENGTH, 9), (START, -1), (SLOT, -1), (SLOT, 2), (LAST, 256), (LAST, -1)],
)
def test_a_row_outside_the_ring_is_refused_and_nothing_written(column: int, value: int) -> None:
    table = np.array([[3, 2, 0, 2, 0, 0, 0, 0, 0, 0]] * 3, np.int64)
    table[1, column] = value
    got = outputs(table)
    with pytest.raises(ValueError, match=r"row 1 .* is outside a ring of 8 rows and 2 slots"):
        step_index(table, 8, 2, *got)
    assert set(got[0].tolist()) == {-7} and set(got[1].tolist()) == {99}
    assert set(got[2].tolist()) == {-7}


def test_outputs_of_the_wrong_size_or_kind_are_refused() -> None:
    table = np.array([[3, 2, 0, 2, 0, 0, 0, 0, 0, 0]], np.int64)
    index, types, last = outputs(table)
    with pytest.raises(ValueError, match="index_out must hold 2 items of 8 bytes"):
        step_index(table, 8, 1, index[:1], types, last)
    with pytest.raises(ValueError, match="types_out must hold 2 items of 1 bytes"):
        step_index(table, 8, 1, index, index, last)
    with pytest.raises(BufferError, match="not writable"):
        step_index(table, 8, 1, index, types, last.tobytes())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a ring of 0 rows"):
        step_index(table, 0, 1, index, types, last)
    with pytest.raises(ValueError, match="int64 rows of 10"):
        step_index(table[:, :5].copy(), 8, 1, index, types, last)
    with pytest.raises(ValueError, match="hold 11 ints, not whole rows of 10"):
        sort_rows(list(range(11)), np.empty(11, np.int64))
    with pytest.raises(ValueError, match="out must hold 10 items"):
        sort_rows(list(range(10)), np.empty(9, np.int64))
    with pytest.raises(TypeError, match="must be a list of ints"):
        sort_rows(tuple(range(10)), np.empty(10, np.int64))  # type: ignore[arg-type]
    untouched = np.full(20, -7, np.int64)
    with pytest.raises(OverflowError):
        sort_rows([*range(10), 1 << 63, *range(9)], untouched)
    assert set(untouched.tolist()) == {-7}
    # An __index__ that empties the list is seen, not read past.
    rows: list[Any] = list(range(20))

    class Shrinks:
        def __index__(self) -> int:
            rows.clear()
            return 1

    rows[3] = Shrinks()
    with pytest.raises(RuntimeError, match="rows changed while read"):
        sort_rows(rows, np.empty(20, np.int64))
    # Ints by their __index__, as struct.pack takes them.
    out = np.empty(10, np.int64)
    sort_rows([np.int64(5), *range(9)], out)  # type: ignore[list-item]
    assert out.tolist() == [5, *range(9)]


@settings(max_examples=200, deadline=None)
@given(tables(), st.sampled_from([(), (1,), (3,), (2, 3)]), st.sampled_from(["u1", "f4", "i8"]))
def test_episode_runs_gather_the_bytes_np_take_gathers(
    drawn: tuple[np.ndarray, int, int], trailing: tuple[int, ...], dtype: str
) -> None:
    table, capacity, n_slots = drawn
    rng = np.random.default_rng(len(table))
    source = rng.integers(0, 256, (n_slots * capacity, *trailing)).astype(dtype)
    index = outputs(table)[0]
    step_index(table, capacity, n_slots, index, *outputs(table)[1:])
    expected = source.take(index, axis=0).tobytes()
    # Into a larger buffer, from an offset of any alignment: the rest untouched.
    buffer = bytearray(b"\xee" * (len(expected) + 13))
    gather_runs(table, capacity, source, buffer, 5)
    assert bytes(buffer[5 : 5 + len(expected)]) == expected
    assert buffer[:5] == b"\xee" * 5 and buffer[5 + len(expected) :] == b"\xee" * 8


def test_episode_runs_out_of_the_ring_or_the_buffer_are_refused_and_nothing_written() -> None:
    source = np.arange(16, dtype=np.int64).reshape(8, 2)  # 2 slots of 4 rows
    table = np.array([[3, 2, 1, 2, 0, 0, 0, 0, 0, 0]], np.int64)
    buffer = bytearray(32)
    gather_runs(table, 4, source, buffer, 0)  # rows 7 and 4: the run wraps
    assert np.frombuffer(buffer, np.int64).tolist() == [14, 15, 8, 9]
    for column, value in ((LENGTH, 5), (LENGTH, 0), (SLOT, 2), (START, -4)):
        bad = table.copy()
        bad[0, column] = value
        untouched = bytearray(b"\xee" * 80)
        with pytest.raises(ValueError, match=r"row 0 .* is outside a ring of 4 rows and 2 slots"):
            gather_runs(bad, 4, source, untouched, 0)
        assert untouched == b"\xee" * 80
    with pytest.raises(ValueError, match="2 rows of 16 bytes from offset 1 do not fit in 32"):
        gather_runs(table, 4, source, buffer, 1)
    with pytest.raises(ValueError, match="from offset -1"):
        gather_runs(table, 4, source, buffer, -1)
    with pytest.raises(ValueError, match="a source of 8 rows is no ring of 3 rows"):
        gather_runs(table, 3, source, buffer, 0)
    with pytest.raises(BufferError, match="not writable"):
        gather_runs(table, 4, source, bytes(32), 0)
    with pytest.raises(ValueError, match="gather_runs' table must be int64 rows of 10"):
        gather_runs(table[:, :5].copy(), 4, source, buffer, 0)


class _Mixed(CartPoleVectorEnv):
    """CartPole's native vector env pushed off its track now and then, and raising once.

    Every 7th call one env is moved past the threshold (a termination in that
    step: a one-step episode when it had just started); call 140 raises
    (every episode in flight is dropped and the env reset as a whole). The
    registration's time limit truncates the rest.
    """

    calls = 0

    def step(self, action: Any) -> Any:
        self.calls += 1
        if self.calls == 140:
            raise RuntimeError("the native env broke")
        if self.calls % 7 == 0:
            assert self.state is not None
            self.state[0, self.calls % self.num_envs] = 3.0
        return super().step(action)


gym.register(
    "rlfleet-test/MixedCartPoles-v0",
    entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
    vector_entry_point="tests.test_finished_pass:_Mixed",
    max_episode_steps=15,
)


def flushes(requests: int = 3) -> tuple[list[bytes], dict[str, set[int]]]:
    """Every result message of a native worker's flushes, in order, and what they held."""
    config = EnvConfig("rlfleet-test/MixedCartPoles-v0", vectorization="vector_entry_point")
    spec = config.env_spec()
    worker = VecWorker(n_envs=8, seed=1, env=config, policy=MLPCategoricalPolicy(spec, seed=0))
    written: list[bytes] = []
    seen: dict[str, set[int]] = {"last": set(), "length": set(), "version": set(), "errors": set()}
    try:
        for request in range(requests):
            worker.submit(make_units(5, request, range(60)))
        for flush in range(40):
            if flush in (9, 21):  # agent versions 1 and 2 (running episodes re-queued)
                worker.update_agent(MLPCategoricalPolicy(spec, seed=flush))
            for _ in range(7):
                try:
                    worker.step()
                except EnvError:
                    seen["errors"].add(flush)
            # A flush of no episodes writes nothing, in either path.
            pieces = worker.take_finished_pieces(request=flush % requests)
            if pieces is None:
                continue
            messages, _ = result_messages(
                pieces,
                task_id=flush,
                episode_indices=pieces.episode_infos["episode_index"],
                env_generation=1,
                batch_id=flush,
                # One message gathers its columns into it; several gather first.
                max_message_bytes=3_000 if flush % 2 else 4 << 20,
            )
            written += [bytes(message) for message in messages]
            ends = np.cumsum(pieces.lengths) - 1
            seen["last"].update(np.asarray(pieces.step_types)[ends].tolist())
            seen["length"].update(pieces.lengths.tolist())
            seen["version"].update(pieces.episode_infos["agent_version"].tolist())
    finally:
        worker.shutdown()
    return written, seen


def test_a_native_workers_result_messages_are_the_reference_paths_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written, seen = flushes()
    with monkeypatch.context() as patched:
        patched.setattr(_native_columns, "sort_rows", reference_sort_rows)
        patched.setattr(_native_columns, "step_index", reference_step_index)
        patched.setattr(_native_columns, "gather_runs", reference_gather_runs)
        reference, _ = flushes()
    assert written == reference
    # What the flushes held: both endings, one-step and time-limited
    # episodes, three agent versions, the env's failure.
    assert seen["last"] == {int(StepType.TERMINAL), int(StepType.TIMEOUT)}
    assert {1, 15} <= seen["length"]
    assert seen["version"] == {0, 1, 2}
    assert seen["errors"]
