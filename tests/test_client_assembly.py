"""A learner's answer from its results (rlfleet.wire.results), without processes.

Batches are built by hand from rlfleet/Counter-v0's spaces, whose
observations count steps, so expected orders can be read off the data.
"""

from __future__ import annotations

import itertools
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.client._learner_messages import EmptyResponse, parse_response
from rlfleet.client._responses import AnswerHeader, ResponseReader
from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.envs import EnvConfig
from rlfleet.errors import ProtocolError, ResourceExhaustedError, WireFormatError
from rlfleet.protocol.learner_calls import CallHeader
from rlfleet.v1 import learner_pb2, worker_pb2
from rlfleet.wire import ChunkAssembler, encode_batch_chunks
from rlfleet.wire.results import (
    DecodedResult,
    ResultAssembler,
    ResultHeader,
    assemble_episodes,
    assemble_fragments,
)
from tests.test_result_layout import SPEC as VIEWED
from tests.test_result_layout import batch_with_infos

SPEC: EnvSpec = EnvConfig("rlfleet/Counter-v0", imports=("rlfleet.envs.testing",)).env_spec()


def batch(lengths: list[int], indices: list[int], **infos: list[int]) -> EpisodeBatch:
    """Episodes whose observations are (episode index * 100 + step), one per step."""
    lengths_array = np.asarray(lengths, dtype=np.int64)
    obs = np.concatenate(
        [
            index * 100 + np.arange(n, dtype=np.float32)
            for index, n in zip(indices, lengths, strict=True)
        ]
    )[:, None]
    step_types = np.full(len(obs), StepType.MID, dtype=np.uint8)
    ends = np.cumsum(lengths_array) - 1
    step_types[ends] = StepType.TERMINAL
    step_types[ends - lengths_array + 1] = StepType.FIRST
    step_types[ends[lengths_array == 1]] = StepType.TERMINAL
    episode_infos = {
        "episode_index": np.asarray(indices, dtype=np.int64),
        **{key: np.asarray(value, dtype=np.int64) for key, value in infos.items()},
    }
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos=episode_infos,
        observations=obs,
        last_observations=obs[ends] + 1,
        actions=np.zeros(len(obs), dtype=np.int64),
        rewards=np.arange(len(obs), dtype=np.float64),
        env_infos={},
        agent_infos={"log_prob": -np.arange(len(obs), dtype=np.float32)},
        step_types=step_types,
        lengths=lengths_array,
    )


def result(b: EpisodeBatch, worker: int = 1) -> DecodedResult:
    meta = worker_pb2.EpisodeResult(
        episode_indices=b.episode_infos["episode_index"].tolist(),
        lengths=b.lengths.tolist(),
        worker_id=worker,
    )
    return DecodedResult(ResultHeader.of(meta), b)


def test_step_types_keep_the_wire_dtype() -> None:
    b = batch([2], [0])
    assert b.step_types.dtype == np.uint8  # as the wire carries them
    answer = assemble_episodes([result(b)], 1)
    assert answer.step_types.dtype == np.uint8
    assert answer.step_types.tolist() == [StepType.FIRST, StepType.TERMINAL]


def test_assemble_episodes_orders_by_index_and_drops_speculative_ones() -> None:
    # Two workers interleaved; episode 4 ran past the answer (num_episodes=4).
    results = [result(batch([3, 1], [1, 3]), worker=1), result(batch([2, 2, 5], [0, 2, 4]), 2)]
    answer = assemble_episodes(results, 4)
    assert answer.episode_infos["episode_index"].tolist() == [0, 1, 2, 3]
    assert answer.lengths.tolist() == [2, 3, 2, 1]
    assert answer.observations[:, 0].tolist() == [0, 1, 100, 101, 102, 200, 201, 300]


@pytest.mark.parametrize(
    ("indices", "message"),
    [([0, 2], r"missing \[1\], duplicated \[\]"), ([0, 1, 1], r"missing \[\], duplicated \[1\]")],
)
def test_assemble_episodes_refuses_gaps_and_duplicates(indices: list[int], message: str) -> None:
    results = [result(batch([1] * len(indices), indices))]
    with pytest.raises(ProtocolError, match=message):
        assemble_episodes(results, 2)


