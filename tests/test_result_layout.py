"""A worker's results checked in one pass with the layout of its first (rlfleet.wire.result_layout).

No processes: results are built and encoded here as a worker writes them.
What holds: a later result of the learned layout passes without the general
decode; every result the general path refuses is refused with the same
text once the layout is known (spoiled values and spoiled bytes alike); a
result of another layout falls back to the general path, is checked there,
and becomes the layout. Fragment windows alike, with their own layout and
rules. The real-process test of the coordinator's use is
tests/test_hostile_worker.py (``..._after_an_honest_one_...``).
"""

from __future__ import annotations

import cProfile
import dataclasses
import itertools
import pstats
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core import EnvSpec, EpisodeBatch
from rlfleet.core.seeding import stream_seeds
from rlfleet.core.step_type import StepType
from rlfleet.errors import ProtocolError, WireFormatError
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.wire import _layout_frames as layout_frames_module
from rlfleet.wire import _result_check, decode_batch, encode_batch
from rlfleet.wire import result_layout as result_layout_module
from rlfleet.wire import result_views as result_views_module
from rlfleet.wire import tensors as tensors_module
from rlfleet.wire._result_reader import column_summary
from rlfleet.wire.batches import payload_kind
from rlfleet.wire.chunks import chunk_payload
from rlfleet.wire.result_checks import (
    FragmentWindow,
    ResultExpectation,
    check_result,
    step_type_problems,
)
from rlfleet.wire.result_layout import ResultLayoutCheck
from rlfleet.wire.result_views import ResultLayoutViews
from rlfleet.wire.results import (
    DecodedResult,
    JoinedResult,
    Result,
    ResultAssembler,
    ResultHeader,
    decode_kept,
    decode_result,
)

F, M, TERM, TIME = (
    int(t) for t in (StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT)
)
SPEC = EnvSpec(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(3), 10)
WORKER_ID = 7
UNITS = UnitColumns(np.arange(6), np.arange(6) + 100, np.arange(6) + 200)


def batch_of(lengths: Sequence[int], first: int = 0, **infos: dict[str, Any]) -> EpisodeBatch:
    """Whole episodes ``first, first + 1, ...`` of the task's units, valid values."""
    total, count = sum(lengths), len(lengths)
    step_types = np.full(total, M, np.uint8)
    ends = np.cumsum(lengths) - 1
    step_types[ends - np.asarray(lengths) + 1] = F
    step_types[ends] = TERM
    indices = np.arange(first, first + count, dtype=np.int64)
    rng = np.random.default_rng(total)
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={
            "agent_version": np.zeros(count, np.int64),
            "env_seed": indices + 100,
            "policy_seed": indices + 200,
            "episode_index": indices,
            "worker": np.full(count, WORKER_ID, np.int64),
        },
        observations=rng.uniform(-1, 1, (total, 2)).astype(np.float32),
        last_observations=np.zeros((count, 2), np.float32),
        actions=rng.integers(0, 3, total),
        rewards=np.ones(total, np.float32),
        env_infos=infos.get("env_infos", {}),
        agent_infos=infos.get("agent_infos", {}),
        step_types=step_types,
        lengths=np.asarray(lengths, np.int64),
    )


def joined(
    batch: EpisodeBatch,
    *,
    payload: Callable[[bytes], bytes] | None = None,
    chunk_bytes: int = 1 << 24,
) -> JoinedResult:
    """``batch`` as the coordinator takes it from a worker's result: one chunk, or
    chunks of ``chunk_bytes`` left unjoined (their boundaries cut headers and arrays)."""
    data = encode_batch(batch, include_env_spec=False)
    if payload is not None:
        data = payload(data)
    chunks = chunk_payload(data, kind=payload_kind(EpisodeBatch), max_bytes=chunk_bytes, batch_id=1)
    header = ResultHeader(
        task_id=1,
        worker_id=0,
        episode_indices=tuple(batch.episode_infos["episode_index"].tolist()),
        lengths=tuple(batch.lengths.tolist()),
        agent_version=0,
        env_generation=1,
    )
    assembler = ResultAssembler()
    rest = ResultHeader(1, 0, (), (), 0, 1)  # the metadata rides on chunk 0 only
    results = [
        assembler.join(rest if chunk.index else header, chunk, keep_pieces=True) for chunk in chunks
    ]
    result = results[-1]
    assert result is not None and len(result.chunks) == len(chunks)
    return result


EXPECT = ResultExpectation(
    env_spec=SPEC, worker_id=WORKER_ID, agent_version=0, env_generation=1, units=UNITS
)


def general_refusal(result: JoinedResult) -> str:
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        check_result(decode_result(result, SPEC), EXPECT)
    return str(info.value)


def learned() -> ResultLayoutCheck:
    check = ResultLayoutCheck()
    check.check(joined(batch_of([3, 2])), SPEC, EXPECT)
    assert check.learned
    return check


def test_a_later_result_of_the_learned_layout_passes_without_the_general_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned()

    def general(*args: object) -> None:
        raise AssertionError("the general path ran")

    monkeypatch.setattr(result_layout_module, "decode_result", general)
    # Other numbers of episodes and steps: the same layout.
    for lengths, first in (([4, 1, 5], 1), ([10], 5), ([1, 1, 1, 1, 1, 1], 0)):
        check.check(joined(batch_of(lengths, first)), SPEC, EXPECT)


def spoiled(field: str, change: Callable[[np.ndarray], None]) -> Callable[[EpisodeBatch], Any]:
    def spoil(batch: EpisodeBatch) -> EpisodeBatch:
        if field.startswith("episode_infos."):
            key = field.split(".", 1)[1]
            infos = {k: np.array(v) for k, v in batch.episode_infos.items()}
            change(infos[key])
            return dataclasses.replace(batch, episode_infos=infos)
        array = np.array(getattr(batch, field))
        change(array)
        fields: dict[str, Any] = {field: array}
        return dataclasses.replace(batch, **fields)

    return spoil


def _set(index: Any, value: Any) -> Callable[[np.ndarray], None]:
    def change(array: np.ndarray) -> None:
        array[index] = value

    return change


#: Results the general path refuses: spoiled values of the learned layout.
SPOILED_VALUES = {
    "observation outside the box": spoiled("observations", _set((4, 1), 1.5)),
    "last observation outside the box": spoiled("last_observations", _set((1, 0), -2.0)),
    "action outside Discrete(3)": spoiled("actions", _set(2, 3)),
    "negative action": spoiled("actions", _set(0, -1)),
    "NaN reward": spoiled("rewards", _set(3, np.nan)),
    "infinite reward": spoiled("rewards", _set(0, -np.inf)),
    "a second FIRST step": spoiled("step_types", _set(1, F)),
    "an episode that does not end": spoiled("step_types", _set(2, M)),
    "a TIMEOUT mid-episode": spoiled("step_types", _set(1, TIME)),
    "an episode that starts MID": spoiled("step_types", _set(3, M)),
    "an episode that ends FIRST": spoiled("step_types", _set(4, F)),
    "episode indices out of order": spoiled("episode_infos.episode_index", _set(0, 2)),
    "another worker": spoiled("episode_infos.worker", _set(1, WORKER_ID + 1)),
    "another agent version": spoiled("episode_infos.agent_version", _set(0, 3)),
    "an env seed not the unit's": spoiled("episode_infos.env_seed", _set(1, 5)),
    "a policy seed not the unit's": spoiled("episode_infos.policy_seed", _set(0, 5)),
    "an episode index off the metadata": spoiled("episode_infos.episode_index", _set(1, 4)),
}


