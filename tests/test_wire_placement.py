"""A learner's answer placed from received results (rlfleet.wire.placement), through the wire.

Results are encoded, cut into chunks of random sizes and read back as a
learner's Sample call reads them (``ResultAssembler.add_kept``: one chunk
decoded as views, several left in their chunks), so the rows placed are
views of the received bytes, mostly unaligned, as on a real learner. Every
answer must equal concatenating the materialized results, then ordering
(the general path), bit for bit and dtype for dtype.

The checks on both sides also do a bounded amount of Python per result:
counted as the line events of ``sys.settrace``, which grow with every
Python step a loop over episodes or results takes (a behaviour, not a
wall-clock time).
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import EpisodeBatch
from rlfleet.core.episode_order import first_episodes, sort_fragments
from rlfleet.core.seeding import NO_ENV_SEED, NO_POLICY_SEED
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.v1 import worker_pb2
from rlfleet.wire import _gather, encode_batch_chunks, placement
from rlfleet.wire.placement import placed_episodes, placed_fragments
from rlfleet.wire.result_checks import ResultExpectation, check_result
from rlfleet.wire.results import (
    Result,
    ResultAssembler,
    assemble_episodes,
    assemble_fragments,
    decode_result,
)
from tests.test_client_assembly import SPEC, batch

#: The fields of a batch whose arrays are placed, besides the info dicts.
_ARRAYS = ("observations", "last_observations", "actions", "rewards", "step_types", "lengths")


def _leaves(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, np.ndarray]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}[{key}]")
        else:
            yield f"{prefix}[{key}]", value


def assert_identical(got: EpisodeBatch, want: EpisodeBatch) -> None:
    """Same arrays, dtypes and (nested) info keys."""
    assert got == want
    pairs = [(getattr(got, name), getattr(want, name), name) for name in _ARRAYS]
    for group in ("episode_infos", "env_infos", "agent_infos"):
        got_leaves, want_leaves = (
            dict(_leaves(getattr(got, group), group)),
            dict(_leaves(getattr(want, group), group)),
        )
        assert got_leaves.keys() == want_leaves.keys(), group
        pairs += [(got_leaves[key], want_leaves[key], key) for key in want_leaves]
    for a, b, name in pairs:
        assert a.dtype == b.dtype, name


def episodes(lengths: list[int], indices: list[int], worker: int) -> EpisodeBatch:
    """Counter episodes (observation = index * 100 + step) with infos of several shapes.

    Episode infos include a (N, 2) column; agent infos are nested and of rows
    small and large; env infos are empty.
    """
    base = batch(lengths, indices)
    index = np.asarray(indices, dtype=np.int64)
    steps = len(base.rewards)
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={
            **base.episode_infos,
            "worker": np.full(len(indices), worker, dtype=np.int64),
            "pair": np.stack([index, -index], axis=1).astype(np.int32),
        },
        observations=base.observations,
        last_observations=base.last_observations,
        actions=(base.observations[:, 0].astype(np.int64) % 2),
        rewards=base.rewards,
        env_infos={},
        agent_infos={
            "log_prob": base.agent_infos["log_prob"],
            "policy": {"value": np.arange(steps, dtype=np.float64).reshape(-1, 1) * 0.5},
            # Rows of 64 bytes.
            "features": base.observations + np.arange(16, dtype=np.float32),
        },
        step_types=base.step_types,
        lengths=base.lengths,
    )


def received(b: EpisodeBatch, worker: int, chunk_bytes: int, batch_id: int) -> Result:
    """``b`` as a learner's Sample call keeps it: sent in chunks, decoded where they arrived."""
    chunks = encode_batch_chunks(b, chunk_bytes, batch_id=batch_id, include_env_spec=False)
    meta = worker_pb2.EpisodeResult(
        task_id=batch_id + 1,
        episode_indices=b.episode_infos["episode_index"].tolist(),
        lengths=b.lengths.tolist(),
        worker_id=worker,
    )
    assembler = ResultAssembler(SPEC, per_worker=True)
    for k, chunk in enumerate(chunks):
        envelope = meta if k == 0 else worker_pb2.EpisodeResult(worker_id=worker)
        out = assembler.add_kept(envelope, chunk)
    assert out is not None
    return out