def test_assemble_fragments_orders_by_stream_episode_and_fragment() -> None:
    # Worker 1 holds stream 0, worker 2 stream 1; each sent two windows, and
    # worker 2's arrived first. Episode 0 of stream 0 spans both windows.
    w1_round0 = batch([4], [0], stream=[0], fragment_index=[0])
    w1_round1 = batch([2, 2], [0, 1], stream=[0, 0], fragment_index=[1, 0])
    w2_round0 = batch([1, 3], [0, 1], stream=[1, 1], fragment_index=[0, 0])
    w2_round1 = batch([4], [1], stream=[1], fragment_index=[1])
    results = [
        result(w2_round0, 2),
        result(w2_round1, 2),
        result(w1_round0, 1),
        result(w1_round1, 1),
    ]
    answer = assemble_fragments(results)
    infos = answer.episode_infos
    assert infos["stream"].tolist() == [0, 0, 0, 1, 1, 1]
    assert infos["episode_index"].tolist() == [0, 0, 1, 0, 1, 1]
    assert infos["fragment_index"].tolist() == [0, 1, 0, 0, 0, 1]
    assert answer.lengths.tolist() == [4, 2, 2, 1, 3, 4]
    # Steps travel with their pieces: episode 1 of stream 1 is 3 + 4 steps long.
    assert answer.observations[-7:, 0].tolist() == [100, 101, 102, 100, 101, 102, 103]
    assert answer.step_types.dtype == np.uint8


def test_result_assembler_joins_chunks_of_interleaved_workers() -> None:
    first, second = batch([30, 40], [0, 1]), batch([25], [2])
    assembler = ResultAssembler(SPEC, per_worker=True)
    chunks_a = encode_batch_chunks(first, 400, batch_id=0, include_env_spec=False)
    chunks_b = encode_batch_chunks(second, 400, batch_id=0, include_env_spec=False)
    assert len(chunks_a) > 2 and len(chunks_b) > 1  # several chunks each: a real test
    meta_a = worker_pb2.EpisodeResult(
        task_id=1, episode_indices=[0, 1], lengths=[30, 40], worker_id=7
    )
    meta_b = worker_pb2.EpisodeResult(task_id=2, episode_indices=[2], lengths=[25], worker_id=9)
    done = []
    # The coordinator sends every envelope with the worker id; chunk 0 has the metadata.
    for i in range(max(len(chunks_a), len(chunks_b))):
        for chunks, meta in ((chunks_a, meta_a), (chunks_b, meta_b)):
            if i < len(chunks):
                envelope = meta if i == 0 else worker_pb2.EpisodeResult(worker_id=meta.worker_id)
                out = assembler.add(envelope, chunks[i])
                if out is not None:
                    done.append(out)
    assert [r.header.task_id for r in done] == [2, 1]
    assert np.array_equal(done[1].batch.observations, first.observations)
    assert np.array_equal(done[0].batch.observations, second.observations)


def test_result_assembler_checks_metadata_against_the_batch() -> None:
    b = batch([3], [0])
    (chunk,) = encode_batch_chunks(b, include_env_spec=False)
    meta = worker_pb2.EpisodeResult(episode_indices=[0], lengths=[4], worker_id=1)
    with pytest.raises(
        ProtocolError, match=r"metadata lengths \[4\] disagree with the batch's \[3\]"
    ):
        ResultAssembler(SPEC, per_worker=True).add(meta, chunk)


def test_result_assembler_needs_the_header_and_a_chunk() -> None:
    (chunk,) = encode_batch_chunks(batch([3], [0]), include_env_spec=False)
    meta = worker_pb2.EpisodeResult(episode_indices=[0], lengths=[3], worker_id=1)
    with pytest.raises(ProtocolError, match="before the env spec"):
        ResultAssembler(per_worker=True).add(meta, chunk)
    with pytest.raises(ProtocolError, match="has no chunk"):
        ResultAssembler(SPEC, per_worker=True).add(meta, None)


