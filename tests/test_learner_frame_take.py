"""A learner's one-chunk results taken in the result reader's one call.

On the results connection, a frame whose one-chunk result its worker's kept
plan views (uint8 step types) is read, checked and made into its
:class:`~rlfleet.wire.result_views.ViewedResult` in one call into the
compiled reader (``read_frame_made`` with the answer's context), with no
Python call between the frame and the result; every other frame takes the
Python path as before. Both are held to the same answers here, spoiled
frames included (run under ASan and UBSan too).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlfleet.client._learner_messages import ResponsePart
from rlfleet.client._responses import ResponseReader, collect_answer
from rlfleet.coordinator.learner_messages import results_end
from rlfleet.protocol.learner_calls import CallHeader
from rlfleet.protocol.modes import Footer, Mode
from rlfleet.v1 import batch_pb2, learner_pb2, worker_pb2
from rlfleet.wire import encode_batch_chunks
from rlfleet.wire.chunks import Chunk
from rlfleet.wire.result_message import read_frame_made
from rlfleet.wire.result_views import ViewedResult
from rlfleet.wire.results import ResultHeader
from tests.test_learner_results import _frames_sent
from tests.test_result_layout import SPEC as VIEWED
from tests.test_result_layout import batch_with_infos
from tests.test_result_message import spoiled

_FIELDS = ("observations", "actions", "rewards", "step_types", "lengths")


def _result_frame(
    lengths: list[int], *, number: int = 2, worker: int = 7, call: int = 1, seed: int = 0
) -> bytes:
    """A results-connection frame of call ``call``: a one-chunk result of a batch of
    ``lengths`` from worker ``worker``, task and batch ``number``."""
    (chunk,) = encode_batch_chunks(
        batch_with_infos(lengths, seed), batch_id=number, include_env_spec=False
    )
    first = 10 * number
    result = worker_pb2.EpisodeResult(
        task_id=number,
        episode_indices=range(first, first + len(lengths)),
        lengths=lengths,
        agent_version=1,
        env_generation=1,
        worker_id=worker,
        chunk=batch_pb2.BatchChunk(
            batch_id=chunk.batch_id,
            index=chunk.index,
            count=chunk.count,
            total_bytes=chunk.total_bytes,
            kind=batch_pb2.PAYLOAD_KIND_EPISODE_BATCH,
            data=bytes(chunk.data),
        ),
    )
    return learner_pb2.SampleResponse(result=result, result_call=call).SerializeToString()


def _reader(*learned: bytes) -> ResponseReader:
    """A sampler's reader of an answer whose header came, its workers' layouts
    (and plans) learned from ``learned`` frames read by the Python path."""
    reader = ResponseReader("Sample", lambda data: VIEWED, keep_pieces=True)
    reader.read(CallHeader(3, 2, 0, "c", b"spec"))
    for data in learned:
        made = read_frame_made(memoryview(bytearray(data)), ResultHeader, Chunk)
        assert isinstance(made, tuple)
        reader.read_result(made[1], made[2])
    return reader


def _outcome(read: Callable[[], Any]) -> tuple[str, Any]:
    """What ``read`` returns, or the type and text of what it raises."""
    try:
        return "result", read()
    except Exception as exc:  # compared between the two paths
        return "raised", (type(exc), str(exc))


def _python_path(reader: ResponseReader, data: bytearray) -> Any:
    """The frame read as the connection read it before: header and chunk, then the reader."""
    made = read_frame_made(memoryview(data), ResultHeader, Chunk)
    if not isinstance(made, tuple):
        return made
    return made[0], reader.read_result(made[1], made[2])


def _one_call(reader: ResponseReader, data: bytearray, call: int = 1) -> Any:
    """The frame read in the reader's one call, the Python path taking what it leaves."""
    made = read_frame_made(memoryview(data), ResultHeader, Chunk, reader.frame_context(call))
    if type(made) is ViewedResult:
        event("taken in the call")
        return call, made
    if not isinstance(made, tuple):
        return made
    return made[0], reader.read_result(made[1], made[2])


