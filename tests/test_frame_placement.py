"""A learner's answer placed straight from its viewed results' frames."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.learner_path import capturing, replayed
from rlfleet.client import Fleet
from rlfleet.client import _result_route as result_route
from rlfleet.client._responses import AnswerMemory
from rlfleet.core import EpisodeBatch
from rlfleet.core.episode_order import first_episodes
from rlfleet.errors import ProtocolError
from rlfleet.wire import encode_batch_chunks, frame_placement
from rlfleet.wire import results as results_module
from rlfleet.wire.result_views import ResultLayoutViews, ViewedResult
from rlfleet.wire.results import (
    DecodedResult,
    Result,
    ResultAssembler,
    ResultHeader,
    assemble_episodes,
)
from tests._coordinator_fakes import assert_same_batch
from tests.test_result_layout import SPEC, TERM, F, M
from tests.test_wire_placement import assert_identical, dealt


def episodes(lengths: Sequence[int], indices: Sequence[int], *, infos: bool = True) -> EpisodeBatch:
    """Episodes ``indices`` (ascending) whose values tell them apart: observation
    ``(index, step)``, infos of several dtypes and shapes (none with ``infos`` False)."""
    total, count = sum(lengths), len(lengths)
    index = np.asarray(indices, np.int64)
    step_types = np.full(total, M, np.uint8)
    ends = np.cumsum(lengths) - 1
    step_types[ends - np.asarray(lengths) + 1] = F
    step_types[ends] = TERM
    of_step = np.repeat(index, lengths)
    step = np.arange(total) - np.repeat(ends - np.asarray(lengths) + 1, lengths)
    observations = np.stack([of_step / 1000, step / 1000], axis=1).astype(np.float32)
    env_infos: dict[str, Any] = {}
    agent_infos: dict[str, Any] = {}
    if infos:
        env_infos = {"hit": step % 2 == 0, "deep": {"x": np.stack([of_step, step, -step], 1)}}
        agent_infos = {"logp": of_step * 0.5 + step}
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={
            "agent_version": np.zeros(count, np.int64),
            "env_seed": index + 100,
            "policy_seed": index + 200,
            "episode_index": index,
            "worker": np.full(count, 7, np.int64),
            "pair": np.stack([index, -index], axis=1).astype(np.int32),
        },
        observations=observations,
        last_observations=np.stack([index / 1000, index / 1000], axis=1).astype(np.float32),
        actions=(of_step + step) % 3,
        rewards=(of_step * 10 + step).astype(np.float32),
        env_infos=env_infos,
        agent_infos=agent_infos,
        step_types=step_types,
        lengths=np.asarray(lengths, np.int64),
    )


def frame_of(views: ResultLayoutViews, batch: EpisodeBatch, worker: int) -> Result:
    """``batch`` as a learner's results connection gives it: one chunk, a
    read-only view of the frame's buffer, decoded by the sampler's views."""
    (chunk,) = encode_batch_chunks(batch, 1 << 24, batch_id=1, include_env_spec=False)
    chunk = dataclasses.replace(chunk, data=memoryview(bytearray(chunk.data)).toreadonly())
    header = ResultHeader(
        task_id=1,
        worker_id=worker,
        episode_indices=tuple(batch.episode_infos["episode_index"].tolist()),
        lengths=tuple(batch.lengths.tolist()),
        agent_version=0,
        env_generation=0,
    )
    joined = ResultAssembler(per_worker=True).join(header, chunk, keep_pieces=True)
    assert joined is not None
    return views.decode(joined, SPEC)


def learned(workers: int, *, infos: bool = True) -> ResultLayoutViews:
    """A sampler's views that know each worker's layout (its first result decoded)."""
    views = ResultLayoutViews()
    for worker in range(1, workers + 1):
        frame_of(views, episodes([2], [0], infos=infos), worker)
    return views


def want(results: Sequence[Result], n: int) -> EpisodeBatch:
    """The answer as the general path makes it, from the results' batches."""
    return first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), n)


def placed_from_frames(results: Sequence[Result], n: int) -> EpisodeBatch:
    """The answer, checked to come from the frames with no result's views made."""
    placed = frame_placement.placed_frame_episodes(results, n)
    assert placed is not None
    assert all(isinstance(r, ViewedResult) and "batch" not in r.__dict__ for r in results)
    return placed


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=40),
    workers=st.integers(1, 3),
    slices=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    extra=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_viewed_results_are_placed_from_their_frames_as_from_their_batches(
    *, lengths: list[int], workers: int, slices: list[int], extra: int, seed: int
) -> None:
    # Episodes dealt to workers in slices (results that are blocks of the
    # answer, or interleave), in any order, the last ``extra`` past the answer.
    rng = np.random.default_rng(seed)
    n = max(len(lengths) - extra, 1)
    views = learned(workers)
    results = [
        frame_of(views, episodes([lengths[i] for i in part], part), worker)
        for part, worker in dealt(lengths, workers, slices, rng)
    ]
    got = placed_from_frames(results, n)
    assert_identical(got, want(results, n))
    assert_identical(assemble_episodes(results, n), got)
    assert got.observations[:, 0].tolist() == [
        np.float32(i / 1000) for i in range(n) for _ in range(lengths[i])
    ]
    assert all(array.flags.writeable for array in (got.observations, got.rewards, got.actions))


