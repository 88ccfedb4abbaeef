"""Fragment streams moving between workers: replays rebuild their episodes exactly.

Real VecWorkers, CartPole and an MLP policy; the coordinator's StreamBook
builds the replays from the delivered windows, as it does in the fleet
(the fleet-level tests with killed worker processes are in
test_faults_fragments.py).
"""

from __future__ import annotations

import itertools

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, EnvError, PolicyError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.protocol.stream_replay import StreamBook, StreamReplay
from rlfleet.worker import VecWorker
from tests.test_vec_worker import assert_same_batches

CARTPOLE = EnvConfig("CartPole-v1")
SEED = 5
LENGTH = 60  # CartPole episodes under a random-ish policy last ~20-60 steps: windows cut them
WORKER = ("episode_infos.worker",)


def mlp() -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(16,), seed=3)


def worker(n_envs: int = 2, number: int = 0, env: object = CARTPOLE) -> VecWorker:
    return VecWorker(n_envs=n_envs, env=env, policy=mlp(), worker_number=number)  # type: ignore[arg-type]


def windows(vec: VecWorker, count: int, **kwargs: object) -> list[EpisodeBatch]:
    return [vec.collect_fragments(LENGTH, base_seed=SEED, **kwargs) for _ in range(count)]  # type: ignore[arg-type]


def test_a_stream_taken_over_mid_episode_goes_on_bit_for_bit() -> None:
    undisturbed = windows(worker(), 4, first_stream=0)
    book = StreamBook()
    first = worker(number=0)
    for batch in windows(first, 2, first_stream=0):
        book.record(SEED, 1, batch)
    # Worker 1 is gone; worker 2 takes its streams over from what was delivered.
    replays = [book.replay(SEED, stream, 2) for stream in (0, 1)]
    assert all(r is not None and r.fragment_index > 0 for r in replays), replays
    second = worker(number=1)
    taken = [
        second.collect_fragments(LENGTH, base_seed=SEED, streams=[0, 1], replays=replays),  # type: ignore[arg-type]
        second.collect_fragments(LENGTH, base_seed=SEED, streams=[0, 1]),
    ]
    for got, want in zip(taken, undisturbed[2:], strict=True):
        assert_same_batches(got, want, ignore=WORKER)
    assert book.replay(SEED, 0, 2) is None  # worker 2 holds stream 0 now: nothing to send


def test_one_slot_runs_two_streams_by_turns_as_two_slots_would() -> None:
    both = windows(worker(), 3, first_stream=0)
    one = worker(n_envs=1)
    turns = [
        one.collect_fragments(LENGTH, base_seed=SEED, streams=[stream])
        for _, stream in itertools.product(range(3), (0, 1))
    ]
    for n, want in enumerate(both):
        got = EpisodeBatch.concatenate(turns[2 * n], turns[2 * n + 1])
        assert_same_batches(got, want, ignore=WORKER)


def test_a_replay_of_a_stream_that_has_not_begun_starts_its_next_episode() -> None:
    vec = worker(n_envs=1)
    batch = vec.collect_fragments(
        LENGTH, base_seed=SEED, streams=[7], replays=[StreamReplay(7, episode_index=3)]
    )
    assert batch.episode_infos["stream"].tolist()[0] == 7
    assert batch.episode_infos["episode_index"].tolist()[0] == 3
    assert batch.episode_infos["fragment_index"].tolist()[0] == 0


class _Unseeded(gym.Env):
    """Ignores reset's seed: its episodes cannot be rebuilt by replay."""

    _draws = itertools.count()
    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: object = None):
        super().reset(seed=seed)
        self._x = float(next(self._draws))
        return np.array([self._x], np.float32), {}

    def step(self, action):
        self._x += 1
        return np.array([self._x], np.float32), 1.0, False, False, {}


def test_an_env_that_does_not_replay_is_refused_with_an_error_naming_it() -> None:
    source = VecWorker(n_envs=1, env=_Unseeded)
    book = StreamBook()
    book.record(SEED, 1, source.collect_fragments(5, base_seed=SEED, first_stream=0))
    replay = book.replay(SEED, 0, 2)
    target = VecWorker(n_envs=1, env=_Unseeded)
    with pytest.raises(EnvError, match="not replayable"):
        target.collect_fragments(5, base_seed=SEED, streams=[0], replays=[replay])  # type: ignore[list-item]


def test_streams_are_checked() -> None:
    vec = worker()
    with pytest.raises(ConfigError, match="distinct"):
        vec.collect_fragments(3, base_seed=0, streams=[1, 1])
    with pytest.raises(ConfigError, match="distinct"):
        vec.collect_fragments(3, base_seed=0, streams=[1, 2, 3])
    with pytest.raises(ConfigError, match="not in streams"):
        vec.collect_fragments(3, base_seed=0, streams=[1], replays=[StreamReplay(2, 0)])


def test_an_episode_not_delivered_whole_is_not_replayed_but_its_stream_goes_on() -> None:
    import rlfleet.envs.testing  # noqa: F401  (registers the Counter env)

    vec = VecWorker(n_envs=1, env=EnvConfig("rlfleet/Counter-v0", {"length": 10}))
    # Windows of 4 over episodes of 10: w0 e0f0, w1 e0f1, w2 e0f2 + e1f0, w3 e1f1.
    w0, _, w2, w3 = (vec.collect_fragments(4, base_seed=SEED, first_stream=0) for _ in range(4))
    whole = StreamBook()
    for batch in (w0, w2):
        whole.record(SEED, 1, batch)
    replay = whole.replay(SEED, 0, 2)
    assert replay is not None and (replay.episode_index, replay.fragment_index) == (1, 1)
    gap = StreamBook()
    for batch in (w0, w3):  # episode 1 began in a window that never arrived
        gap.record(SEED, 1, batch)
    assert gap.replay(SEED, 0, 2) == StreamReplay(0, episode_index=2)


class _Remembering(MLPCategoricalPolicy):
    """Keeps state across steps (overrides reset): its draws cannot be replayed."""

    def reset(self, do_resets: object = None) -> None:
        pass


def test_a_stateful_policy_cannot_be_replayed_and_says_so() -> None:
    book = StreamBook()
    book.record(SEED, 1, worker(n_envs=1).collect_fragments(LENGTH, base_seed=SEED))
    replay = book.replay(SEED, 0, 2)
    assert replay is not None and replay.fragment_index > 0
    policy = _Remembering(CARTPOLE.env_spec(), hidden_sizes=(16,), seed=3)
    target = VecWorker(n_envs=1, env=CARTPOLE, policy=policy)
    with pytest.raises(PolicyError, match="keeps state"):
        target.collect_fragments(LENGTH, base_seed=SEED, streams=[0], replays=[replay])