def _assert_same(one: Any, other: Any) -> None:
    """Two results (or what else the readers gave) hold the same."""
    assert type(one) is type(other)
    if not isinstance(one, tuple) or len(one) != 2:
        assert one == other
        return
    (call, mine), (their_call, theirs) = one, other
    assert call == their_call and type(mine) is type(theirs)
    if mine is None:
        return
    assert mine.header == theirs.header and mine.chunks == theirs.chunks
    assert mine.message_sizes == theirs.message_sizes
    assert list(vars(mine)) == list(vars(theirs))
    if isinstance(mine, ViewedResult):
        assert mine.frame[0] is mine.chunks[0].data and mine.frame[1].size == theirs.frame[1].size
    for name in _FIELDS:
        got, want = getattr(mine.batch, name), getattr(theirs.batch, name)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def _state(reader: ResponseReader) -> tuple[Any, ...]:
    """What reading a result changes in a reader: its counts, its last worker, plans seen."""
    plans = {
        (worker, counts): plan.seen
        for worker, kept in reader.layouts._layouts.items()
        for counts, plan in kept.plans.items()
    }
    return (
        reader.layouts.viewed,
        reader.layouts.decoded,
        reader._assembler._last_key,
        reader._assembler.in_progress,
        plans,
    )


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_frame_taken_in_the_readers_one_call_is_what_the_python_path_makes(
    data: st.DataObject,
) -> None:
    """Random results of a learned worker, other workers, other calls and other
    counts, spoiled by changed, inserted and removed bytes (step types out of
    range, lengths the bytes do not hold, frames cut short): the reader's one
    call and the Python path give the same result, or the same error with the
    same text, and leave their readers in the same state."""
    learned = _result_frame([3, 2], number=1)
    plan_of = data.draw(st.sampled_from([[3, 2], [4, 1], [2, 2, 1]]))
    first = _result_frame(plan_of, number=2, seed=1)  # the counts' plan, learned
    # Mostly the learned counts, whose plan is kept.
    lengths = data.draw(st.sampled_from([plan_of, plan_of, plan_of, [3, 2], [5], [1, 1]]))
    honest = _result_frame(
        lengths,
        number=3,
        worker=data.draw(st.sampled_from([7, 7, 7, 8])),
        call=data.draw(st.sampled_from([1, 1, 1, 2])),
        seed=2,
    )
    frame = spoiled(data, honest)
    taking, reading = _reader(learned, first), _reader(learned, first)
    # A frame's own buffer of its size: a read past its end is caught by ASan.
    one = _outcome(lambda: _one_call(taking, bytearray(frame)))
    other = _outcome(lambda: _python_path(reading, bytearray(frame)))
    assert one[0] == other[0]
    if one[0] == "raised":
        assert one[1] == other[1]
    else:
        _assert_same(one[1], other[1])
    assert _state(taking) == _state(reading)


def test_an_honest_frame_of_a_kept_plan_is_taken_in_the_call_and_others_are_left() -> None:
    """A result of a learned worker and counts is made in the call, its chunk's
    data its frame's bytes; another worker's, another call's, new counts, a
    reader with no env spec, or a worker with a result of several chunks in
    progress, come back as header and chunk."""
    learned, first = _result_frame([3, 2], number=1), _result_frame([4, 1], number=2, seed=1)
    reader = _reader(learned, first)
    data = bytearray(_result_frame([4, 1], number=3, seed=2))
    taken = read_frame_made(memoryview(data), ResultHeader, Chunk, reader.frame_context(1))
    assert type(taken) is ViewedResult
    assert (reader.layouts.viewed, reader.layouts.decoded) == (2, 1)  # the first learned
    whole = taken.frame[0]
    assert whole.readonly and np.shares_memory(np.asarray(whole), np.frombuffer(data, np.uint8))
    left = [
        (_result_frame([4, 1], number=3, worker=8), 1),
        (_result_frame([4, 1], number=3), 2),
        (_result_frame([1, 1, 1], number=3), 1),
    ]
    for other, call in left:
        made = read_frame_made(
            memoryview(bytearray(other)), ResultHeader, Chunk, reader.frame_context(call)
        )
        assert isinstance(made, tuple) and len(made) == 3
    assert reader.layouts.viewed == 2
    # The context is the answer's: made with no env spec it takes nothing.
    bare = ResponseReader("Sample", lambda data: VIEWED, keep_pieces=True)
    assert bare.frame_context(1) is None
    # A worker's result of several chunks in progress: its one-chunk one is left.
    chunks = encode_batch_chunks(
        batch_with_infos([30, 40], 4), 400, batch_id=9, include_env_spec=False
    )
    assert reader.read_result(ResultHeader(4, 7, (4, 5), (30, 40), 0, 0), chunks[0]) is None
    context = reader.frame_context(1)
    assert isinstance(read_frame_made(memoryview(data), ResultHeader, Chunk, context), tuple)


def test_a_connections_kept_plan_results_reach_the_answer_with_no_python_call_of_the_reader() -> (
    None
):
    """Over a socket, an answer's results of a learned worker and counts come out
    of the connection's reader with no call of the sampler's reader, its
    assembler or its views (the Python path's read_result, whole and view),
    and equal the Python path's; the first results, which learn the layout and
    the counts' plan, take it."""
    frames = [_result_frame([4, 1], number=n, seed=n) for n in range(1, 7)]
    reading = _reader()
    expected = [_python_path(reading, bytearray(data))[1] for data in frames]
    reader = ResponseReader("Sample", lambda data: VIEWED, keep_pieces=True)
    called: list[str] = []
    results: list[Any] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code.co_name in ("read_result", "whole", "view"):
            called.append(frame.f_code.co_name)

    def progress(done: int, amount: int) -> None:
        results.append(done)
        sys.setprofile(profile if len(results) >= 2 else None)  # layout and plan learned

    call: list[ResponsePart] = [
        CallHeader(3, 2, 0, "c", b"spec", results_on_data=True),
        Footer(12, 30, 1, 0, len(frames)),
    ]
    with _frames_sent(*frames, results_end(1, len(frames))) as data:
        try:
            answer = collect_answer(iter(call), reader, Mode.EPISODES, 12, progress, data=data)
        finally:
            sys.setprofile(None)
    assert data.ended and data.count == len(frames) and len(results) == len(frames)
    assert not called
    got = answer.results
    assert [type(result) for result in got[2:]] == [ViewedResult] * 4
    for mine, theirs in zip(got, expected, strict=True):
        _assert_same((1, mine), (1, theirs))