def test_results_of_another_shape_or_not_viewed_are_placed_from_their_batches() -> None:
    views = learned(1)
    bare = learned(1, infos=False)
    viewed = [frame_of(views, episodes([3, 2], [0, 1]), 1)]
    mixed = [*viewed, frame_of(bare, episodes([4], [2], infos=False), 1)]  # no infos
    with pytest.raises(ValueError):  # the general path's own refusal
        EpisodeBatch.concatenate(*(r.batch for r in mixed))
    assert frame_placement.placed_frame_episodes(mixed, 3) is None
    assert frame_placement.placed_frame_episodes([], 0) is None
    # A result decoded the general way (its worker's first) takes the batches' path.
    fresh = ResultLayoutViews()
    first = frame_of(fresh, episodes([4], [2]), 1)
    assert type(first) is DecodedResult
    together = [*viewed, first]
    assert frame_placement.placed_frame_episodes(together, 3) is None
    assert_identical(assemble_episodes(together, 3), want(together, 3))


def test_a_result_given_another_batch_is_placed_from_that_batch() -> None:
    views = learned(1)
    results = [
        frame_of(views, episodes([3, 2], [0, 1]), 1),
        frame_of(views, episodes([1, 4], [2, 3]), 1),
    ]
    # Renumbered (as shards renumber their coordinators' episodes): the
    # frames' indices would make an answer too, in the other order.
    results = [
        result.with_episode_infos(episode_index=np.array(indices))
        for result, indices in zip(results, ([2, 3], [0, 1]), strict=True)
    ]
    assert frame_placement.placed_frame_episodes(results, 4) is None
    got = assemble_episodes(results, 4)
    assert_identical(got, want(results, 4))
    assert got.lengths.tolist() == [1, 4, 3, 2]


def test_an_answer_whose_episodes_do_not_make_it_is_refused_as_from_the_batches() -> None:
    views = learned(2)
    results = [
        frame_of(views, episodes([3, 2], [0, 1]), 1),
        frame_of(views, episodes([1, 4], [1, 3]), 2),  # 1 twice, 2 missing
    ]
    assert frame_placement.placed_frame_episodes(results, 4) is None
    with pytest.raises(ProtocolError) as info:
        assemble_episodes(results, 4)
    with pytest.raises(ProtocolError) as general:
        first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), 4)
    assert str(info.value) == str(general.value)


def test_an_answer_of_viewed_results_takes_no_view_of_a_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views = learned(2)
    results = [
        frame_of(views, episodes([3, 2], [0, 2]), 1),
        frame_of(views, episodes([1, 4, 2], [1, 3, 4]), 2),
    ]
    expected = want(results, 5)
    results = [
        frame_of(views, episodes([3, 2], [0, 2]), 1),
        frame_of(views, episodes([1, 4, 2], [1, 3, 4]), 2),
    ]

    def batches(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("placed from the results' batches")

    monkeypatch.setattr(results_module, "placed_episodes", batches)
    assert_identical(assemble_episodes(results, 5), expected)
    assert not any("batch" in r.__dict__ for r in results)
    # Its views, when asked for, are its batch's, read-only views of its frame.
    batch = results[0].batch
    assert_identical(batch, episodes([3, 2], [0, 2]))
    assert not batch.observations.flags.writeable


def test_a_samplers_answers_are_read_with_no_object_per_result_message_and_placed_from_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: list[dict[str, Any]] = []
    with capturing(answers), Fleet.local(workers=2, envs_per_worker=2, seed=5) as sampler:
        expected = [sampler.obtain_episodes(6) for _ in range(3)]
    parsed: list[object] = []
    placed: list[EpisodeBatch | None] = []
    parse, place = result_route.parse_result_frame, frame_placement.placed_frame_episodes

    def parsing(data: Any) -> Any:
        parsed.append(data)
        return parse(data)

    def placing(*args: Any) -> EpisodeBatch | None:
        placed.append(place(*args))
        return placed[-1]

    monkeypatch.setattr(result_route, "parse_result_frame", parsing)
    monkeypatch.setattr(results_module, "placed_frame_episodes", placing)
    memory = AnswerMemory()
    for _ in range(2):  # the second time from the layouts the first learned
        for (_, batch), want in zip(replayed(answers, memory), expected, strict=True):
            assert_same_batch(batch, want)
    # Only the end markers take the general reader's objects; the results are tuples.
    assert len(parsed) == 2 * len(answers) < sum(answer["results"] for answer in answers) * 2
    assert all(batch is not None for batch in placed[len(answers) :])


def test_an_answer_placed_from_frames_lets_go_of_them_with_no_garbage_collection() -> None:
    # A learner's next answer reads into the receive buffers this one's frames
    # view once nothing views them: placing must leave no reference cycle that
    # holds the frames until the collector runs (rlfleet.transport.receive_buffers).
    views = learned(2)
    results = [
        frame_of(views, episodes([3, 2], [0, 2]), 1),
        frame_of(views, episodes([1, 4, 2], [1, 3, 4]), 2),
    ]
    assert all(isinstance(r, ViewedResult) for r in results)
    buffers = [cast(bytearray, cast(ViewedResult, r).frame[0].obj) for r in results]
    collecting = gc.isenabled()
    gc.disable()
    try:
        placed = placed_from_frames(results, 5)
        del results
        for buffer in buffers:
            buffer.append(0)  # BufferError while a view of it is alive
            buffer.pop()
        assert placed.observations[:, 0].tolist() == [
            np.float32(i / 1000) for i, n in enumerate([3, 1, 2, 4, 2]) for _ in range(n)
        ]
    finally:
        if collecting:
            gc.enable()