@pytest.mark.parametrize("case", list(SPOILED_VALUES))
def test_a_spoiled_value_is_refused_with_the_general_paths_text(case: str) -> None:
    result = joined(SPOILED_VALUES[case](batch_of([3, 2])))
    expected = general_refusal(result)
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        learned().check(result, SPEC, EXPECT)
    assert str(info.value) == expected


def test_a_layout_left_to_numpys_screens_still_refuses_with_the_general_paths_text() -> None:
    """float16 rewards are not a dtype the compiled screens read: their finite
    sum is numpy's, on a view made for it, and an inf among them is refused."""
    honest = batch_of([3, 2])
    honest = dataclasses.replace(honest, rewards=honest.rewards.astype(np.float16))
    check = ResultLayoutCheck()
    check.check(joined(honest), SPEC, EXPECT)
    assert check.learned
    result = joined(spoiled("rewards", _set(0, np.inf))(honest))
    expected = general_refusal(result)
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        check.check(result, SPEC, EXPECT)
    assert str(info.value) == expected


def test_episodes_of_one_step_and_units_apart_pass_without_the_general_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned()
    monkeypatch.setattr(result_layout_module, "decode_result", _no_general_path)
    # Indices 1, 3, 4: held by the task, but not a run of its units.
    check.check(joined(with_indices(batch_of([1, 2, 1]), [1, 3, 4])), SPEC, EXPECT)


def _no_general_path(*args: object) -> None:
    raise AssertionError("the general path ran")


def with_indices(batch: EpisodeBatch, indices: Sequence[int]) -> EpisodeBatch:
    """``batch``'s episodes as the units ``indices``, with their seeds."""
    index = np.asarray(indices, np.int64)
    infos = dict(batch.episode_infos, episode_index=index, env_seed=index + 100)
    return dataclasses.replace(batch, episode_infos={**infos, "policy_seed": index + 200})


@pytest.mark.parametrize(
    ("case", "batch", "phrase"),
    [
        (
            "a one-step episode that does not end",
            spoiled("step_types", _set(3, F))(batch_of([3, 1, 2])),
            "ends with step type FIRST",
        ),
        ("a unit the task does not hold", with_indices(batch_of([2, 2]), [1, 9]), "9"),
    ],
)
def test_one_step_episodes_and_units_apart_are_refused_with_the_general_paths_text(
    case: str, batch: EpisodeBatch, phrase: str
) -> None:
    result = joined(batch)
    expected = general_refusal(result)
    assert phrase in expected
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        learned().check(result, SPEC, EXPECT)
    assert str(info.value) == expected


def test_the_one_pass_makes_few_numpy_calls_per_result() -> None:
    """The episode infos, lengths, the bytes around the arrays and the step
    types are checked in one compiled call, the values (bounds, rewards,
    bools) in another: no numpy call is left for this layout (15 when numpy
    screened the values, about 50 when it also compared the columns)."""
    check = learned()
    result = joined(batch_of([3, 1, 2, 4], 1))
    check.check(result, SPEC, EXPECT)
    profile = cProfile.Profile()
    profile.enable()
    check.check(result, SPEC, EXPECT)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    numpy_calls = sum(
        calls for (path, _, name), (_, calls, *_) in stats.items() if "numpy" in path + name
    )
    compiled_calls = [
        sum(calls for (_, _, name), (_, calls, *_) in stats.items() if f"_check.{compiled}" in name)
        for compiled in ("episodes_pass", "values_pass")
    ]
    assert (compiled_calls, numpy_calls) == ([1, 1], 0)
    # The header's lengths summed and bounded in one call (sum, min and max before: 14).
    assert sum(calls for _, calls, *_ in stats.values()) <= 12  # with profile.disable's own


def rlfleet_lines(run: Callable[[], object]) -> int:
    """Lines of rlfleet's own code that ``run`` executes."""
    count = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal count
        if "rlfleet" not in frame.f_code.co_filename:
            return None
        count += event == "line"
        return trace

    sys.settrace(trace)
    try:
        run()
    finally:
        sys.settrace(None)
    return count


def test_the_one_pass_runs_no_python_line_per_episode() -> None:
    """A result of 40 episodes runs the same lines of the one pass as one of 2:
    every per-episode check is a bytes or numpy operation over the result."""
    units = UnitColumns(np.arange(64), np.arange(64) + 100, np.arange(64) + 200)
    expect = dataclasses.replace(EXPECT, units=units)
    check = ResultLayoutCheck()
    check.check(joined(batch_of([3, 2])), SPEC, expect)
    lines = []
    for count in (1, 20):
        result = joined(batch_of([1, 3] * count))  # one-step episodes and longer ones
        check.check(result, SPEC, expect)  # its skeleton worked out
        lines.append(rlfleet_lines(lambda: check.check(result, SPEC, expect)))  # noqa: B023
    assert lines[0] == lines[1]


def kernel_verdict(
    lengths: Sequence[int],
    types: bytes,
    indices: Sequence[int] | None = None,
    *,
    columns: dict[int, Sequence[int]] | None = None,
    seeds: Any = None,
    chunk_bytes: int = 0,
) -> bool:
    """The compiled check's verdict on a result of a run of bytes, the six int64
    columns (lengths, indices, worker, agent version, env and policy seeds:
    the header's numbers unless ``columns`` gives one) and the step types;
    in chunks of ``chunk_bytes`` if given."""
    episodes = len(lengths)
    indices = list(range(episodes)) if indices is None else list(indices)
    held = [lengths, indices, [WORKER_ID] * episodes, [0] * episodes]
    held += [[index + 100 for index in indices], [index + 200 for index in indices]]
    held = [list((columns or {}).get(number, column)) for number, column in enumerate(held)]
    run = b"\x0a\x0b\x0c"
    data = run + b"".join(np.asarray(c, "<i8").tobytes() for c in held) + types
    places = [0, len(run), *(len(run) + 8 * episodes * c for c in range(7))]
    payload: Any = data
    if chunk_bytes:
        payload = tuple(data[at : at + chunk_bytes] for at in range(0, len(data), chunk_bytes))
    return _result_check.episodes_pass(
        payload,
        run,
        np.array(places, np.int64).tobytes(),
        tuple(lengths),
        tuple(indices),
        WORKER_ID,
        0,
        seeds,
    )


def test_the_one_pass_step_types_agree_with_the_general_paths_rules() -> None:
    # Whole episodes (1-step ones among them), honest or with one step
    # changed, or step types at random: the compiled check passes exactly
    # those the general path finds nothing wrong with, joined or in chunks.
    rng = np.random.default_rng(11)
    kinds = [int(t) for t in StepType]
    passed = 0
    for _ in range(3000):
        lengths = rng.integers(1, 6, int(rng.integers(1, 90)))
        if rng.random() < 0.7:
            types = np.full(int(lengths.sum()), int(StepType.MID), np.uint8)
            ends = np.cumsum(lengths) - 1
            types[ends - lengths + 1] = int(StepType.FIRST)
            types[ends] = rng.choice([int(StepType.TERMINAL), int(StepType.TIMEOUT)], len(ends))
            if rng.random() < 0.5:
                types[rng.integers(len(types))] = rng.choice([*kinds, 7])
        else:
            types = rng.choice(kinds, int(lengths.sum())).astype(np.uint8)
        general = not step_type_problems(types, lengths, None, must_end=True)
        for chunk_bytes in (0, 23):
            verdict = kernel_verdict(lengths.tolist(), types.tobytes(), chunk_bytes=chunk_bytes)
            assert verdict == general
        passed += general
    assert 500 < passed < 2500


