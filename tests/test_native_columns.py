"""A native worker's step columns and its episode splitter (rlfleet/worker/_native_columns.py).

The splitter is checked against the per-episode path it replaces: the same
random done masks over a ring of random steps give, gathered as rows in
one go, exactly the batch that slicing each episode out of the ring and
joining the slices gives (``build_batch`` of ``StepRing.segment_steps``).
The worker-level tests run real native CartPole envs (gymnasium's vector
entry point) whose observations turn NaN or leave their space.
"""

from __future__ import annotations

import gc
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

from rlfleet.core import EpisodeBatch, StepType
from rlfleet.core._pieces import RowPieces
from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import EnvError
from rlfleet.policies import MLPCategoricalPolicy, RandomPolicy
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import serialize_batch_messages
from rlfleet.worker import EpisodeUnit, VecWorker
from rlfleet.worker._checks import SuspectRows
from rlfleet.worker._episode_buffer import (
    EPISODE_INFO_KEYS,
    MIN_PIECE_BYTES,
    Columns,
    Segment,
    StepRing,
    build_batch,
)
from rlfleet.worker._native_columns import (
    RowsPart,
    build_rows_batch,
    build_rows_pieces,
)
from rlfleet.worker._segments import Live
from tests.native_columns_reference import split_rows, step_types_of

LIMIT = 40
SPEC = EnvSpec(gym.spaces.Box(-10.0, 10.0, (3,), np.float32), gym.spaces.Discrete(4), LIMIT)


class Span(NamedTuple):
    """A finished episode, as the test describes it: where its steps are in a ring."""

    key: tuple[int, int]
    infos: tuple[int, ...]
    slot: int
    start: int
    length: int
    last: int
    columns: Columns


def parts_of(spans: list[Span]) -> list[RowsPart]:
    """The spans as the worker's finished-episode rows, in runs of one ring's arrays."""
    parts: list[RowsPart] = []
    for span in spans:
        row = [span.start, span.length, span.slot, span.last, *span.infos, span.key[0]]
        if parts and parts[-1][0] is span.columns:
            parts[-1] = (span.columns, np.vstack([parts[-1][1], [row]]))
        else:
            parts.append((span.columns, np.array([row], dtype=np.int64)))
    return parts


def random_ring(
    rng: np.random.Generator, n_slots: int, capacity: int, first_step: int, steps: int
) -> StepRing:
    """A row-major ring whose rows of steps ``first_step ..`` hold random values."""
    ring = StepRing(n_slots, (3,), np.dtype(np.float32), capacity)
    for s in range(first_step, first_step + steps):
        row = s % capacity
        actions = rng.integers(0, 4, n_slots)
        infos = {"log_prob": rng.standard_normal(n_slots).astype(np.float32)}
        ring.put_policy_outputs(row, None, actions, infos)
        observations: Any = rng.uniform(-9, 9, (n_slots, 3))
        rewards: Any = rng.standard_normal(n_slots)
        ring.put_env_outputs(row, None, observations, rewards)
    return ring


def random_spans(
    rng: np.random.Generator, ring: StepRing, first_step: int, steps: int
) -> list[Span]:
    """Episodes ended by random done masks, one slot's episodes back to back."""
    spans: list[Span] = []
    for slot in range(ring.n_envs):
        start = first_step + int(rng.integers(0, 3))
        # Per step, each running episode ends with probability 0.2.
        done = rng.random(steps) < 0.2
        for s in range(start, first_step + steps - 1):
            if s >= start and done[s - first_step]:
                last = int(StepType.TERMINAL if rng.random() < 0.5 else StepType.TIMEOUT)
                index = len(spans)
                infos = (0, -1, -1, index, 7)
                spans.append(
                    Span((0, index), infos, slot, start, s - start + 1, last, ring.columns)
                )
                start = s + 2  # the autoreset step lies between two episodes
    order = rng.permutation(len(spans))
    return [spans[i] for i in order]