def dealt(
    lengths: list[int], workers: int, slices: list[int], rng: np.random.Generator
) -> list[tuple[list[int], int]]:
    """Episodes 0..len-1 dealt round-robin to workers in slices, each worker's cut into results.

    Returns (indices, worker) per result, ascending within each, in a random arrival order.
    """
    owner = np.empty(len(lengths), dtype=np.int64)
    start, turn = 0, 0
    while start < len(lengths):
        size = slices[turn % len(slices)]
        owner[start : start + size] = turn % workers
        start, turn = start + size, turn + 1
    parts = []
    for worker in range(workers):
        mine = np.flatnonzero(owner == worker)
        if mine.size:
            cuts = np.sort(rng.choice(np.arange(1, mine.size + 1), size=min(3, mine.size)))
            for part in np.split(mine, np.unique(cuts[:-1])):
                if part.size:
                    parts.append((part.tolist(), worker + 1))
    return [parts[i] for i in rng.permutation(len(parts))]


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    workers=st.integers(1, 3),
    slices=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    extra=st.integers(0, 6),
    chunk_bytes=st.sampled_from([256, 600, 2000, 1 << 20]),
    seed=st.integers(0, 2**16),
)
def test_received_episodes_are_placed_as_concatenating_then_ordering_places_them(
    *,
    lengths: list[int],
    workers: int,
    slices: list[int],
    extra: int,
    chunk_bytes: int,
    seed: int,
) -> None:
    # Episodes of different lengths, dealt in slices (so results are blocks
    # of the answer, or interleave), arriving in any order, some cut into
    # chunks mid-row; the last ``extra`` are speculative, past the answer.
    rng = np.random.default_rng(seed)
    n = max(len(lengths) - extra, 1)
    results = [
        received(episodes([lengths[i] for i in part], part, worker), worker, chunk_bytes, k)
        for k, (part, worker) in enumerate(dealt(lengths, workers, slices, rng))
    ]
    want = first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), n)
    got = assemble_episodes(results, n)
    assert_identical(got, want)
    # Placed, not left to the general path (which would hide a misplacement that raises).
    placed = placed_episodes([r.arrays for r in results], n)
    assert placed is not None
    assert_identical(placed, want)
    assert got.episode_infos["episode_index"].tolist() == list(range(n))
    assert got.observations[:, 0].tolist() == [
        i * 100 + t for i in range(n) for t in range(lengths[i])
    ]


@settings(max_examples=40, deadline=None)
@given(
    pieces=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), min_size=1, max_size=30),
    chunk_bytes=st.sampled_from([300, 1 << 20]),
    seed=st.integers(0, 2**16),
)
def test_received_fragments_are_placed_as_concatenating_then_sorting_places_them(
    pieces: list[tuple[int, int]], chunk_bytes: int, seed: int
) -> None:
    # Pieces of streams 0..3 (each stream's episodes numbered in order, one
    # piece each), in results of random size and arrival order.
    rng = np.random.default_rng(seed)
    seen: dict[int, int] = {}
    rows = []
    for stream, length in pieces:
        rows.append((stream, seen.get(stream, 0), length))
        seen[stream] = seen.get(stream, 0) + 1
    order = rng.permutation(len(rows))
    results = []
    for k, part in enumerate(np.array_split(order, rng.integers(1, len(rows) + 1))):
        if not part.size:
            continue
        mine = [rows[i] for i in part]
        b = batch(
            [length for *_, length in mine],
            [episode for _, episode, _ in mine],
            stream=[stream for stream, *_ in mine],
            fragment_index=[0] * len(mine),
        )
        results.append(received(b, 1 + k % 2, chunk_bytes, k))
    want = sort_fragments(EpisodeBatch.concatenate(*(r.batch for r in results)))
    assert_identical(assemble_fragments(results), want)
    placed = placed_fragments([r.arrays for r in results])
    assert placed is not None
    assert_identical(placed, want)