_INT64 = range(-(2**63), 2**63)


def rules_verdict(
    lengths: Sequence[int],
    types: bytes,
    indices: Sequence[int],
    columns: Sequence[Sequence[int]],
    seeds: Any,
) -> bool:
    """The general path's rules on what the compiled check reads (the reference
    it is held to): header numbers in int64, the columns the header's and the
    units' numbers, indices from 0 up ascending, whole episodes' step types."""
    numbers = [*lengths, *indices]
    if not numbers or len(indices) != len(lengths) or any(n not in _INT64 for n in numbers):
        return False
    if min(lengths) < 1 or sum(lengths) != len(types):
        return False
    if indices[0] < 0 or any(a >= b for a, b in itertools.pairwise(indices)):
        return False
    episodes = len(lengths)
    if [list(c) for c in columns[:4]] != [
        list(lengths),
        list(indices),
        [WORKER_ID] * episodes,
        [0] * episodes,
    ]:
        return False
    if isinstance(seeds, tuple) and len(seeds) == 2:
        want = [[seeds[0]] * episodes, [seeds[1]] * episodes]
    elif seeds is not None:
        held = {int(i): (int(e), int(p)) for i, e, p in zip(*seeds, strict=True)}
        if any(index not in held for index in indices):
            return False
        want = [[held[i][0] for i in indices], [held[i][1] for i in indices]]
    else:
        want = [list(c) for c in columns[4:]]
    if [list(c) for c in columns[4:]] != want:
        return False
    return not step_type_problems(
        np.frombuffer(types, np.uint8), np.asarray(lengths), None, must_end=True
    )


@st.composite
def kernel_cases(draw: st.DrawFn) -> tuple[Any, ...]:
    """An honest result's numbers, bytes and units, then a few of them changed."""
    lengths = draw(st.lists(st.integers(1, 5), min_size=1, max_size=25))
    episodes = len(lengths)
    indices = sorted(draw(st.sets(st.integers(0, 40), min_size=episodes, max_size=episodes)))
    kinds = []
    for length in lengths:
        kinds += [] if length == 1 else [F, *[M] * (length - 2)]
        kinds.append(draw(st.sampled_from([TERM, TIME])))
    types = bytearray(kinds)
    for _ in range(draw(st.integers(0, 2))):  # steps changed (7: out of StepType's range)
        types[draw(st.integers(0, len(types) - 1))] = draw(st.sampled_from([F, M, TERM, TIME, 7]))
    held = sorted(draw(st.sets(st.integers(0, 40), max_size=41)) | set(indices))
    held = [i for i in held if draw(st.integers(0, 30)) or i not in indices]  # maybe one missing
    # Seeds as SeedSequence's are, with every byte of the int64 in use (the
    # high ones too: a column read short would pass them).
    big = draw(st.sampled_from([0, 2**62 + 2**57, -(2**62)]))
    units = (
        np.array(held, np.int64),
        np.array(held, np.int64) + 100 + big,
        np.array(held, np.int64) + 200 + big,
    )
    seeds = draw(st.sampled_from([None, (100 + big, 200 + big), units]))
    if isinstance(seeds, tuple) and len(seeds) == 2:
        env, policy = [100 + big] * episodes, [200 + big] * episodes
    else:
        env, policy = [i + 100 + big for i in indices], [i + 200 + big for i in indices]
    columns = [list(lengths), list(indices), [WORKER_ID] * episodes, [0] * episodes, env, policy]
    for _ in range(draw(st.integers(0, 2))):  # a column's value changed
        column, at = draw(st.integers(0, 5)), draw(st.integers(0, episodes - 1))
        if draw(st.booleans()):
            columns[column][at] = draw(st.integers(-2, 42))
        else:  # only its highest byte
            columns[column][at] = int(np.int64(columns[column][at]) ^ np.int64(-(2**56)))
    header_lengths, header_indices = list(lengths), list(indices)
    if episodes > 1 and draw(st.integers(0, 9)) == 0:  # an index repeated, bytes and header
        at = draw(st.integers(1, episodes - 1))
        header_indices[at] = columns[1][at] = header_indices[at - 1]
        for column, add in ((4, 100), (5, 200)):
            if seeds is not None and len(seeds) == 3:
                columns[column][at] = header_indices[at] + add + big
    if draw(st.integers(0, 9)) == 0:  # a header's number changed, maybe past int64
        numbers = draw(st.sampled_from([header_lengths, header_indices]))
        numbers[draw(st.integers(0, episodes - 1))] = draw(
            st.sampled_from([0, -1, 3, 2**63, -(2**63) - 1])
        )
    chunk_bytes = draw(st.sampled_from([0, 1, 7, 23]))
    return header_lengths, bytes(types), header_indices, columns, seeds, chunk_bytes


@settings(max_examples=400, deadline=None)
@given(kernel_cases())
def test_the_compiled_check_agrees_with_the_general_paths_rules(case: tuple[Any, ...]) -> None:
    """Random lengths, step types, indices, columns and units, joined or in
    chunks: the compiled check passes exactly what the rules pass."""
    lengths, types, indices, columns, seeds, chunk_bytes = case
    expected = rules_verdict(lengths, types, indices, columns, seeds)
    verdict = kernel_verdict(
        lengths,
        types,
        indices,
        columns=dict(enumerate(columns)),
        seeds=seeds,
        chunk_bytes=chunk_bytes,
    )
    assert verdict == expected


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(1, 500), max_size=90).map(tuple),  # a header's lengths
        st.lists(st.integers(-(2**64), 2**64), max_size=6).map(tuple),
        st.lists(st.sampled_from([-(2**63), -1, 0, 1, 2**62, 2**63 - 1]), max_size=6).map(tuple),
        st.lists(st.booleans() | st.floats() | st.integers(0, 9), min_size=1, max_size=4).map(
            tuple
        ),
        st.lists(st.integers(1, 9), max_size=4),  # a list, not a tuple
    )
)
def test_a_columns_summary_is_pythons_sum_min_and_max_within_int64(values: Any) -> None:
    """The one pass's look at a header's lengths, against Python's own (the
    sanitizer build runs this too)."""
    expected = None
    if (
        type(values) is tuple
        and values
        and all(type(v) is int and v in _INT64 for v in values)
        and sum(values) in _INT64
    ):
        expected = (sum(values), min(values), max(values))
    assert column_summary(values) == expected


def test_the_compiled_check_refuses_places_outside_the_result() -> None:
    """Offsets and sizes that reach past the result's bytes, or before them, are
    refused, never read (the sanitizer build runs this too)."""
    # A run of one byte, the six columns of one episode, its one step.
    data = b"\x0a" + np.array([1, 0, WORKER_ID, 0, 5, 6], "<i8").tobytes() + bytes([TERM])
    places = [0, 1, *range(1, 50, 8)]

    def verdict(places: list[int], data: bytes = data) -> bool:
        offsets = np.array(places, np.int64).tobytes()
        return _result_check.episodes_pass(data, b"\x0a", offsets, (1,), (0,), WORKER_ID, 0, None)

    assert verdict(places)
    assert not verdict(places, data[:-1])  # the step types cut short
    for at, value in ((1, 2), (0, -1), (0, 2**63 - 1), (2, -8), (2, 2**62), (8, 50), (8, -1)):
        spoilt = list(places)
        spoilt[at] = value
        assert not verdict(spoilt), (at, value)
    with pytest.raises(ValueError, match="places"):
        verdict(places[:-1])