def per_episode_batch(ring: StepRing, spans: list[Span]) -> EpisodeBatch:
    """The batch the per-episode path makes: each episode's slices, joined."""
    segments = []
    for span in spans:
        obs, actions, rewards, agent_infos = ring.segment_steps(span.start, span.length, span.slot)
        segments.append(
            Segment(
                key=span.key,
                infos=span.infos,
                observations=obs[:-1],
                last_observation=obs[-1].copy(),
                actions=actions,
                rewards=rewards,
                agent_infos=agent_infos,
                env_infos={},
                first=True,
                last=span.last,
                env_spec=SPEC,
            )
        )
    return build_batch(SPEC, segments, EPISODE_INFO_KEYS, from_ring=True, actions_checked=True)


@pytest.mark.parametrize("seed", range(12))
def test_gathered_spans_equal_the_joined_per_episode_slices(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n_slots, capacity, steps = int(rng.integers(1, 9)), 64, 60
    # Seeds 0-5 start at step 0; the others so late that rows wrap around the ring's end.
    first_step = 0 if seed < 6 else int(rng.integers(1, 10_000)) * capacity - 30
    ring = random_ring(rng, n_slots, capacity, first_step, steps)
    spans = random_spans(rng, ring, first_step, steps)
    if not spans:
        return
    expected = per_episode_batch(ring, spans)
    gathered = build_rows_batch(SPEC, parts_of(spans), EPISODE_INFO_KEYS, actions_checked=True)
    assert gathered == expected
    for name in ("observations", "actions", "rewards", "step_types", "last_observations"):
        array = getattr(gathered, name)
        assert array.flags["C_CONTIGUOUS"] and array.dtype == getattr(expected, name).dtype
    # The pieces a remote worker serializes make the same messages' bytes,
    # columns gathered or handed over as each episode's rows in the ring.
    for least in (0, MIN_PIECE_BYTES, 1 << 30):
        pieces = build_rows_pieces(
            SPEC, parts_of(spans), EPISODE_INFO_KEYS, actions_checked=False, min_piece_bytes=least
        )
        assert isinstance(pieces.observations, RowPieces) == (least == 0)
        assert isinstance(pieces.rewards, RowPieces) == (least == 0)
        assert messages(pieces) == messages(expected)


def envelope(index: int) -> worker_pb2.WorkerMessage:
    return worker_pb2.WorkerMessage(result=worker_pb2.EpisodeResult(task_id=9))


def messages(batch: Any) -> list[bytes]:
    encoded, _ = serialize_batch_messages(
        batch, envelope, _rpc.WORKER_CHUNK_PATH, max_bytes=300, include_env_spec=False
    )
    return encoded


def test_split_rows_lists_each_episodes_steps_in_order() -> None:
    starts = np.array([5, 62, 0], dtype=np.int64)
    lengths = np.array([2, 4, 1], dtype=np.int64)
    slots = np.array([3, 1, 0], dtype=np.int64)
    index = split_rows(starts, lengths, slots, capacity=64)
    cols, rows = np.divmod(index, 64)  # the ring is stored slot by slot
    assert rows.tolist() == [5, 6, 62, 63, 0, 1, 0]
    assert cols.tolist() == [3, 3, 1, 1, 1, 1, 0]


def test_step_types_mark_first_and_last_steps_and_one_step_episodes_take_their_last() -> None:
    lengths = np.array([3, 1, 2])
    lasts = np.array([int(StepType.TERMINAL), int(StepType.TIMEOUT), int(StepType.TERMINAL)])
    first, mid = int(StepType.FIRST), int(StepType.MID)
    terminal, timeout = int(StepType.TERMINAL), int(StepType.TIMEOUT)
    assert step_types_of(lengths, lasts).tolist() == [
        first, mid, terminal, timeout, first, terminal
    ]  # fmt: skip


def test_spans_of_two_ring_generations_join_in_order() -> None:
    """A take may hold spans of arrays the ring left behind (it grew, or the policy changed)."""
    rng = np.random.default_rng(3)
    old = random_ring(rng, 4, 64, 0, 30)
    new = random_ring(rng, 4, 64, 0, 30)
    spans = random_spans(rng, old, 0, 30)[:5] + random_spans(rng, new, 0, 30)[:5]
    gathered = build_rows_batch(SPEC, parts_of(spans), EPISODE_INFO_KEYS, actions_checked=True)
    expected = EpisodeBatch.concatenate(
        per_episode_batch(old, spans[:5]), per_episode_batch(new, spans[5:])
    )
    assert gathered == expected


@pytest.mark.parametrize("nonfinite", [True, False])
def test_suspect_rows_find_every_row_the_exact_checks_may_refuse(nonfinite: bool) -> None:
    spaces: list[gym.spaces.Box] = [
        gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32),  # symmetric: one comparison
        gym.spaces.Box(np.array([0.0, -np.inf]), np.array([1.0, 5.0]), dtype=np.float64),
        gym.spaces.Box(0, 255, (4,), np.uint8),  # integer: the dtype's range is the space
    ]
    for space in spaces:
        check = SuspectRows(space, nonfinite=nonfinite)
        rows = np.stack([space.sample() for _ in range(32)])
        assert check(rows) is None
        # A whole segment, of any length, in one call.
        assert all(check.all_pass(rows[:length]) for length in (1, 7, 32))
        if rows.dtype.kind != "f":
            continue
        bad = rows.copy()
        flat = bad.reshape(32, -1)
        flat[3, 0] = 7.0  # outside
        flat[9, -1] = np.nan
        flat[20, 0] = -np.inf
        suspect = check(bad)
        assert suspect is not None
        # Outside rows always; NaN and inf rows in any mode (the exact check
        # lets them through unless they are errors).
        assert set(np.flatnonzero(suspect).tolist()) == {3, 9, 20}
        for row in (3, 9, 20):
            assert not check.all_pass(bad[row : row + 5]) and check.all_pass(bad[row + 1 : row + 5])