def test_result_assembler_refuses_chunks_out_of_order() -> None:
    chunks = encode_batch_chunks(batch([30, 40], [0, 1]), 400, include_env_spec=False)
    meta = worker_pb2.EpisodeResult(episode_indices=[0, 1], lengths=[30, 40], worker_id=1)
    assembler = ResultAssembler(SPEC, per_worker=True)
    assert assembler.add(meta, chunks[0]) is None
    with pytest.raises(WireFormatError, match="chunk 1 of batch 0 missing"):
        assembler.add(worker_pb2.EpisodeResult(worker_id=1), chunks[2])


def test_a_one_chunk_result_joins_at_once_unless_its_worker_is_mid_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks = encode_batch_chunks(batch([30, 40], [0, 1]), 400, batch_id=1, include_env_spec=False)
    (whole,) = encode_batch_chunks(batch([3], [2]), batch_id=2, include_env_spec=False)
    meta = worker_pb2.EpisodeResult(episode_indices=[0, 1], lengths=[30, 40], worker_id=1)
    single = ResultHeader(5, 1, (2,), (3,), 0, 0)
    assembler = ResultAssembler(SPEC, per_worker=True)
    assert assembler.add(meta, chunks[0]) is None
    # Another worker's result of one chunk passes while worker 1's is in its
    # chunks, with no chunk assembler: its one chunk is the payload.
    with monkeypatch.context() as patched:
        patched.setattr(ChunkAssembler, "_add", None)
        joined = assembler.join(ResultHeader(6, 2, (2,), (3,), 0, 0), whole, 77)
    assert joined is not None and joined.chunks == (whole,) and joined.message_sizes == (77,)
    assert joined.payload is whole.data and assembler.in_progress
    # Worker 1's own is refused: it cuts its result of several chunks short.
    with pytest.raises(WireFormatError, match="batch 1 is incomplete"):
        assembler.join(single, whole)
    assert not assembler.in_progress
    # Past the refusal, the worker's next result of one chunk joins again.
    assert assembler.join(single, whole) is not None
    limited = ResultAssembler(SPEC, per_worker=True, max_total_bytes=len(whole.data) - 1)
    with pytest.raises(ResourceExhaustedError, match="over the limit"):
        limited.join(single, whole)


def _general_path(results: list[DecodedResult], num_episodes: int) -> EpisodeBatch:
    """What the answer was before the one-copy path: concatenate, then order."""
    from rlfleet.core.episode_order import first_episodes

    return first_episodes(EpisodeBatch.concatenate(*(r.batch for r in results)), num_episodes)


def _assert_same_batch(got: EpisodeBatch, want: EpisodeBatch) -> None:
    for name in ("observations", "last_observations", "actions", "rewards", "step_types"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert np.array_equal(got.lengths, want.lengths)
    for infos in ("episode_infos", "env_infos", "agent_infos"):
        a, b = getattr(got, infos), getattr(want, infos)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 6), min_size=1, max_size=30),
    workers=st.integers(1, 4),
    extra=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_assemble_episodes_in_one_copy_equals_concatenating_then_ordering(
    lengths: list[int], workers: int, extra: int, seed: int
) -> None:
    # Episodes 0..n+extra-1 dealt to workers in slices, each worker's
    # results ascending, results arriving in any order; n are asked for.
    rng = np.random.default_rng(seed)
    n = max(len(lengths) - extra, 1)
    owner = rng.integers(0, workers, size=len(lengths))
    results = []
    for worker in range(workers):
        mine = np.flatnonzero(owner == worker)
        for part in np.array_split(mine, rng.integers(1, 4)):
            if part.size:
                b = batch([lengths[i] for i in part], part.tolist())
                results.append(result(b, worker=worker + 1))
    order = rng.permutation(len(results))
    results = [results[i] for i in order]
    _assert_same_batch(assemble_episodes(results, n), _general_path(results, n))