def _byte(offset: int, value: int) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        spoilt = bytearray(data)
        spoilt[offset] = value
        return bytes(spoilt)

    return change


#: Results the general path refuses: bytes and metadata that break the protocol.
SPOILED_BYTES: dict[str, tuple[Callable[[JoinedResult], JoinedResult], str]] = {
    "a byte appended": (
        lambda r: joined(batch_of([3, 2]), payload=lambda d: d + b"\x00"),
        "does not decode",
    ),
    "the first tag broken": (
        lambda r: joined(batch_of([3, 2]), payload=_byte(0, 0xFF)),
        "does not decode",
    ),
    "metadata lengths off the batch's": (
        lambda r: dataclasses.replace(r, header=dataclasses.replace(r.header, lengths=(2, 3))),
        "lengths",
    ),
    "an episode longer than the limit": (
        lambda r: joined(batch_of([11, 2])),
        "max_episode_length 10",
    ),
    "another env generation": (
        lambda r: dataclasses.replace(r, header=dataclasses.replace(r.header, env_generation=2)),
        "env_generation is 2",
    ),
    "a step type out of range": (
        lambda r: joined(
            batch_of([3, 2]),
            payload=lambda d: d.replace(bytes([F, M, TERM, F, TERM]), bytes([F, 9, TERM, F, TERM])),
        ),
        "got 9 at index 1",
    ),
    "metadata lengths past the int64 range": (
        lambda r: dataclasses.replace(
            r, header=dataclasses.replace(r.header, lengths=(2**63 - 1, 2**63 - 1))
        ),
        "lengths",
    ),
    "a zero length in the metadata": (
        lambda r: dataclasses.replace(r, header=dataclasses.replace(r.header, lengths=(5, 0))),
        "lengths",
    ),
}


@pytest.mark.parametrize("case", list(SPOILED_BYTES))
def test_spoiled_bytes_or_metadata_are_refused_with_the_general_paths_text(case: str) -> None:
    spoil, phrase = SPOILED_BYTES[case]
    result = spoil(joined(batch_of([3, 2])))
    expected = general_refusal(result)
    assert phrase in expected
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        learned().check(result, SPEC, EXPECT)
    assert str(info.value) == expected


def test_a_bool_info_other_than_0_or_1_is_refused_once_its_layout_is_learned() -> None:
    flags = np.array([True, False, True, True, False])
    check = ResultLayoutCheck()
    check.check(joined(batch_of([3, 2], env_infos={"flag": flags})), SPEC, EXPECT)
    result = joined(
        batch_of([3, 2], env_infos={"flag": flags}),
        payload=lambda data: data.replace(b"\x01\x00\x01\x01\x00", b"\x01\x00\x02\x01\x00", 1),
    )
    expected = general_refusal(result)
    assert "bools must be 0 or 1" in expected
    with pytest.raises(ProtocolError) as info:
        check.check(result, SPEC, EXPECT)
    assert str(info.value) == expected


def test_a_layout_change_mid_session_falls_back_and_is_still_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned()
    log_probs = {"log_prob": np.zeros(4, np.float32)}
    # Another layout (agent infos appear): refused by the general path when spoiled ...
    spoilt = spoiled("observations", _set((0, 0), 7.0))(batch_of([2, 2], agent_infos=log_probs))
    result = joined(spoilt)
    with pytest.raises(ProtocolError) as info:
        check.check(result, SPEC, EXPECT)
    assert str(info.value) == general_refusal(result)
    assert "observations[0] holds 7.0" in str(info.value)
    # ... passed there when valid, and then it is the layout the one pass takes.
    calls: list[object] = []
    monkeypatch.setattr(
        result_layout_module,
        "decode_result",
        lambda *args: calls.append(args) or decode_result(*args),  # type: ignore[func-returns-value]
    )
    check.check(joined(batch_of([2, 2], agent_infos=log_probs)), SPEC, EXPECT)
    assert len(calls) == 1
    check.check(joined(batch_of([1, 3], agent_infos=log_probs)), SPEC, EXPECT)
    assert len(calls) == 1
    # The old layout is another change: checked again, and learned again.
    check.check(joined(batch_of([3, 2])), SPEC, EXPECT)
    assert len(calls) == 2


def test_a_new_env_spec_is_checked_by_the_general_path_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = learned()
    narrower = EnvSpec(gym.spaces.Box(-0.5, 0.5, (2,), np.float32), gym.spaces.Discrete(3), 10)
    batch = dataclasses.replace(batch_of([3, 2]), env_spec=narrower)
    expect = dataclasses.replace(EXPECT, env_spec=narrower)
    result = joined(batch)
    with pytest.raises(ProtocolError, match="outside the space"):
        check.check(result, narrower, expect)


@pytest.mark.parametrize("case", ["honest", *SPOILED_VALUES])
def test_a_result_left_in_its_chunks_is_checked_where_they_are(
    monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    # Chunks of 23 bytes: their boundaries cut the bytes around the arrays and the arrays.
    check = ResultLayoutCheck()
    check.check(joined(batch_of([3, 2]), chunk_bytes=23), SPEC, EXPECT)
    if case == "honest":
        monkeypatch.setattr(result_layout_module, "decode_result", None)
        check.check(joined(batch_of([4, 1, 5], 1), chunk_bytes=23), SPEC, EXPECT)
        return
    result = joined(SPOILED_VALUES[case](batch_of([3, 2])), chunk_bytes=23)
    assert isinstance(result.payload, tuple)
    expected = general_refusal(result)
    with pytest.raises(ProtocolError) as info:
        check.check(result, SPEC, EXPECT)
    assert str(info.value) == expected


# --- fragment windows ------------------------------------------------------------------

WINDOW = FragmentWindow(base_seed=4, streams=(10, 11), fragment_length=3)
WINDOW_EXPECT = dataclasses.replace(EXPECT, units=None, window=WINDOW)
#: A valid window: (stream, episode, fragment, steps, ends its episode) per piece.
PIECES = ((10, 0, 1, 1, True), (10, 1, 0, 2, False), (11, 0, 0, 3, False))
#: The next window of the same streams.
NEXT_PIECES = ((10, 1, 1, 3, False), (11, 0, 1, 2, True), (11, 1, 0, 1, False))


def window_of(pieces: Sequence[tuple[int, int, int, int, bool]] = PIECES) -> EpisodeBatch:
    """A window's pieces with the seeds stream_seeds gives and valid values."""
    step_types: list[int] = []
    for _, _, fragment, steps, ends in pieces:
        piece = [M] * steps
        piece[0] = F if fragment == 0 else M
        if ends:
            piece[-1] = TERM
        step_types += piece
    seeds = np.array([stream_seeds(4, s, e) for s, e, *_ in pieces], np.int64).reshape(-1, 2)
    count, total = len(pieces), len(step_types)
    rng = np.random.default_rng(total)
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={
            "agent_version": np.zeros(count, np.int64),
            "env_seed": seeds[:, 0],
            "policy_seed": seeds[:, 1],
            "episode_index": np.array([p[1] for p in pieces], np.int64),
            "worker": np.full(count, WORKER_ID, np.int64),
            "stream": np.array([p[0] for p in pieces], np.int64),
            "fragment_index": np.array([p[2] for p in pieces], np.int64),
        },
        observations=rng.uniform(-1, 1, (total, 2)).astype(np.float32),
        last_observations=rng.uniform(-1, 1, (count, 2)).astype(np.float32),
        actions=rng.integers(0, 3, total),
        rewards=np.ones(total, np.float32),
        env_infos={},
        agent_infos={"log_prob": np.zeros(total, np.float32)},
        step_types=np.array(step_types, np.uint8),
        lengths=np.array([p[3] for p in pieces], np.int64),
    )