def test_an_answer_owns_each_array_whether_results_are_blocks_or_interleave() -> None:
    # Results whose rows are blocks of the answer, and results that interleave.
    for parts in ([[0, 1, 2], [3, 4]], [[0, 2, 4], [1, 3]]):
        results = [
            received(episodes([3] * len(part), part, 1), 1, 1 << 20, k)
            for k, part in enumerate(parts)
        ]
        answer = assemble_episodes(results, 5)
        arrays = [getattr(answer, name) for name in _ARRAYS]
        arrays += [
            a
            for group in ("episode_infos", "agent_infos")
            for _, a in _leaves(getattr(answer, group), group)
        ]
        for array in arrays:
            # Its own buffer: writable, aligned and C-contiguous (torch.from_numpy shares it).
            assert array.flags.owndata and array.flags.writeable, parts
            assert array.flags.aligned and array.flags.c_contiguous, parts


class _Copies:
    """Stands for numpy in rlfleet.wire.placement, recording where its copies
    write; :meth:`gather` stands for its compiled gather."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int]] = []  # (address, bytes) of each copy's output
        self.calls: list[str] = []  # the copying calls, by name
        self.gathered: list[int] = []  # the address each gather wrote to

    def gather(self, dest: np.ndarray, *args: Any) -> bool:
        copied = _gather.gather(dest, *args)
        self.calls.append("gather")
        if copied:
            self.gathered.append(dest.__array_interface__["data"][0])
            self.writes.append((dest.__array_interface__["data"][0], dest.nbytes))
        return copied

    def __getattr__(self, name: str) -> Any:
        function = getattr(np, name)
        if name not in ("concatenate", "take"):
            return function

        def copy(*args: Any, **kwargs: Any) -> Any:
            got = function(*args, **kwargs)
            self.calls.append(name)
            self.writes.append((got.__array_interface__["data"][0], got.nbytes))
            return got

        return copy


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 5000, 700], ids=["views", "chunks", "small"])
def test_results_interleaved_in_long_runs_are_copied_once_into_the_answer(
    chunk_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A native worker's answer: results interleave in runs of a few episodes,
    # hundreds of steps. Each step array is one copy from the received
    # results into the answer (no scratch joined first), and the answer is
    # the general path's, bit for bit.
    rng = np.random.default_rng(7)
    lengths = rng.integers(60, 140, size=40).tolist()
    extra = 3  # speculative episodes past the answer
    n = len(lengths) - extra
    results = [
        received(episodes([lengths[i] for i in part], part, worker), worker, chunk_bytes, k)
        for k, (part, worker) in enumerate(dealt(lengths, 2, [3, 4], rng))
    ]
    want = first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), n)
    copies = _Copies()
    monkeypatch.setattr(placement, "np", copies)
    monkeypatch.setattr(placement, "gather", copies.gather)
    got = placed_episodes([r.arrays for r in results], n)
    monkeypatch.undo()
    assert got is not None
    assert_identical(got, want)
    steps = [got.observations, got.actions, got.rewards, got.step_types]
    steps += [leaf for _, leaf in _leaves(got.agent_infos, "agent_infos")]
    answer = {a.__array_interface__["data"][0]: a.nbytes for a in steps}
    # Every write of a step array's size lands in the answer, once per array.
    smallest = min(answer.values())
    written = [write for write in copies.writes if write[1] >= smallest]
    assert sorted(written) == sorted(answer.items())


@pytest.mark.parametrize("interleaved", [False, True], ids=["blocks", "runs"])
def test_each_field_is_one_gather_from_the_results_with_no_numpy_copy(
    interleaved: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One-chunk results, in blocks or interleaved in runs of a few episodes:
    # each array of the answer is one call into the compiled gather over
    # every result's array, with no numpy concatenate or take of them, whose
    # cost grows with each result's view (and no scratch copy for short runs).
    rng = np.random.default_rng(3)
    lengths = rng.integers(60, 140, size=24).tolist()
    slices = [2, 3] if interleaved else [len(lengths)]
    results = [
        received(episodes([lengths[i] for i in part], part, worker), worker, 1 << 20, k)
        for k, (part, worker) in enumerate(dealt(lengths, 2 if interleaved else 1, slices, rng))
    ]
    n = len(lengths) - 2
    want = first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), n)
    copies = _Copies()
    monkeypatch.setattr(placement, "np", copies)
    monkeypatch.setattr(placement, "gather", copies.gather, raising=False)
    got = placed_episodes([r.arrays for r in results], n)
    monkeypatch.undo()
    assert got is not None
    assert_identical(got, want)
    placed = [got.observations, got.actions, got.rewards, got.step_types, got.last_observations]
    placed += [leaf for _, leaf in _leaves(got.agent_infos, "agent_infos")]
    placed += [a for key, a in _leaves(got.episode_infos, "infos") if "index" not in key]
    assert {a.__array_interface__["data"][0] for a in placed} <= set(copies.gathered)
    # The arrays, then the episode indices and lengths joined to lay them out
    # (runs are found with a concatenate of the answer's run breaks, no array's).
    assert copies.calls.count("gather") == len(placed) + 2
    assert set(copies.calls) <= ({"gather", "concatenate"} if interleaved else {"gather"})


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 700], ids=["views", "small"])
def test_fragments_interleaved_in_long_runs_are_placed_as_sorting_places_them(
    chunk_bytes: int,
) -> None:
    # Two results of whole streams, alternating in the answer's order
    # (stream, episode, fragment): runs of two 300-step pieces.
    results = []
    for k, streams in enumerate(([0, 2], [1, 3])):
        rows = [(stream, episode) for stream in streams for episode in range(2)]
        b = batch(
            [300] * len(rows),
            [episode for _, episode in rows],
            stream=[stream for stream, _ in rows],
            fragment_index=[0] * len(rows),
        )
        results.append(received(b, 1 + k, chunk_bytes, k))
    want = sort_fragments(EpisodeBatch.concatenate(*(r.batch for r in results)))
    placed = placed_fragments([r.arrays for r in results])
    assert placed is not None
    assert_identical(placed, want)
    assert placed.episode_infos["stream"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def _line_events(call: Callable[[], object]) -> int:
    """Line events of ``call``: Python steps, a loop's counted once per iteration."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return local

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    call()  # once untraced: caches filled, as on every call but the first
    gc.collect()
    gc.disable()  # no collection (and no finalizer's steps) while counting
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(previous)
        gc.enable()
    return count


