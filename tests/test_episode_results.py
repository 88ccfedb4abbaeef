"""The one result assembler and validator (rlfleet.wire.results, .result_checks), no processes.

The coordinator, the client and the conformance kit all use it; these tests
build results by hand so that every rule is exercised on its own. The
real-process test of the coordinator's use is tests/test_hostile_worker.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.conformance.checks import continuity_problems
from rlfleet.core import EnvSpec, EpisodeBatch, space_checks
from rlfleet.core.seeding import stream_seeds
from rlfleet.core.space_checks import space_problem, space_screen
from rlfleet.core.step_type import StepType
from rlfleet.errors import WireFormatError
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.v1 import worker_pb2
from rlfleet.wire import Chunk, encode_batch_chunks
from rlfleet.wire.result_checks import (
    FragmentWindow,
    ResultExpectation,
    check_result,
    step_type_problems,
    value_problems,
)
from rlfleet.wire.results import DecodedResult, ResultAssembler, ResultError, ResultHeader

F, M, TERM, TIME = (
    int(t) for t in (StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT)
)
SPEC = EnvSpec(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), gym.spaces.Discrete(2), 10)
WORKER_ID = 7


# --- building results by hand ------------------------------------------------------


def make_batch(
    lengths: Sequence[int], step_types: Sequence[int], infos: Mapping[str, Sequence[int]]
) -> EpisodeBatch:
    total = sum(lengths)
    observations = np.arange(total * 2, dtype=np.float32).reshape(total, 2) / 100
    return EpisodeBatch(
        env_spec=SPEC,
        episode_infos={key: np.asarray(value, dtype=np.int64) for key, value in infos.items()},
        observations=observations,
        last_observations=np.full((len(lengths), 2), 0.5, dtype=np.float32),
        actions=np.zeros(total, dtype=np.int64),
        rewards=np.ones(total, dtype=np.float32),
        env_infos={},
        agent_infos={},
        step_types=np.asarray(step_types, dtype=np.uint8),
        lengths=np.asarray(lengths, dtype=np.int64),
    )


def make_result(batch: EpisodeBatch, *, task_id: int = 1, agent_version: int = 0) -> DecodedResult:
    header = ResultHeader(
        task_id=task_id,
        worker_id=0,
        episode_indices=tuple(batch.episode_infos["episode_index"].tolist()),
        lengths=tuple(batch.lengths.tolist()),
        agent_version=agent_version,
        env_generation=1,
    )
    return DecodedResult(header, batch)


def episode_task() -> ResultExpectation:
    """Task 1: episodes 0 and 1 with seeds (11, 21) and (12, 22)."""
    return ResultExpectation(
        env_spec=SPEC,
        worker_id=WORKER_ID,
        agent_version=-1,
        env_generation=1,
        units=UnitColumns([0, 1], [11, 12], [21, 22]),
    )


def good_episode_infos() -> dict[str, list[int]]:
    return {
        "agent_version": [0, 0],
        "env_seed": [11, 12],
        "policy_seed": [21, 22],
        "episode_index": [0, 1],
        "worker": [WORKER_ID, WORKER_ID],
    }


def failure_of(result: DecodedResult, expect: ResultExpectation) -> str:
    with pytest.raises(ResultError) as info:
        check_result(result, expect)
    return str(info.value)


# --- step types ------------------------------------------------------------------------


def test_whole_episodes_with_valid_step_types_have_no_problems() -> None:
    # A 3-step terminal episode, then a one-step episode cut by a time limit.
    problems = step_type_problems(
        np.array([F, M, TERM, TIME]), np.array([3, 1]), np.array([True, True]), must_end=True
    )
    assert problems == []


def test_a_second_first_step_is_reported_with_its_position() -> None:
    problems = step_type_problems(
        np.array([F, F, TERM]), np.array([3]), np.array([True]), must_end=True
    )
    assert problems == ["episode 0 of the batch, step 2 of 3: step type FIRST, expected MID"]


def test_a_whole_episode_must_end_terminal_or_timeout() -> None:
    problems = step_type_problems(np.array([F, M]), np.array([2]), np.array([True]), must_end=True)
    assert problems[0].startswith("episode 0 of the batch ends with step type MID")


def test_fragment_pieces_continue_with_mid_and_may_be_cut() -> None:
    # Piece 0 starts and ends an episode; piece 1 continues one and is cut.
    lengths, starts = np.array([2, 3]), np.array([True, False])
    assert step_type_problems(np.array([F, TERM, M, M, M]), lengths, starts, must_end=False) == []
    problems = step_type_problems(np.array([F, TERM, F, M, M]), lengths, starts, must_end=False)
    assert problems == ["episode 1 of the batch, step 1 of 3: step type FIRST, expected MID"]


# --- episode results ---------------------------------------------------------------------


def test_a_well_formed_episode_result_passes() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    check_result(make_result(batch), episode_task())


def test_episodes_naming_another_worker_fail() -> None:
    infos = good_episode_infos() | {"worker": [0, 0]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episode_infos['worker'] holds [0], expected 7 for every episode" in message


def test_episodes_with_seeds_other_than_their_units_fail() -> None:
    infos = good_episode_infos() | {"env_seed": [11, 99]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episode 1: episode_infos['env_seed'] is 99, the unit's env_seed is 12" in message


def test_native_env_episodes_must_say_they_have_no_env_seed() -> None:
    """A native vector env's episodes carry env_seed and policy_seed -1
    (NO_ENV_SEED, NO_POLICY_SEED), and only they do."""
    native = dataclasses.replace(episode_task(), native=True)
    unseeded = good_episode_infos() | {"env_seed": [-1, -1], "policy_seed": [-1, -1]}
    check_result(make_result(make_batch([3, 1], [F, M, TERM, TIME], unseeded)), native)
    seeded = make_result(make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos()))
    message = failure_of(seeded, native)
    assert "episode 0: episode_infos['env_seed'] is 11, the unit's env_seed is -1" in message
    policy_seeded = good_episode_infos() | {"env_seed": [-1, -1]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], policy_seeded)), native)
    assert "episode_infos['policy_seed'] is" in message and "policy_seed is -1" in message
    unseeded_result = make_result(make_batch([3, 1], [F, M, TERM, TIME], unseeded))
    message = failure_of(unseeded_result, episode_task())
    assert "episode 0: episode_infos['env_seed'] is -1, the unit's env_seed is 11" in message


def test_metadata_that_disagrees_with_the_batch_fails() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    result = make_result(batch)
    wrong = dataclasses.replace(result, header=dataclasses.replace(result.header, lengths=(3, 2)))
    assert "metadata lengths [3, 2] disagree with the batch's lengths [3, 1]" in failure_of(
        wrong, episode_task()
    )


def test_episodes_that_are_not_units_of_the_task_fail() -> None:
    infos = good_episode_infos() | {"episode_index": [0, 5]}
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episodes [5] are not units of task 1" in message


def test_missing_episode_infos_fail() -> None:
    infos = good_episode_infos()
    del infos["policy_seed"]
    message = failure_of(make_result(make_batch([3, 1], [F, M, TERM, TIME], infos)), episode_task())
    assert "episode_infos has no 'policy_seed' tensor" in message


def test_episodes_longer_than_the_limit_fail() -> None:
    lengths = [11, 1]
    types = [F, *[M] * 9, TIME, TERM]
    message = failure_of(
        make_result(make_batch(lengths, types, good_episode_infos())), episode_task()
    )
    assert "episode 0 has 11 steps, more than the env's max_episode_length 10" in message


# --- fragment windows --------------------------------------------------------------------------


def fragment_task() -> ResultExpectation:
    """Windows of 3 steps of streams 10 and 11, base seed 4."""
    return ResultExpectation(
        env_spec=SPEC,
        worker_id=WORKER_ID,
        agent_version=-1,
        env_generation=1,
        window=FragmentWindow(base_seed=4, streams=(10, 11), fragment_length=3),
    )


def window(pieces: Sequence[tuple[int, int, int, int]], step_types: Sequence[int]) -> DecodedResult:
    """Pieces as (stream, episode, fragment, length), seeded as stream_seeds says."""
    seeds = [stream_seeds(4, stream, episode) for stream, episode, _, _ in pieces]
    infos = {
        "agent_version": [0] * len(pieces),
        "env_seed": [s[0] for s in seeds],
        "policy_seed": [s[1] for s in seeds],
        "episode_index": [p[1] for p in pieces],
        "worker": [WORKER_ID] * len(pieces),
        "stream": [p[0] for p in pieces],
        "fragment_index": [p[2] for p in pieces],
    }
    return make_result(make_batch([p[3] for p in pieces], step_types, infos), task_id=2)


# Stream 10 cuts episode 0 after 3 steps; stream 11 ends episode 0 after one
# step and cuts episode 1 after two.
FIRST_WINDOW = ((10, 0, 0, 3), (11, 0, 0, 1), (11, 1, 0, 2))
FIRST_TYPES = (F, M, M, TERM, F, M)


def test_a_well_formed_fragment_window_passes() -> None:
    check_result(window(FIRST_WINDOW, FIRST_TYPES), fragment_task())


def test_a_stream_with_more_steps_than_the_fragment_length_fails() -> None:
    pieces = ((10, 0, 0, 3), (11, 0, 0, 1), (11, 1, 0, 3))
    message = failure_of(window(pieces, (*FIRST_TYPES, M)), fragment_task())
    assert "stream 11 has 4 steps in the window, expected fragment_length 3" in message


def test_a_window_missing_a_stream_fails() -> None:
    message = failure_of(window(((10, 0, 0, 3),), (F, M, M)), fragment_task())
    assert "the window covers streams [10], expected one piece or more of each" in message


def test_fragment_seeds_come_from_stream_seeds() -> None:
    result = window(FIRST_WINDOW, FIRST_TYPES)
    infos = dict(result.batch.episode_infos) | {"env_seed": np.array([1, 2, 3], dtype=np.int64)}
    broken = make_result(
        make_batch(result.header.lengths, FIRST_TYPES, {k: v.tolist() for k, v in infos.items()}),
        task_id=2,
    )
    assert "stream 10 episode 0: seeds (env, policy) are" in failure_of(broken, fragment_task())


def test_the_next_window_continues_each_stream() -> None:
    first = window(FIRST_WINDOW, FIRST_TYPES)
    _, last = continuity_problems({}, first)
    # Stream 10 goes on with episode 0 (fragment 1), stream 11 with episode 1.
    good = window(((10, 0, 1, 3), (11, 1, 1, 3)), (M, M, TERM, M, M, M))
    good_batch = EpisodeBatch(
        **{
            **good.batch.__dict__,
            "observations": np.concatenate(
                [first.batch.last_observations[[0]], good.batch.observations[1:]]
            ),
        }
    )
    problems, _ = continuity_problems(last, dataclasses.replace(good, batch=good_batch))
    assert problems == [
        "stream 11: the fragment continuing episode 1 does not start from the previous "
        "fragment's last observation"
    ]
    restarted = window(((10, 1, 0, 3), (11, 1, 1, 3)), (F, M, M, M, M, M))
    problems, _ = continuity_problems(last, restarted)
    assert problems[0] == (
        "stream 10 starts the window with episode 1 fragment 0, expected episode 0 fragment 1 "
        "(the previous window cut episode 0 at fragment 0)"
    )


# --- chunks --------------------------------------------------------------------------------


def chunk_messages(
    batch: EpisodeBatch, *, repeat_metadata: bool = False
) -> list[tuple[worker_pb2.EpisodeResult, Chunk]]:
    chunks = encode_batch_chunks(batch, 120, batch_id=3, include_env_spec=False)
    messages = []
    for chunk in chunks:
        result = worker_pb2.EpisodeResult(task_id=1)
        if chunk.index == 0 or repeat_metadata:
            result.episode_indices.extend([0, 1])
            result.lengths.extend(batch.lengths.tolist())
        messages.append((result, chunk))
    return messages


def test_chunks_in_order_reassemble_into_the_batch() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    messages = chunk_messages(batch)
    assert len(messages) > 2
    assembler = ResultAssembler(SPEC)
    outputs = [assembler.add(meta, chunk, 110) for meta, chunk in messages]
    assert outputs[:-1] == [None] * (len(messages) - 1)
    result = outputs[-1]
    assert result is not None
    assert result.header.episode_indices == (0, 1) and result.header.lengths == (3, 1)
    assert result.message_sizes == (110,) * len(messages)
    np.testing.assert_array_equal(result.batch.observations, batch.observations)


def test_chunks_out_of_order_fail() -> None:
    messages = chunk_messages(make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos()))
    assembler = ResultAssembler(SPEC)
    assembler.add(*messages[0])
    with pytest.raises(WireFormatError, match="chunk 1 of batch 3 missing"):
        assembler.add(*messages[2])
    assert not assembler.in_progress


def test_metadata_repeated_on_later_chunks_fails() -> None:
    batch = make_batch([3, 1], [F, M, TERM, TIME], good_episode_infos())
    assembler = ResultAssembler(SPEC)
    messages = chunk_messages(batch, repeat_metadata=True)
    assembler.add(*messages[0])
    with pytest.raises(ResultError, match="chunk 1 repeats episode_indices/lengths"):
        assembler.add(*messages[1])


# --- values against the spaces ---------------------------------------------------------------

SPACES = {
    "box": gym.spaces.Box(
        np.array([-1.0, -np.inf, 0.0], np.float32), np.array([1.0, np.inf, 5.0], np.float32)
    ),
    "discrete": gym.spaces.Discrete(3, start=-1),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 4]),
    "multi_binary": gym.spaces.MultiBinary(3),
    "int_box": gym.spaces.Box(10, 20, (2,), np.uint8),
    # A uint8 frame's 0..255 cannot be left; a narrower one can, per pixel too.
    "frames": gym.spaces.Box(0, 255, (2, 2, 2), np.uint8),
    "narrow_frames": gym.spaces.Box(0, 200, (2, 2), np.uint8),
    "per_pixel": gym.spaces.Box(
        np.array([0, 5], np.int16), np.array([10, np.iinfo(np.int16).max], np.int16)
    ),
}


def rows_within(space: gym.Space, rows: np.ndarray) -> list[bool]:
    """gymnasium's own verdict, one row at a time (the slow reference)."""
    return [bool(space.contains(row)) for row in rows]


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(SPACES)),
    seed=st.integers(0, 2**31 - 1),
    count=st.sampled_from([6, 3001]),
)
def test_observation_checks_agree_with_space_contains(name: str, seed: int, count: int) -> None:
    # Vectorised bounds, dtypes and integrality give gymnasium's verdict on
    # every row: values drawn around the bounds, some inside, some outside.
    # 3001 rows: short rows are compared many to a wide row, the rest alone.
    space = SPACES[name]
    rng = np.random.default_rng(seed)
    rows = np.stack([np.asarray(space.sample()) for _ in range(count)])
    if rng.random() < 0.6:  # nudge one value of one row, maybe out of the space
        where = (int(rng.integers(len(rows))), *(int(rng.integers(d)) for d in rows.shape[1:]))
        nudge = rng.normal(0, 1.5) if rows.dtype.kind == "f" else int(rng.integers(-2, 3))
        value = np.float64(rows[where]) + nudge  # no wrap-around before the cast
        rows[where] = np.asarray(value).astype(rows.dtype)
    spec = EnvSpec(space, gym.spaces.Discrete(2), 10)
    batch = make_spec_batch(spec, rows)
    expected_ok = all(rows_within(space, rows)) and all(rows_within(space, batch.last_observations))
    problems = value_problems(batch, spec)
    assert (problems == []) == expected_ok, (rows, problems)
    # The one-pass check's screen, worked out once per layout, says the same.
    screen = space_screen(space, rows.dtype, rows.shape[1:])
    assert (screen is None or screen(rows)) == all(rows_within(space, rows)), rows