def window_refusal(result: JoinedResult) -> str:
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        check_result(decode_result(result, SPEC), WINDOW_EXPECT)
    return str(info.value)


def learned_window(chunk_bytes: int = 1 << 24) -> ResultLayoutCheck:
    check = ResultLayoutCheck()
    check.check(joined(window_of(), chunk_bytes=chunk_bytes), SPEC, WINDOW_EXPECT)
    assert check.window_learned
    return check


def counting_decodes(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    monkeypatch.setattr(
        result_layout_module,
        "decode_result",
        lambda *args: calls.append(args) or decode_result(*args),  # type: ignore[func-returns-value]
    )
    return calls


@pytest.mark.parametrize("chunk_bytes", [1 << 24, 23])
def test_a_later_window_of_the_learned_layout_takes_the_one_pass(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    calls = counting_decodes(monkeypatch)
    check = ResultLayoutCheck()
    first = check.check(joined(window_of(), chunk_bytes=chunk_bytes), SPEC, WINDOW_EXPECT)
    assert len(calls) == 1
    assert first == window_of()
    for pieces in (NEXT_PIECES, PIECES):
        batch = check.check(joined(window_of(pieces), chunk_bytes=chunk_bytes), SPEC, WINDOW_EXPECT)
        # No decode, and the stream books get what the general path would give them.
        assert len(calls) == 1
        assert batch == window_of(pieces)


def test_episodes_and_windows_of_one_session_keep_their_layouts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = counting_decodes(monkeypatch)
    check = ResultLayoutCheck()
    check.check(joined(batch_of([3, 2])), SPEC, EXPECT)
    check.check(joined(window_of()), SPEC, WINDOW_EXPECT)
    assert len(calls) == 2
    for _ in range(2):
        assert check.check(joined(batch_of([4, 1], 1)), SPEC, EXPECT) is None
        check.check(joined(window_of(NEXT_PIECES)), SPEC, WINDOW_EXPECT)
    assert len(calls) == 2


def _pieces(*changes: tuple[int, int, int]) -> Callable[[], EpisodeBatch]:
    """The valid window with piece fields changed: (piece, field, value)."""

    def build() -> EpisodeBatch:
        pieces: list[list[Any]] = [list(p) for p in PIECES]
        for piece, field, value in changes:
            pieces[piece][field] = value
        return window_of([(p[0], p[1], p[2], p[3], bool(p[4])) for p in pieces])

    return build


#: Windows the general path refuses, each for a rule of its own.
SPOILED_WINDOWS: dict[str, Callable[[], EpisodeBatch]] = {
    "a stream not of the task": _pieces((2, 0, 12)),
    "a stream with a step too many": _pieces((2, 3, 4)),
    "a stream with a step too few": _pieces((2, 3, 2)),
    "a cut piece before another of its stream": _pieces((0, 4, False)),
    "an episode that does not follow the one ended": _pieces((1, 1, 2)),
    "a new episode's piece not fragment 0": lambda: window_of(
        ((10, 0, 1, 1, True), (10, 1, 2, 2, False), (11, 0, 0, 3, False))
    ),
    "a negative fragment index": _pieces((0, 2, -1)),
    "a negative episode index": lambda: spoiled("episode_infos.episode_index", _set(2, -1))(
        window_of()
    ),
    "seeds not the stream's": lambda: spoiled("episode_infos.env_seed", _set(1, 5))(window_of()),
    "a policy seed not the stream's": lambda: spoiled("episode_infos.policy_seed", _set(2, 5))(
        window_of()
    ),
    "a continuing piece that starts FIRST": lambda: spoiled("step_types", _set(0, F))(window_of()),
    "a piece starting its episode with MID": lambda: spoiled("step_types", _set(1, M))(window_of()),
    "a TIMEOUT inside a piece": lambda: spoiled("step_types", _set(4, TIME))(window_of()),
    "another worker": lambda: spoiled("episode_infos.worker", _set(1, WORKER_ID + 1))(window_of()),
    "another agent version": lambda: spoiled("episode_infos.agent_version", _set(0, 3))(
        window_of()
    ),
    "an observation outside the box": lambda: spoiled("observations", _set((4, 1), 1.5))(
        window_of()
    ),
    "a last observation outside the box": lambda: spoiled("last_observations", _set((2, 0), 2.0))(
        window_of()
    ),
    "an action outside Discrete(3)": lambda: spoiled("actions", _set(2, 3))(window_of()),
    "a NaN reward": lambda: spoiled("rewards", _set(5, np.nan))(window_of()),
}


@pytest.mark.parametrize("chunk_bytes", [1 << 24, 23])
@pytest.mark.parametrize("case", list(SPOILED_WINDOWS))
def test_a_spoiled_window_is_refused_with_the_general_paths_text(
    case: str, chunk_bytes: int
) -> None:
    result = joined(SPOILED_WINDOWS[case](), chunk_bytes=chunk_bytes)
    expected = window_refusal(result)
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        learned_window(chunk_bytes).check(result, SPEC, WINDOW_EXPECT)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    "case",
    # The others spoil an episodes batch's own bytes.
    [
        c
        for c in SPOILED_BYTES
        if c not in {"an episode longer than the limit", "a step type out of range"}
    ],
)
def test_a_window_of_spoiled_bytes_or_metadata_is_refused_with_the_general_paths_text(
    case: str,
) -> None:
    spoil, _ = SPOILED_BYTES[case]
    result = spoil(joined(window_of()))
    expected = window_refusal(result)
    with pytest.raises((ProtocolError, WireFormatError)) as info:
        learned_window().check(result, SPEC, WINDOW_EXPECT)
    assert str(info.value) == expected


#: Window columns a random change may hit, and values near the valid ones.
_COLUMNS = (
    "episode_infos.stream",
    "episode_infos.episode_index",
    "episode_infos.fragment_index",
    "episode_infos.env_seed",
    "episode_infos.worker",
    "episode_infos.agent_version",
    "step_types",
    "actions",
)


@pytest.mark.parametrize("seed", range(60))
def test_a_randomly_changed_window_gets_the_general_paths_verdict(seed: int) -> None:
    # Whatever the change, the one pass passes only what the general path passes,
    # and refuses with its text.
    rng = np.random.default_rng(seed)
    batch = window_of(NEXT_PIECES if seed % 2 else PIECES)
    for _ in range(int(rng.integers(1, 3))):
        field = str(rng.choice(_COLUMNS))
        array = np.asarray(
            getattr(batch, field) if "." not in field else batch.episode_infos[field[14:]]
        )
        index = int(rng.integers(0, len(array)))
        value = int(array[index]) + int(rng.choice([-2, -1, 1, 2, 10]))
        if field == "step_types":
            value %= 4  # a batch holds StepType values (out of range: the bytes cases)
        batch = spoiled(field, _set(index, value))(batch)
    result = joined(batch, chunk_bytes=int(rng.choice([23, 1 << 24])))
    try:
        check_result(decode_result(result, SPEC), WINDOW_EXPECT)
    except (ProtocolError, WireFormatError) as refusal:
        with pytest.raises((ProtocolError, WireFormatError)) as info:
            learned_window().check(result, SPEC, WINDOW_EXPECT)
        assert str(info.value) == str(refusal)
    else:
        assert learned_window().check(result, SPEC, WINDOW_EXPECT) == batch


def test_seeds_stay_checked_as_streams_run_past_the_seeds_derived_ahead() -> None:
    # 16 streams of 2-step episodes in 3-step windows: 32 pieces or more, which
    # take the seeds derived ahead; 40 windows run 60 episodes per stream.
    streams = tuple(range(10, 26))
    expect = dataclasses.replace(
        WINDOW_EXPECT, window=FragmentWindow(base_seed=4, streams=streams, fragment_length=3)
    )

    def lockstep(window: int) -> list[tuple[int, int, int, int, bool]]:
        episode = window * 3 // 2
        if window % 2 == 0:  # starts an episode: 2 steps, then 1 of the next
            one = [(episode, 0, 2, True), (episode + 1, 0, 1, False)]
        else:  # ends the episode begun before, then a whole one
            one = [(episode, 1, 1, True), (episode + 1, 0, 2, True)]
        return [(s, *piece) for s in streams for piece in one]

    check = ResultLayoutCheck()
    for window in range(40):
        batch = window_of(lockstep(window))
        assert check.check(joined(batch), SPEC, expect) == batch
    spoilt = spoiled("episode_infos.policy_seed", _set(17, 5))(window_of(lockstep(40)))
    result = joined(spoilt)
    with pytest.raises(ProtocolError) as info:
        check_result(decode_result(result, SPEC), expect)
    assert "seeds (env, policy) are" in str(info.value)
    with pytest.raises(ProtocolError) as again:
        check.check(result, SPEC, expect)
    assert str(again.value) == str(info.value)


def test_episode_infos_other_than_int64_take_the_general_path_every_time() -> None:
    # The one pass compares the episode infos as int64 bytes: a worker that
    # writes them narrower keeps the general path, and its checks.
    def narrow(batch: EpisodeBatch) -> EpisodeBatch:
        infos = {key: value.astype(np.int32) for key, value in batch.episode_infos.items()}
        return dataclasses.replace(batch, episode_infos=infos)

    check = ResultLayoutCheck()
    check.check(joined(narrow(batch_of([3, 2]))), SPEC, EXPECT)
    assert not check.learned
    spoilt = joined(
        narrow(spoiled("episode_infos.worker", _set(1, WORKER_ID + 1))(batch_of([3, 2])))
    )
    with pytest.raises(ProtocolError) as info:
        check.check(spoilt, SPEC, EXPECT)
    assert str(info.value) == general_refusal(spoilt)


# --- a learner's results, viewed with their worker's layout --------------------------


def learner_result(
    batch: EpisodeBatch, spoil: Callable[[bytearray], None] | None = None
) -> JoinedResult:
    """``batch`` as a learner receives it: one chunk in a reused (writable) buffer."""

    def payload(data: bytes) -> bytes:
        spoilt = bytearray(data)
        if spoil is not None:
            spoil(spoilt)
        return spoilt  # type: ignore[return-value]

    return joined(batch, payload=payload)


def _offset_of(batch: EpisodeBatch, field: str) -> int:
    """Where a field's data sits in ``batch``'s encoding."""
    data = encode_batch(batch, include_env_spec=False)
    array = getattr(decode_batch(data, env_spec=SPEC), field)
    return int(array.ctypes.data - np.frombuffer(data, np.uint8).ctypes.data)


def assert_same_views(viewed: Result, decoded: Result) -> None:
    """Bit for bit the general decode's batch, read-only views of the received bytes."""
    assert isinstance(viewed, DecodedResult) and isinstance(decoded, DecodedResult)
    assert viewed.header == decoded.header
    for name in (
        "observations",
        "last_observations",
        "actions",
        "rewards",
        "step_types",
        "lengths",
    ):
        mine, theirs = getattr(viewed.batch, name), getattr(decoded.batch, name)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert mine.tobytes() == theirs.tobytes(), name
        assert not mine.flags.writeable, name
    for name in ("episode_infos", "env_infos", "agent_infos"):
        _assert_same_infos(getattr(viewed.batch, name), getattr(decoded.batch, name))


def _assert_same_infos(mine: Any, theirs: Any) -> None:
    if isinstance(theirs, dict):
        assert isinstance(mine, dict) and mine.keys() == theirs.keys()
        for key in theirs:
            _assert_same_infos(mine[key], theirs[key])
        return
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
    assert mine.tobytes() == theirs.tobytes() and not mine.flags.writeable


def batch_with_infos(lengths: Sequence[int], first: int = 0) -> EpisodeBatch:
    total = sum(lengths)
    infos: dict[str, Any] = {
        "env_infos": {
            "hit": np.arange(total) % 2 == 0,
            "deep": {"x": np.ones((total, 3), np.int16)},
        },
        "agent_infos": {"logp": np.linspace(0, 1, total)},
    }
    return batch_of(lengths, first, **infos)


def test_a_learners_later_results_of_a_workers_layout_are_viewed_as_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    views = ResultLayoutViews()
    first = learner_result(batch_with_infos([3, 2]))
    assert_same_views(views.decode(first, SPEC), decode_kept(first, SPEC))
    assert (views.decoded, views.viewed) == (1, 0)
    cases = [
        learner_result(batch_with_infos(lengths, first))
        for lengths, first in (([4, 1, 5], 1), ([10], 5), ([1, 1, 1, 1, 1, 1], 0))
    ]
    expected = [decode_kept(result, SPEC) for result in cases]

    def general(*args: object) -> None:
        raise AssertionError("the general path ran")

    monkeypatch.setattr(result_views_module, "decode_kept", general)
    for result, decoded in zip(cases, expected, strict=True):
        assert_same_views(views.decode(result, SPEC), decoded)
    assert (views.decoded, views.viewed) == (1, 3)


def skeletons_built(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The counts of each skeleton built from now on, none kept by earlier tests."""
    built: list[tuple[int, int]] = []
    build = layout_frames_module._build_skeleton

    def counted(blocks: Any, episodes: int, steps: int, *rest: Any) -> Any:
        built.append((episodes, steps))
        return build(blocks, episodes, steps, *rest)

    monkeypatch.setattr(layout_frames_module, "_build_skeleton", counted)
    monkeypatch.setattr(layout_frames_module, "_SKELETONS", {})
    return built


def test_a_learners_views_of_new_counts_build_no_index_of_the_compared_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The byte index of a skeleton is the coordinator's one pass's alone: a
    # learner's results of episode and step counts it has not seen build
    # only the offsets they are viewed at.
    built = skeletons_built(monkeypatch)
    views = ResultLayoutViews()
    views.decode(learner_result(batch_with_infos([3, 2])), SPEC)
    for lengths, first in (([4, 1, 5], 1), ([10], 5), ([2, 3], 0), ([1, 1, 1, 1, 1, 1], 0)):
        result = learner_result(batch_with_infos(lengths, first))
        assert_same_views(views.decode(result, SPEC), decode_kept(result, SPEC))
    assert (views.viewed, built) == (4, [])
    # The coordinator's check still builds one per new pair of counts.
    check = ResultLayoutCheck()
    for lengths, first in (([3, 2], 0), ([4, 1], 0), ([1, 2, 3], 2)):
        check.check(joined(batch_of(lengths, first)), SPEC, EXPECT)
    assert check.learned and built == [(2, 5), (3, 6)]


def test_the_skeletons_of_a_layout_are_built_once_for_every_worker_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The result lanes of a fleet's workers check results of one layout: a
    # pair of counts one session's check met is not worked out again for another.
    built = skeletons_built(monkeypatch)
    results = [joined(batch_of(lengths, 0)) for lengths in ([3, 2], [4, 1], [1, 2, 3], [2, 2])]
    for session in range(2):
        check = ResultLayoutCheck()
        for result in results:
            check.check(result, SPEC, EXPECT)
        assert check.learned, session
    assert built == [(2, 5), (3, 6), (2, 4)]


def test_a_results_frame_is_built_once_in_the_learners_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fleet.local: the coordinator's one pass and the learner's views of the
    # same result, in one process. A frame depends on the layout alone, so
    # the learner's views take the one the check built for the result's
    # counts (a per-env worker's results hardly ever repeat them; a
    # skeleton is its frame): one frame per new pair of counts, where each
    # side worked out its own.
    built: list[tuple[int, int]] = []

    def counted(build: Callable[..., Any]) -> Callable[..., Any]:
        def made(blocks: Any, episodes: int, steps: int, *rest: Any) -> Any:
            built.append((episodes, steps))
            return build(blocks, episodes, steps, *rest)

        return made

    monkeypatch.setattr(layout_frames_module, "_FRAMES", {}, raising=False)  # none kept yet
    monkeypatch.setattr(layout_frames_module, "_SKELETONS", {})
    check, views = ResultLayoutCheck(), ResultLayoutViews()
    check.check(joined(batch_of([3, 2])), SPEC, EXPECT)  # both learn the layout
    views.decode(learner_result(batch_of([3, 2])), SPEC)
    for name in ("_build_frame", "_build_skeleton"):  # the frames either side works out
        monkeypatch.setattr(
            layout_frames_module, name, counted(getattr(layout_frames_module, name))
        )
    for lengths, first in (([4, 1], 0), ([1, 2, 3], 2), ([1, 1, 1, 1, 1, 1], 0)):
        check.check(joined(batch_of(lengths, first)), SPEC, EXPECT)
        result = learner_result(batch_of(lengths, first))
        assert_same_views(views.decode(result, SPEC), decode_kept(result, SPEC))
    assert check.learned and views.viewed == 3
    assert built == [(2, 5), (3, 6), (6, 6)]


def test_a_new_number_of_steps_builds_its_skeleton_in_few_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A per-env worker's results hardly repeat their numbers of steps, so most
    # results of a lane build a skeleton: one compiled call evaluates the
    # layout's program (rlfleet/wire/_skeleton.c), the skeleton made without
    # its frozen __init__ and kept as the process's frame of the counts
    # (123 calls each when the frame and skeleton were built in Python; the
    # layout's program is worked out at its first new counts, 2, 5 here).
    for kept in ("_SKELETONS", "_FRAMES"):  # none kept by other tests: this layout's own
        monkeypatch.setattr(layout_frames_module, kept, {})
    layout = layout_frames_module._learn(batch_of([3, 2]), window=False)
    assert layout is not None
    layout.skeleton(2, 5)  # the blocks of a row per episode, kept
    for steps in (7000, 40):  # varints of two bytes and of one
        profile = cProfile.Profile()
        profile.enable()
        skeleton = layout.skeleton(2, steps)
        profile.disable()
        assert skeleton.size > steps
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        calls = sum(calls for _, calls, *_ in stats.values())
        assert calls <= 12, (steps, calls)  # with profile.disable's own


def test_new_counts_leave_the_tensor_header_cache_alone() -> None:
    # A per-env worker's results bring new step counts one after the other:
    # their headers are built from bytes worked out once per array, and the
    # cache of tensor_header, which keeps the writer's few headers, is not
    # filled with headers no later result asks for (about six per result).
    check = ResultLayoutCheck()
    check.check(joined(batch_with_infos([3, 2])), SPEC, EXPECT)
    results = [  # written first: the writer asks tensor_header
        joined(batch_with_infos([10] * (episodes - 1) + [last]))
        for episodes in range(1, 7)
        for last in range(1, 10)
    ]
    cached = tensors_module.tensor_header.cache_info()
    for result in results:
        assert check.check(result, SPEC, EXPECT) is None
    after = tensors_module.tensor_header.cache_info()
    assert (after.hits, after.misses) == (cached.hits, cached.misses)


def test_a_learners_result_of_counts_seen_before_takes_its_kept_plan() -> None:
    """A result of a pair of counts the worker sent before is viewed from the
    plan kept for them: one comparison of the runs of bytes between its
    arrays, one structured array whose fields are the views (made the second
    time the counts come) and the batch's dicts, those of arrays only made
    in C, no walk over the layout's fields (82 lines of rlfleet's code for
    this result; 105 with every dict built by a walk of its map, 177 with a
    comparison per run and a view made per array, 282 when each view was
    looked up by name through the layout)."""
    views = ResultLayoutViews()
    views.decode(learner_result(batch_with_infos([3, 2])), SPEC)
    views.decode(learner_result(batch_with_infos([4, 1, 5], 1)), SPEC)  # its plan worked out
    views.decode(learner_result(batch_with_infos([1, 1, 8], 4)), SPEC)  # its record too
    result = learner_result(batch_with_infos([2, 5, 3], 7))  # the same counts: 3 and 10
    lines = rlfleet_lines(lambda: views.decode(result, SPEC))
    assert views.viewed == 3 and lines <= 90
    assert_same_views(views.decode(result, SPEC), decode_kept(result, SPEC))


def _decoded_counting(
    views: ResultLayoutViews, result: JoinedResult
) -> tuple[Result, int, list[str], int]:
    """``views``' decode of ``result``, the numpy reductions it makes, its
    calls into rlfleet's checks and into the C view check."""
    profile = cProfile.Profile()
    profile.enable()
    decoded = views.decode(result, SPEC)
    profile.disable()
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    reductions = sum(calls for (_, _, name), (_, calls, *_) in stats.items() if "reduce" in name)
    checks = [name for (path, _, name) in stats if path.endswith("_validation.py")]
    c_checks = sum(calls for (_, _, name), (_, calls, *_) in stats.items() if "view_check" in name)
    return decoded, reductions, checks, c_checks


@pytest.mark.parametrize("lengths", [[4, 1, 5], [300, 400]])
def test_a_learners_viewed_result_is_checked_in_one_c_call(lengths: list[int]) -> None:
    """The checks decoding makes on a viewed result (the bytes between the
    arrays, the lengths, uint8 step types in range, bools) are one call into
    the C view check, short results or long: no numpy reduction and no
    Python check, on a new plan and on one with its record made
    (refusals: below)."""
    views = ResultLayoutViews()
    views.decode(learner_result(batch_of([3, 2])), SPEC)
    for first in (1, 2, 3):  # a new plan, the plan with its record made, the record
        result = learner_result(batch_of(lengths, first))
        viewed, counted, checks, c_checks = _decoded_counting(views, result)
        assert (counted, checks, c_checks) == (0, [], 1)
        assert_same_views(viewed, decode_kept(result, SPEC))
    assert views.viewed == 3


def _step_type(value: int) -> Callable[[bytearray], None]:
    def spoil(data: bytearray) -> None:
        data[_offset_of(batch_with_infos([4, 1, 5]), "step_types") + 2] = value

    return spoil


@pytest.mark.parametrize("value", [4, 9, 255])
def test_a_learners_result_whose_values_decoding_refuses_is_refused_with_its_text(
    value: int,
) -> None:
    views = ResultLayoutViews()
    views.decode(learner_result(batch_with_infos([3, 2])), SPEC)
    spoilt = learner_result(batch_with_infos([4, 1, 5]), _step_type(value))
    with pytest.raises(ProtocolError) as expected:
        decode_kept(spoilt, SPEC)
    with pytest.raises(ProtocolError) as info:
        views.decode(spoilt, SPEC)
    assert str(info.value) == str(expected.value)
    assert views.viewed == 0


@pytest.mark.parametrize("value", [3, 4, 200])
def test_a_learners_long_result_is_refused_or_viewed_as_decoding_says(value: int) -> None:
    """A long result's step types are range-checked as a short one's: the
    range's last value passes, the next is refused with decoding's text."""
    lengths = [300, 400]
    at = _offset_of(batch_of(lengths), "step_types") + 500  # mid-episode

    def spoil(data: bytearray) -> None:
        data[at] = value

    views = ResultLayoutViews()
    views.decode(learner_result(batch_of([3, 2])), SPEC)
    result = learner_result(batch_of(lengths), spoil)
    try:
        decoded = decode_kept(result, SPEC)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as info:
            views.decode(result, SPEC)
        assert str(info.value) == str(exc) and value > 3 and views.viewed == 0
    else:
        assert_same_views(views.decode(result, SPEC), decoded)
        assert value <= 3 and views.viewed == 1


@pytest.mark.parametrize("value", [1, 2, 255])
def test_a_learners_bool_info_is_refused_or_viewed_as_decoding_says(value: int) -> None:
    """A bool other than 0 or 1 in a viewed result is refused with decoding's
    text, on a new plan and through a kept record; a 1 is viewed."""
    lengths = [4, 1, 5]
    data = encode_batch(batch_with_infos(lengths), include_env_spec=False)
    hit = decode_batch(data, env_spec=SPEC).env_infos["hit"]
    at = int(hit.ctypes.data - np.frombuffer(data, np.uint8).ctypes.data) + 3

    def spoil(data: bytearray) -> None:
        data[at] = value

    for seen in (0, 1, 2):  # a new plan, then the plan with its record made, the record
        views = ResultLayoutViews()
        views.decode(learner_result(batch_with_infos([3, 2])), SPEC)
        for first in range(seen):
            views.decode(learner_result(batch_with_infos(lengths, first)), SPEC)
        result = learner_result(batch_with_infos(lengths, 9), spoil)
        try:
            decoded = decode_kept(result, SPEC)
        except ProtocolError as exc:
            with pytest.raises(ProtocolError) as info:
                views.decode(result, SPEC)
            assert str(info.value) == str(exc) and value > 1 and views.viewed == seen
        else:
            assert_same_views(views.decode(result, SPEC), decoded)
            assert value == 1 and views.viewed == seen + 1


def _recorded() -> tuple[ResultLayoutViews, Any]:
    """Views that have seen counts 3 and 10 twice: their plan keeps a record."""
    views = ResultLayoutViews()
    views.decode(learner_result(batch_with_infos([3, 2])), SPEC)
    for first in (0, 1):  # the plan of counts 3 and 10, then its record (made with the views)
        assert views.decode(learner_result(batch_with_infos([4, 1, 5], first)), SPEC).arrays
    (plan,) = next(iter(views._layouts.values())).plans.values()
    assert plan.record is not None and views.viewed == 2
    return views, plan


def test_a_learners_result_viewed_through_a_kept_record_is_checked_as_the_first() -> None:
    """Counts seen twice are viewed as the fields of one structured array; a
    result read that way still refuses what decoding refuses, with its text,
    and leaves any change of the bytes between the arrays to the general
    decode."""
    views, plan = _recorded()
    spoilt = learner_result(batch_with_infos([4, 1, 5]), _step_type(9))
    with pytest.raises(ProtocolError) as expected:
        decode_kept(spoilt, SPEC)
    with pytest.raises(ProtocolError) as info:
        views.decode(spoilt, SPEC)
    assert str(info.value) == str(expected.value)
    result = learner_result(batch_with_infos([2, 5, 3], 7))
    assert_same_views(views.decode(result, SPEC), decode_kept(result, SPEC))
    assert views.viewed == 3
    rng = np.random.default_rng(0)
    for offset, run in plan.headers:
        at = offset + int(rng.integers(len(run)))

        def spoil(data: bytearray, at: int = at) -> None:
            data[at] ^= 0x01

        views, _ = _recorded()
        result = learner_result(batch_with_infos([2, 5, 3], 7), spoil)
        try:
            decoded = decode_kept(result, SPEC)
        except ProtocolError as exc:
            with pytest.raises(ProtocolError) as info:
                views.decode(result, SPEC)
            assert str(info.value) == str(exc)
        else:
            assert_same_views(views.decode(result, SPEC), decoded)
        assert views.viewed == 2  # not viewed: the general decode read it


def test_a_learners_result_of_another_layout_or_in_chunks_takes_the_general_decode() -> None:
    views = ResultLayoutViews()
    views.decode(learner_result(batch_with_infos([3, 2])), SPEC)
    other = learner_result(batch_of([4, 1, 5], 1))  # no infos: another layout
    assert_same_views(views.decode(other, SPEC), decode_kept(other, SPEC))
    pieces = joined(batch_with_infos([4, 1, 5], 1), chunk_bytes=64)
    assert views.decode(pieces, SPEC).arrays.total_steps == 10
    # The layout learned last is the one in use.
    assert (views.decoded, views.viewed) == (3, 0)
    views.decode(learner_result(batch_of([2, 2])), SPEC)
    assert views.viewed == 1


@pytest.mark.parametrize("chunk_bytes", [1 << 24, 97])
def test_an_episodes_result_makes_no_reader_unless_a_numpy_screen_is_left(
    monkeypatch: pytest.MonkeyPatch, chunk_bytes: int
) -> None:
    """The one pass of episodes reads their bytes in compiled calls: no reader of
    the payload is made for it (its size counted over its chunks), except for the
    views of a screen left to numpy; either way the general path does not run."""
    made: list[object] = []
    reader = result_layout_module._reader

    def counted(payload: Any) -> Any:
        made.append(payload)
        return reader(payload)

    honest = batch_of([3, 2])
    screened = dataclasses.replace(honest, rewards=honest.rewards.astype(np.float16))
    checks = {}
    for name, batch in (("compiled", honest), ("screened", screened)):
        checks[name] = ResultLayoutCheck()
        checks[name].check(joined(batch), SPEC, EXPECT)
    monkeypatch.setattr(result_layout_module, "_reader", counted)
    monkeypatch.setattr(result_layout_module, "decode_result", _no_general_path)
    checks["compiled"].check(joined(batch_of([4, 1, 5], 1), chunk_bytes=chunk_bytes), SPEC, EXPECT)
    assert made == []
    later = batch_of([4, 1, 5], 1)
    later = dataclasses.replace(later, rewards=later.rewards.astype(np.float16))
    checks["screened"].check(joined(later, chunk_bytes=chunk_bytes), SPEC, EXPECT)
    assert len(made) == 1