def test_results_placed_as_blocks_and_interleaved_ones_make_the_same_answer() -> None:
    # Episodes 0-3 in one result (a block of the answer), 4-7 dealt
    # alternately to two results (interleaved), 8 alone, and a speculative
    # 9 past the answer; arriving out of order.
    lengths = {0: 3, 1: 1, 2: 5, 3: 2, 4: 4, 5: 1, 6: 2, 7: 3, 8: 6, 9: 2}
    parts = [[4, 6], [8, 9], [0, 1, 2, 3], [5, 7]]
    results = [
        result(batch([lengths[i] for i in part], part), worker=1 + k % 2)
        for k, part in enumerate(parts)
    ]
    answer = assemble_episodes(results, 9)
    _assert_same_batch(answer, _general_path(results, 9))
    assert answer.episode_infos["episode_index"].tolist() == list(range(9))
    assert answer.observations[:, 0].tolist() == [
        i * 100 + t for i in range(9) for t in range(lengths[i])
    ]


def test_assemble_episodes_copies_step_data_once() -> None:
    # 40 results (as two workers send them), result j holding episodes j,
    # j + 40, j + 80, ...: the answer interleaves every result.
    results = [
        result(batch([50] * 100, list(range(j, 4000, 40))), worker=1 + j % 2) for j in range(40)
    ]
    step_bytes = sum(
        a.nbytes
        for r in results
        for a in (r.batch.observations, r.batch.actions, r.batch.rewards, r.batch.step_types)
    )
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        answer = assemble_episodes(results, 4000)
        _, one_copy_peak = tracemalloc.get_traced_memory()
        del answer
        tracemalloc.reset_peak()
        general = _general_path(results, 4000)
        _, general_peak = tracemalloc.get_traced_memory()
        del general
    finally:
        tracemalloc.stop()
    # The general path holds the concatenation and the ordered copy at once.
    assert general_peak - one_copy_peak > 0.9 * step_bytes


def _fragment_results(
    streams: int, lengths: list[int], windows: int, rng: np.random.Generator
) -> list[DecodedResult]:
    """Each stream's episodes of ``lengths`` steps, cut into ``windows`` windows, one result
    per window and worker (worker w holds streams w, w + 2, ...), in a random arrival order."""
    pieces: dict[tuple[int, int], list[tuple[int, int, int, int]]] = {}
    for stream in range(streams):
        total = sum(lengths)
        cuts = np.sort(rng.choice(np.arange(1, total), size=windows - 1, replace=False))
        bounds = [0, *cuts.tolist(), total]
        starts = np.cumsum([0, *lengths])
        for window, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            for episode, n in enumerate(lengths):
                a, b = max(lo, int(starts[episode])), min(hi, int(starts[episode]) + n)
                if a < b:
                    fragment = sum(
                        1
                        for w in bounds[1 : window + 1]
                        if starts[episode] < w < starts[episode] + n
                    )
                    pieces.setdefault((window, stream % 2), []).append(
                        (stream, episode, fragment, b - a)
                    )
    results = []
    for (_, worker), mine in pieces.items():
        b = batch(
            [n for *_, n in mine],
            [episode for _, episode, _, _ in mine],
            stream=[stream for stream, *_ in mine],
            fragment_index=[fragment for _, _, fragment, _ in mine],
        )
        results.append(result(b, worker=worker + 1))
    return [results[i] for i in rng.permutation(len(results))]


def _sorted_fragments(results: list[DecodedResult]) -> EpisodeBatch:
    """What the answer was before the one-copy path: concatenate, then sort."""
    from rlfleet.core.episode_order import sort_fragments

    return sort_fragments(EpisodeBatch.concatenate(*(r.batch for r in results)))