@pytest.mark.parametrize("native", [False, True], ids=["seeded", "native"])
def test_checking_a_result_takes_no_python_step_per_episode(native: bool) -> None:
    # A native worker's result of 400 episodes costs the checks the Python
    # steps one of 40 does: seeds, units, lengths and step types are array
    # operations over the episodes.
    def check(count: int) -> Callable[[], None]:
        indices = list(range(1, 2 * count, 2))
        index = np.asarray(indices, dtype=np.int64)
        units = UnitColumns(index, 1000 + index, 2000 + index)
        env_seeds = np.full(count, NO_ENV_SEED, np.int64) if native else units.env_seeds
        policy_seeds = np.full(count, NO_POLICY_SEED, np.int64) if native else units.policy_seeds
        base = episodes([1 + i % 5 for i in range(count)], indices, 1)
        step = np.concatenate([np.arange(n, dtype=np.float32) for n in base.lengths])[:, None]
        b = EpisodeBatch(
            env_spec=SPEC,
            episode_infos={
                **base.episode_infos,
                "agent_version": np.zeros(count, np.int64),
                "env_seed": env_seeds,
                "policy_seed": policy_seeds,
            },
            observations=step,  # the Counter's: the step, inside its space
            last_observations=base.lengths[:, None].astype(np.float32),
            actions=base.actions,
            rewards=base.rewards,
            env_infos={},
            agent_infos=base.agent_infos,
            step_types=base.step_types,
            lengths=base.lengths,
        )
        (chunk,) = encode_batch_chunks(b, include_env_spec=False)
        meta = worker_pb2.EpisodeResult(
            task_id=1, episode_indices=indices, lengths=b.lengths.tolist()
        )
        joined = ResultAssembler().join(meta, chunk)
        assert joined is not None
        decoded = decode_result(joined, SPEC)
        expect = ResultExpectation(
            SPEC, worker_id=1, agent_version=0, env_generation=0, units=units, native=native
        )
        check_result(decoded, expect)  # valid: the steps counted are those of a pass
        return lambda: check_result(decoded, expect)

    assert _line_events(check(400)) == _line_events(check(40))