# --- a VecWorker on native envs whose observations go wrong ---------------------------


def mlp() -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(EnvConfig("CartPole-v1").env_spec(), hidden_sizes=(8,), seed=0)


def units(count: int, start: int = 0) -> list[EpisodeUnit]:
    return [EpisodeUnit(i, 1000 + i, 2000 + i) for i in range(start, start + count)]


class _NanAtStep3(CartPoleVectorEnv):
    """CartPole's native vector env whose env 2 observes NaN at every 3rd step."""

    calls = 0

    def step(self, action: Any) -> Any:
        observations, *rest = super().step(action)
        self.calls += 1
        if self.calls % 3 == 0:
            observations = observations.copy()
            observations[2, 1] = np.nan
        return observations, *rest


class _LeavesItsSpace(CartPoleVectorEnv):
    """CartPole's native vector env whose env 1 reports x = 100 at its 4th step."""

    calls = 0

    def step(self, action: Any) -> Any:
        observations, *rest = super().step(action)
        self.calls += 1
        if self.calls == 4:
            observations = observations.copy()
            observations[1, 0] = 100.0
        return observations, *rest


for _name, _cls in (("NanAtStep3", _NanAtStep3), ("LeavesItsSpace", _LeavesItsSpace)):
    gym.register(
        f"rlfleet-test/{_name}-v0",
        entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
        vector_entry_point=f"tests.test_native_columns:{_cls.__name__}",
        max_episode_steps=LIMIT,
    )


def native_worker(env_id: str, nan_observations: Any = "error", policy: Any = None) -> VecWorker:
    config = EnvConfig(env_id, vectorization="vector_entry_point")
    policy = mlp() if policy is None else policy
    return VecWorker(n_envs=4, env=config, policy=policy, nan_observations=nan_observations)