@settings(max_examples=60, deadline=None)
@given(
    streams=st.integers(1, 5),
    lengths=st.lists(st.integers(2, 6), min_size=1, max_size=6),
    windows=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
def test_assemble_fragments_in_one_copy_equals_concatenating_then_sorting(
    streams: int, lengths: list[int], windows: int, seed: int
) -> None:
    windows = min(windows, sum(lengths))
    results = _fragment_results(streams, lengths, windows, np.random.default_rng(seed))
    _assert_same_batch(assemble_fragments(results), _sorted_fragments(results))


def test_assemble_fragments_copies_step_data_once() -> None:
    # 16 streams of 25 episodes of 40 steps in 4 windows, as two workers send them.
    results = _fragment_results(16, [40] * 25, 4, np.random.default_rng(0))
    step_bytes = sum(
        a.nbytes
        for r in results
        for a in (r.batch.observations, r.batch.actions, r.batch.rewards, r.batch.step_types)
    )
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        answer = assemble_fragments(results)
        _, one_copy_peak = tracemalloc.get_traced_memory()
        del answer
        tracemalloc.reset_peak()
        general = _sorted_fragments(results)
        _, general_peak = tracemalloc.get_traced_memory()
        del general
    finally:
        tracemalloc.stop()
    # Concatenating then sorting holds both copies at once.
    assert general_peak - one_copy_peak > 0.9 * step_bytes


def test_responses_are_read_into_rlfleet_types_and_an_empty_one_is_named() -> None:
    header = learner_pb2.SampleResponse(
        header=learner_pb2.SampleHeader(request_id=3, agent_version=2, coordinator_id="c")
    )
    part = parse_response(header.SerializeToString())
    assert part == CallHeader(3, 2, 0, "c", None)
    reader = ResponseReader("Sample on coordinator x", lambda data: SPEC)
    assert reader.read(part) == AnswerHeader(2, None, "c")
    empty = parse_response(b"")  # not None: gRPC takes that for a failed deserializer
    assert isinstance(empty, EmptyResponse)
    with pytest.raises(ProtocolError, match="Sample on coordinator x: an empty SampleResponse"):
        reader.read(empty)


def test_a_samplers_one_chunk_result_goes_to_the_views_with_no_join_or_is_refused_as_joined(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sampler's reader gives a one-chunk result to its worker's views as its
    fields (no join, no JoinedResult), the same result the join and decode
    give; one the views leave takes the general path, with its text, and one
    that cuts its worker's result of several chunks short is refused as the
    join refuses it."""
    (first,) = encode_batch_chunks(batch_with_infos([3, 2]), batch_id=1, include_env_spec=False)
    (second,) = encode_batch_chunks(batch_with_infos([4, 1], 2), batch_id=2, include_env_spec=False)
    header = ResultHeader(2, 7, (2, 3), (4, 1), 0, 0)
    expected = ResultAssembler(VIEWED).add(header, second)
    # Lengths the bytes do not hold: the views leave it, the general path refuses it.
    wrong = ResultHeader(3, 7, (2, 3), (3, 2), 0, 0)
    with pytest.raises(ProtocolError) as general:
        ResultAssembler(VIEWED).add(wrong, second)
    joins: list[ResultHeader] = []
    join = ResultAssembler.join

    def counting(self: ResultAssembler, meta: ResultHeader, *args: object, **kw: object) -> object:
        joins.append(meta)
        return join(self, meta, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(ResultAssembler, "join", counting)
    reader = ResponseReader("Sample", lambda data: VIEWED, keep_pieces=True)
    reader.read(CallHeader(3, 2, 0, "c", b"spec"))
    learned = reader.read_result(ResultHeader(1, 7, (0, 1), (3, 2), 0, 0), first)
    viewed = reader.read_result(header, second)
    assert not joins and (reader.layouts.decoded, reader.layouts.viewed) == (1, 1)
    assert isinstance(learned, DecodedResult) and isinstance(viewed, DecodedResult)
    assert viewed.chunks == (second,) and viewed.message_sizes == (len(second.data),)
    assert expected is not None and viewed.header == expected.header
    for name in ("observations", "actions", "rewards", "step_types", "lengths"):
        mine, theirs = getattr(viewed.batch, name), getattr(expected.batch, name)
        assert mine.dtype == theirs.dtype and mine.tobytes() == theirs.tobytes(), name
    with pytest.raises(ProtocolError) as refused:
        reader.read_result(wrong, second)
    assert str(refused.value) == str(general.value) and not joins
    # Mid-result of several chunks, a one-chunk result of the worker takes the join.
    chunks = encode_batch_chunks(
        batch_with_infos([30, 40], 4), 400, batch_id=3, include_env_spec=False
    )
    assert reader.read_result(ResultHeader(4, 7, (4, 5), (30, 40), 0, 0), chunks[0]) is None
    with pytest.raises(WireFormatError, match="batch 3 is incomplete"):
        reader.read_result(header, second)
    assert len(joins) == 2