def test_placing_an_answer_takes_a_few_python_steps_per_result_and_none_per_episode() -> None:
    def answer(results: int, per_result: int, *, blocks: bool) -> Callable[[], EpisodeBatch]:
        total = results * per_result
        owner = np.arange(total) // per_result if blocks else np.arange(total) % results
        made = [
            received(
                episodes([4] * per_result, np.flatnonzero(owner == k).tolist(), 1), 1, 1 << 20, k
            )
            for k in range(results)
        ]
        return lambda: assemble_episodes(made, total)

    for blocks in (True, False):
        # None per episode: 10 or 200 episodes a result, the same steps.
        many = _line_events(answer(4, 200, blocks=blocks))
        assert many == _line_events(answer(4, 10, blocks=blocks)), blocks
        # A few per result: about three for each of its ten arrays.
        extra = _line_events(answer(24, 20, blocks=blocks)) - _line_events(
            answer(4, 20, blocks=blocks)
        )
        assert extra <= 20 * 60, blocks


def test_a_result_past_the_answers_end_adds_no_python_step_per_field_for_each_held_one() -> None:
    # A STEPS answer ends before some results it received (the coordinator's
    # last ones): their rows' shapes are still checked, without a step per
    # result the answer holds for each of its fields.
    def answer(results: int, past: int) -> Callable[[], EpisodeBatch]:
        made = [
            received(episodes([4] * 20, list(range(20 * k, 20 * k + 20)), 1), 1, 1 << 20, k)
            for k in range(results + past)
        ]
        return lambda: assemble_episodes(made, 20 * results)

    def extra(past: int) -> int:
        return _line_events(answer(24, past)) - _line_events(answer(4, past))

    # Two steps per result (the held and the unheld worked out once).
    assert extra(1) - extra(0) <= 2 * 20


def test_a_result_whose_episodes_are_not_ascending_is_still_ordered_right() -> None:
    # Only ascending indices let a result's kept episodes be its first ones:
    # others take the general path, and the answer is the same.
    for parts, n in (([[2, 0], [1]], 3), ([[4, 0], [1, 2, 3]], 4), ([[1, 3], [2, 0]], 4)):
        results = [
            received(episodes([2] * len(part), part, 1), 1, 1 << 20, k)
            for k, part in enumerate(parts)
        ]
        want = first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), n)
        assert_identical(assemble_episodes(results, n), want)
        assert assemble_episodes(results, n).observations[:, 0].tolist() == [
            i * 100 + t for i in range(n) for t in range(2)
        ]