def test_flag_mode_flags_the_steps_next_to_a_nan_observation() -> None:
    # Random actions: an MLP refuses NaN observations (a PolicyError).
    worker = native_worker(
        "rlfleet-test/NanAtStep3-v0",
        "flag",
        RandomPolicy(EnvConfig("CartPole-v1").env_spec(), seed=0),
    )
    try:
        batch = worker.run(units(12))
    finally:
        worker.shutdown()
    flags = batch.env_infos["nonfinite_obs"]
    assert flags.dtype == bool and flags.any()
    # Per episode: step t is flagged iff observation t or t + 1 (the last one
    # for the last step) holds a NaN.
    start = 0
    for i, length in enumerate(batch.lengths.tolist()):
        obs = np.concatenate(
            [batch.observations[start : start + length], batch.last_observations[i : i + 1]]
        )
        bad = ~np.isfinite(obs).all(axis=1)
        assert flags[start : start + length].tolist() == (bad[:-1] | bad[1:]).tolist()
        start += length


def test_an_observation_outside_the_space_drops_its_episode_and_the_worker_goes_on() -> None:
    worker = native_worker("rlfleet-test/LeavesItsSpace-v0")
    try:
        worker.submit(units(4))
        with pytest.raises(EnvError, match=r"left its observation space in episode 1: the "
                           r"observation of step 4 holds 100\.0") as info:  # fmt: skip
            while not worker.idle:
                worker.step()
        assert info.value.env_index == 1 and info.value.episode_index == 1
        while not worker.idle:
            worker.step()
        batch = worker.take_finished()
        assert batch is not None
        assert sorted(batch.episode_infos["episode_index"].tolist()) == [0, 2, 3]
        # The worker goes on with whole, checked episodes.
        more = worker.run(units(8, start=4))
        assert more.episode_infos["episode_index"].tolist() == list(range(4, 12))
        assert np.abs(more.observations[:, 0]).max() <= 4.8
    finally:
        worker.shutdown()


def test_an_agent_update_keeps_the_finished_episodes_bit_for_bit() -> None:
    """The new policy's outputs move the ring to new arrays; earlier spans keep theirs."""

    def sample(take_before_update: bool) -> tuple[EpisodeBatch | None, EpisodeBatch]:
        worker = native_worker("CartPole-v1")
        try:
            worker.submit(units(4))
            while worker.finished_count < 2:
                worker.step()
            early = worker.take_finished() if take_before_update else None
            worker.update_agent(mlp())  # aborts and re-queues the running episodes
            while not worker.idle:
                worker.step()
            rest = worker.take_finished()
            assert rest is not None
            return early, rest
        finally:
            worker.shutdown()

    early, _ = sample(True)
    _, everything = sample(False)
    assert early is not None and early.n_episodes >= 2
    versions = everything.episode_infos["agent_version"].tolist()
    assert everything.n_episodes == 4 and versions.count(0) == early.n_episodes
    before = [e for e in everything.split() if e.episode_infos["agent_version"][0] == 0]
    assert EpisodeBatch.concatenate(*before) == early


def test_episodes_taken_late_equal_episodes_taken_as_they_end() -> None:
    """Untaken episodes pin their rows while the ring grows and the env is reset whole.

    One worker takes after every step; the other takes once at the end,
    its ring having grown several times, and its env reset as a whole
    between rounds (the reset writes the row after the last episodes'
    last observations).
    """

    def sample(take_each_step: bool) -> EpisodeBatch:
        worker = native_worker("CartPole-v1")
        taken: list[EpisodeBatch] = []
        try:
            for round_ in range(3):  # each round ends with no slot running
                worker.submit(units(40, start=40 * round_))
                while not worker.idle:
                    worker.step()
                    if take_each_step and (batch := worker.take_finished()) is not None:
                        taken.append(batch)
            if not take_each_step:
                ring = worker._engine.ring
                assert ring is not None and ring.capacity > 64  # it grew
                batch = worker.take_finished()
                assert batch is not None
                taken.append(batch)
        finally:
            worker.shutdown()
        joined = EpisodeBatch.concatenate(*taken)
        order = np.argsort(joined.episode_infos["episode_index"], kind="stable")
        return EpisodeBatch.concatenate(*[joined.split()[i] for i in order])

    late, early = sample(False), sample(True)
    assert late.n_episodes == 120
    assert late == early