@pytest.mark.parametrize("count", [2731, 8192, 21845])
def test_a_screen_compares_a_long_batch_of_short_rows_whole(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    # Rows of a few elements past 8,192 elements (a native worker's 8,192
    # CartPole steps are 32,768) are compared as one long row against the
    # bounds repeated once for the screen, not 85 rows at a time: the same
    # verdicts as the general check, wherever the value out of bounds lies.
    space = SPACES["box"]
    monkeypatch.setattr(space_checks, "_within", _not_row_by_row)
    screen = space_screen(space, np.dtype(np.float32), (3,))
    assert screen is not None
    rows = np.zeros((count, 3), np.float32)
    assert screen(rows)
    for row in (0, count // 2, count - 1):
        for column, value in ((0, -1.5), (2, 6.0), (1, 1e30)):
            rows[row, column] = value
            assert screen(rows) == (space_problem("observations", rows, space) is None)
            rows[row, column] = 0.0
    rows[count - 1, 0] = np.nan  # NaN passes the bounds, as in the general check
    assert screen(rows) and space_problem("observations", rows, space) is None


def _not_row_by_row(array: np.ndarray, **bounds: object) -> bool:
    raise AssertionError("the screen compared the batch rows at a time")


def make_spec_batch(spec: EnvSpec, observations: np.ndarray) -> EpisodeBatch:
    n = len(observations)
    space = spec.action_space
    actions = np.zeros(n, dtype=np.int64)
    if isinstance(space, gym.spaces.Box):
        actions = np.zeros((n, *space.shape), dtype=space.dtype)
    return EpisodeBatch(
        env_spec=spec,
        episode_infos={},
        observations=observations,
        last_observations=observations[:1],
        actions=actions,
        rewards=np.zeros(n),
        env_infos={},
        agent_infos={},
        step_types=np.array([F, *[M] * (n - 2), TERM], dtype=np.uint8),
        lengths=np.array([n]),
    )


@pytest.mark.parametrize(
    ("actions", "message"),
    [
        (np.array([0, 1, 2, 0, 1, 0]), "actions[2] holds 2, outside the space Discrete(2)"),
        (np.array([0, 1, -1, 0, 1, 0]), "actions[2] holds -1"),
        (np.array([0.0, 1.0, 0.5, 0, 1, 0]), "actions are float64; the discrete space"),
    ],
)
def test_discrete_actions_outside_the_space_are_named(actions: np.ndarray, message: str) -> None:
    spec = EnvSpec(SPACES["box"], gym.spaces.Discrete(2), 10)
    batch = dataclasses.replace(
        make_spec_batch(spec, np.zeros((6, 3), np.float32)), actions=actions
    )
    assert any(message in p for p in value_problems(batch, spec)), value_problems(batch, spec)


def test_float_box_actions_may_leave_the_box_but_must_be_finite() -> None:
    # Gaussian policies sample outside the box and the env clips.
    action_space = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
    spec = EnvSpec(SPACES["box"], action_space, 10)
    batch = make_spec_batch(spec, np.zeros((4, 3), np.float32))
    outside = dataclasses.replace(batch, actions=np.full((4, 1), 7.5, np.float32))
    assert value_problems(outside, spec) == []
    infinite = dataclasses.replace(batch, actions=np.full((4, 1), np.inf, np.float32))
    assert "actions[0] holds inf" in value_problems(infinite, spec)[0]


def test_flattened_dict_observations_are_checked_part_by_part() -> None:
    space = gym.spaces.Dict(
        {"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32), "mode": gym.spaces.Discrete(3)}
    )
    spec = EnvSpec(space, gym.spaces.Discrete(2), 10)
    good = np.stack([np.asarray(gym.spaces.flatten(space, space.sample())) for _ in range(4)])
    assert value_problems(make_spec_batch(spec, good.astype(np.float32)), spec) == []
    bad = good.astype(np.float32)
    bad[2, 0] = 0.5  # a one-hot entry of the Discrete part (flatten sorts keys: mode first)
    assert "observations[2] holds 0.5" in value_problems(make_spec_batch(spec, bad), spec)[0]


def test_nan_observations_pass_the_bounds_and_nan_rewards_do_not() -> None:
    spec = EnvSpec(SPACES["box"], gym.spaces.Discrete(2), 10)
    observations = np.zeros((4, 3), np.float32)
    observations[1, 0] = np.nan  # the worker's --nonfinite setting decides about these
    batch = make_spec_batch(spec, observations)
    assert value_problems(batch, spec) == []
    rewards = np.array([0.0, np.nan, 0.0, 0.0])
    assert value_problems(dataclasses.replace(batch, rewards=rewards), spec) == [
        "rewards hold NaN or inf at step 1"
    ]


class _CountedUfuncs(np.ndarray):
    """An array that records every ufunc numpy runs on it (a pass over its bytes)."""

    calls: ClassVar[list[str]] = []

    def __array_ufunc__(
        self, ufunc: np.ufunc, method: str, *inputs: object, **kw: object
    ) -> object:
        _CountedUfuncs.calls.append(ufunc.__name__)
        plain = [np.asarray(x) if isinstance(x, _CountedUfuncs) else x for x in inputs]
        return getattr(ufunc, method)(*plain, **kw)


def test_uint8_frames_of_a_0_to_255_box_skip_the_range_pass_but_not_the_dtype_check() -> None:
    # No uint8 value lies outside 0..255: the check that cannot fail is not
    # run over the frames' bytes; the dtype (and, at decode, the shape) still is.
    space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    spec = EnvSpec(space, gym.spaces.Discrete(6), 10)
    frames = np.full((3, 84, 84, 4), 255, np.uint8)
    _CountedUfuncs.calls = []
    assert space_problem("observations", frames.view(_CountedUfuncs), space) is None
    assert _CountedUfuncs.calls == []
    assert value_problems(make_spec_batch(spec, frames), spec) == []
    wide = frames.astype(np.int16)
    assert space_problem("observations", wide, space) == (
        f"observations are int16, the space {space} holds uint8"
    )
    with pytest.raises(ValueError, match="observations"):
        make_spec_batch(spec, np.zeros((3, 84, 84), np.uint8))


def test_a_narrower_uint8_box_still_refuses_the_values_it_leaves_out() -> None:
    space = SPACES["narrow_frames"]
    spec = EnvSpec(space, gym.spaces.Discrete(2), 10)
    frames = np.full((4, 2, 2), 200, np.uint8)
    assert value_problems(make_spec_batch(spec, frames), spec) == []
    frames[2, 1, 0] = 201
    assert value_problems(make_spec_batch(spec, frames), spec) == [
        f"observations[2] holds 201, outside the space {space}"
    ]


@pytest.mark.parametrize(
    ("count", "row"),
    [
        *((3000, row) for row in (0, 2974, 2975, 2999)),
        *((1, 0), (400, 399), (2730, 0), (2730, 2729), (2731, 2730)),
    ],
)
def test_a_value_out_of_per_element_bounds_is_found_in_any_row_of_a_long_batch(
    count: int, row: int
) -> None:
    # Bounds finite in some elements only (as CartPole's): 3,000 rows of 3
    # are compared 85 rows at a time, the last 25 alone; up to 2,730 rows
    # (8,190 elements) as one row against the bound repeated; the bad value
    # is found and named wherever it lies.
    space = SPACES["box"]
    rows = np.zeros((count, 3), np.float32)
    rows[row, 2] = 6.0
    assert space_problem("observations", rows, space) == (
        f"observations[{row}] holds 6.0, outside the space {space}"
    )
    rows[row, 2] = 5.0
    rows[row, 0] = -1.5
    assert space_problem("observations", rows, space) == (
        f"observations[{row}] holds -1.5, outside the space {space}"
    )