def test_results_whose_dicts_hold_other_keys_are_left_to_the_general_path() -> None:
    # The results' dicts are compared by their counts and each key of the
    # first: one key in place of another, one missing, one more (in an
    # empty map too) each leave the answer to the general path, which names
    # what differs; the same keys in another order are placed.
    made = [
        received(episodes([3, 2], [0, 1], 1), 1, 1 << 20, 0),
        received(episodes([4], [2], 2), 2, 1 << 20, 1),
    ]
    arrays = [result.arrays for result in made]
    assert all(isinstance(one, EpisodeBatch) for one in arrays)
    placed = placed_episodes(arrays, 3)
    assert placed is not None
    infos = arrays[1].episode_infos
    renamed = {("other" if key == "pair" else key): value for key, value in infos.items()}
    missing = {key: value for key, value in infos.items() if key != "pair"}
    more = {**infos, "more": infos["worker"]}
    for changed in (renamed, missing, more):
        other = dataclasses.replace(arrays[1], episode_infos=changed)
        assert placed_episodes([arrays[0], other], 3) is None
    filled = dataclasses.replace(arrays[1], env_infos={"hit": np.zeros(4, np.int64)})
    assert placed_episodes([arrays[0], filled], 3) is None
    reordered = dataclasses.replace(arrays[1], episode_infos=dict(reversed(list(infos.items()))))
    again = placed_episodes([arrays[0], reordered], 3)
    assert again is not None
    assert_identical(again, placed)


def test_results_whose_arrays_differ_in_dtype_of_one_size_are_placed_as_numpy_promotes() -> None:
    # float32 and int32 features (rows of one size, so only their dtypes
    # tell them apart): the answer's array is numpy's concatenation of them
    # (float64), bit for bit, not the int32 bytes copied as float32.
    made = [
        received(episodes([3, 2], [0, 1], 1), 1, 1 << 20, 0),
        received(episodes([4], [2], 2), 2, 1 << 20, 1),
    ]
    first, second = (result.arrays for result in made)
    assert isinstance(first, EpisodeBatch) and isinstance(second, EpisodeBatch)
    infos = second.agent_infos
    features = infos["features"].astype(np.int32)
    other = dataclasses.replace(second, agent_infos={**infos, "features": features})
    placed = placed_episodes([first, other], 3)
    assert placed is not None
    assert_identical(placed, first_episodes(EpisodeBatch.concatenate(first, other), 3))
    assert placed.agent_infos["features"].dtype == np.float64
    assert placed.agent_infos["features"][5:].tolist() == features.tolist()


def test_an_answers_episode_indices_are_made_not_placed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The results' episode indices are joined once, to check that they are
    # the answer's 0..n-1 once each; the answer's own are then made as
    # such, not placed from each result's view again.
    made = [
        received(episodes([3] * 5, list(range(5 * k, 5 * k + 5)), k + 1), k + 1, 1 << 20, k)
        for k in range(4)
    ]
    indices = {id(result.arrays.episode_infos["episode_index"]) for result in made}
    joined = 0
    concatenate = np.concatenate

    def counted(arrays: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        nonlocal joined
        arrays = list(arrays)
        joined += sum(id(array) in indices for array in arrays)
        return concatenate(arrays, *args, **kwargs)

    def gathered(dest: np.ndarray, arrays: Any, *args: Any) -> bool:
        nonlocal joined
        joined += sum(id(array) in indices for array in arrays)
        return _gather.gather(dest, arrays, *args)

    monkeypatch.setattr(placement.np, "concatenate", counted)
    monkeypatch.setattr(placement, "gather", gathered)
    got = assemble_episodes(made, 18)
    monkeypatch.undo()
    assert joined == len(made)
    index = got.episode_infos["episode_index"]
    assert index.dtype == np.int64 and index.tolist() == list(range(18))
    assert index.flags.c_contiguous and index.flags.writeable
    assert_identical(got, first_episodes(EpisodeBatch.concatenate(*(r.batch for r in made)), 18))