def tracked_objects() -> int:
    """Objects the garbage collector tracks, but the queued units (started ones are freed)."""
    gc.collect()
    return sum(not isinstance(thing, EpisodeUnit) for thing in gc.get_objects())


def test_a_native_worker_keeps_no_object_per_finished_episode() -> None:
    """Finished episodes wait as rows of ints: the objects the collector tracks stay level.

    Each finished episode used to wait as an object (with a tuple of its row
    and a weak reference pinning the ring): hundreds of episodes made
    hundreds of objects more.
    """
    worker = native_worker(
        "CartPole-v1", policy=RandomPolicy(EnvConfig("CartPole-v1").env_spec(), seed=0)
    )
    try:
        worker.submit(units(8))
        while not worker.idle:
            worker.step()
        worker.take_finished()
        worker.submit(units(400, start=8))
        before = tracked_objects()
        while not worker.idle:
            worker.step()
        grown = tracked_objects() - before
        assert worker.finished_count == 400
        assert grown < 100, f"{grown} more objects for 400 finished episodes"
        batch = worker.take_finished()
        assert batch is not None
        assert batch.episode_infos["episode_index"].tolist() == list(range(8, 408))
    finally:
        worker.shutdown()


def test_rows_taken_by_request_and_count_and_cancelled_leave_the_rest_in_order() -> None:
    worker = native_worker(
        "CartPole-v1", policy=RandomPolicy(EnvConfig("CartPole-v1").env_spec(), seed=0)
    )
    try:
        worker.submit([*units(6), *[EpisodeUnit(u.episode_index, u.env_seed, u.policy_seed, 1)
                                    for u in units(6, start=6)]])  # fmt: skip
        while not worker.idle:
            worker.step()
        assert worker.cancel([2, 7]) == [2, 7]
        first = worker.take_finished(3, request=1)
        assert first is not None
        assert first.episode_infos["episode_index"].tolist() == [6, 8, 9]
        steps = worker.finished_steps
        rest = worker.take_finished()
        assert rest is not None and rest.total_steps == steps
        assert rest.episode_infos["episode_index"].tolist() == [0, 1, 3, 4, 5, 10, 11]
        assert worker.finished_count == 0 and worker.finished_steps == 0
    finally:
        worker.shutdown()


def test_a_request_taken_whole_leaves_the_other_requests_episodes() -> None:
    """Taking one request's episodes, no count given, takes none of another's,
    whether both requests' episodes are held or only its own."""
    worker = native_worker(
        "CartPole-v1", policy=RandomPolicy(EnvConfig("CartPole-v1").env_spec(), seed=0)
    )
    try:
        worker.submit([*units(4), *[EpisodeUnit(u.episode_index, u.env_seed, u.policy_seed, 1)
                                    for u in units(4, start=4)]])  # fmt: skip
        while not worker.idle:
            worker.step()
        steps = worker.finished_steps
        first = worker.take_finished(request=1)
        assert first is not None
        assert first.episode_infos["episode_index"].tolist() == [4, 5, 6, 7]
        assert worker.finished_count == 4
        assert worker.finished_steps == steps - first.total_steps
        assert worker.take_finished(request=1) is None
        rest = worker.take_finished(request=0)
        assert rest is not None and rest.total_steps == steps - first.total_steps
        assert rest.episode_infos["episode_index"].tolist() == [0, 1, 2, 3]
        assert worker.finished_count == 0 and worker.finished_steps == 0
    finally:
        worker.shutdown()


def test_a_native_worker_starts_and_ends_episodes_without_a_live_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A running native episode is its slot's entries in the engine's lists, no ``Live``."""
    made = []
    original = Live.__init__

    def counted(self: Live, *args: Any, **kwargs: Any) -> None:
        made.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(Live, "__init__", counted)
    worker = native_worker("CartPole-v1")
    try:
        batch = worker.run(units(100))
    finally:
        worker.shutdown()
    assert batch.episode_infos["episode_index"].tolist() == list(range(100))
    assert set(batch.episode_infos["agent_version"].tolist()) == {0}
    assert not made, f"{len(made)} Live records for 100 episodes"
