"""DummyVectorEnv and SubprocVectorEnv: tianshou's API, seeding, faults, cleanup.

The subprocess tests start real ``spawn`` children (about 0.3 s each), so
they are few and use two or three envs.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import cast

import gymnasium as gym
import numpy as np
import psutil
import pytest

from rlfleet.envs import BaseVectorEnv, DummyVectorEnv, EnvConfig, SubprocVectorEnv
from rlfleet.envs.batching import stack_batch
from rlfleet.envs.commands import FailedCall, run_command
from rlfleet.envs.testing import FRAME_SHAPE
from rlfleet.errors import ConfigError, EnvNotFoundError, UsageError, VectorEnvError

TESTING = ("rlfleet.envs.testing",)
CARTPOLE = EnvConfig("CartPole-v1")


def counter(length: int = 3, **kwargs: object) -> EnvConfig:
    return EnvConfig("rlfleet/Counter-v0", {"length": length, **kwargs}, imports=TESTING)


def crashing(**kwargs: object) -> EnvConfig:
    return EnvConfig("rlfleet/Crashing-v0", dict(kwargs), imports=TESTING)


def hanging(**kwargs: object) -> EnvConfig:
    return EnvConfig("rlfleet/Hanging-v0", dict(kwargs), imports=TESTING)


MakeVenv = Callable[..., BaseVectorEnv]


@pytest.fixture(params=[DummyVectorEnv, SubprocVectorEnv])
def make_venv(request: pytest.FixtureRequest) -> Iterator[MakeVenv]:
    """Builds vector envs of the parametrised class and closes them afterwards."""
    made: list[BaseVectorEnv] = []

    def make(env_fns: Sequence[Callable[[], gym.Env]], **kwargs: object) -> BaseVectorEnv:
        venv = request.param(env_fns, **kwargs)
        made.append(venv)
        return venv

    yield make
    for venv in made:
        venv.close()


def live_children() -> set[int | None]:
    """Pids of this process's live multiprocessing children (from any test)."""
    return {child.pid for child in multiprocessing.active_children()}


def assert_no_process_left(pids: Sequence[int], before: set[int | None]) -> None:
    """Checks that ``pids`` are reaped and no multiprocessing child was added."""
    assert live_children() <= before
    for pid in pids:
        assert not psutil.pid_exists(pid)


def reference_cartpole_run(
    seeds: Sequence[int], actions: np.ndarray
) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]]]:
    """What separate gymnasium envs give for the same seeds and actions.

    Returns:
        The stacked first observations, and per step the stacked
        (obs, reward, terminated, truncated), up to the first episode end.
    """
    envs = [CARTPOLE() for _ in seeds]
    first = np.stack([env.reset(seed=s)[0] for env, s in zip(envs, seeds, strict=True)])
    records = []
    for row in actions:
        steps = [env.step(int(a))[:4] for env, a in zip(envs, row, strict=True)]
        records.append(tuple(np.array(column) for column in zip(*steps, strict=True)))
        if any(terminated or truncated for _, _, terminated, truncated in steps):
            break  # no autoreset, like the vector envs
    for env in envs:
        env.close()
    return first, records


def first_observations(seeds: Sequence[int]) -> np.ndarray:
    return reference_cartpole_run(seeds, np.zeros((0, len(seeds))))[0]


# --- API, both classes -------------------------------------------------------


def test_reset_and_step_with_ids(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(), counter(), counter()])
    assert len(venv) == venv.env_num == 3
    assert venv.is_async is False
    obs, infos = venv.reset()
    assert obs.dtype == np.float32
    assert obs.tolist() == [[0.0], [0.0], [0.0]]
    assert [info["env_id"] for info in infos] == [0, 1, 2]
    assert infos.dtype == object and infos.shape == (3,)

    obs, rew, term, trunc, infos = venv.step(np.array([0, 1]), id=[2, 0])
    assert obs.tolist() == [[1.0], [1.0]]
    assert rew.dtype == np.float64 and rew.tolist() == [1.0, 1.0]
    assert term.tolist() == [False, False] and trunc.tolist() == [False, False]
    assert [info["env_id"] for info in infos] == [2, 0]

    venv.step([0], id=0)
    obs, _, term, _, _ = venv.step([0, 0, 0])
    assert obs.tolist() == [[3.0], [1.0], [2.0]]
    assert term.tolist() == [True, False, False]

    obs, infos = venv.reset(np.int64(0))
    assert obs.shape == (1, 1) and infos[0]["env_id"] == 0
    assert venv.step([1], id=0)[0].tolist() == [[1.0]]


def test_stepping_a_finished_env_raises(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(length=1), counter(length=2)])
    with pytest.raises(VectorEnvError, match=r"reset\(id=\[0, 1\]\)") as never_reset:
        venv.step([0, 0])
    assert never_reset.value.env_index == 0
    venv.reset()
    venv.step([0, 0])
    with pytest.raises(VectorEnvError, match="episode ended") as ended:
        venv.step([0, 0])
    assert ended.value.env_index == 0
    assert venv.step([0], id=1)[2].tolist() == [True]
    venv.reset(env_id=[0, 1])  # tianshou 1.x's name for id
    assert venv.step([0, 0])[0].tolist() == [[1.0], [1.0]]


def test_seed_reseeds_at_once_and_the_envs_step_right_after(make_venv: MakeVenv) -> None:
    """tianshou's seed(): each env is reset with its seed now (a gymnasium env
    has no seed() of its own), so it may be stepped without a reset()."""
    venv = make_venv([CARTPOLE, CARTPOLE, CARTPOLE])
    assert venv.seed(5) == [[5], [6], [7]]  # tianshou's answer
    _, steps = reference_cartpole_run([5, 6, 7], np.zeros((1, 3), dtype=np.int64))
    assert np.array_equal(venv.step([0, 0, 0])[0], steps[0][0])
    # The next reset without a seed continues each env's RNG.
    env = CARTPOLE()
    env.reset(seed=6)
    assert np.array_equal(venv.reset(id=1)[0][0], env.reset()[0])
    env.close()

    assert venv.seed([1, None, 3]) == [[1], [None], [3]]
    assert venv.seed(None) == [[None]] * 3
    # reset(seed=...) seeds as before; an int counts up along the ids.
    obs, _ = venv.reset(id=[2, 0], seed=20)
    assert np.array_equal(obs, first_observations([20, 21]))


def test_counter_reset_info_carries_the_seed(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(), counter()])
    _, infos = venv.reset(seed=11)
    assert [info["seed"] for info in infos] == [11, 12]
    _, infos = venv.reset(seed=[3, 4])
    assert [info["seed"] for info in infos] == [3, 4]


@pytest.mark.parametrize("seed", [-1, True, "7", [1, 2], [1, -2, 3], [1.5, 2, 3]], ids=repr)
def test_bad_seeds(seed: object) -> None:
    venv = DummyVectorEnv([counter(), counter(), counter()])
    with pytest.raises(ValueError, match="seed"):
        venv.seed(seed)  # type: ignore[arg-type]
    venv.close()


def test_render_returns_one_frame_per_env(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(render_mode="rgb_array"), counter(render_mode="rgb_array")])
    venv.reset()
    venv.step([0], id=1)
    frames = venv.render()
    assert [frame.shape for frame in frames] == [FRAME_SHAPE, FRAME_SHAPE]
    assert frames[0].max() == 0 and frames[1].min() == 1


def test_cartpole_renders_headless() -> None:
    pytest.importorskip("pygame", reason="CartPole's rgb_array rendering needs pygame")
    venv = DummyVectorEnv([EnvConfig("CartPole-v1", {"render_mode": "rgb_array"})])
    venv.reset(seed=0)
    (frame,) = venv.render()
    assert frame.shape == (400, 600, 3)
    venv.close()


def test_env_attributes(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(length=3), counter(length=3)])
    assert venv.get_env_attr("length") == [3, 3]
    venv.set_env_attr("length", 1, id=1)
    assert venv.get_env_attr("length", id=[1, 0]) == [1, 3]
    assert venv.observation_space == [gym.spaces.Box(0.0, 3.0, (1,), np.float32)] * 2
    assert venv.action_space == [gym.spaces.Discrete(2)] * 2
    venv.reset()
    assert venv.step([0, 0])[2].tolist() == [False, True]
    with pytest.raises(VectorEnvError, match="AttributeError") as missing:
        venv.get_env_attr("no_such_attribute", id=1)
    assert missing.value.env_index == 1


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        ([0, 0], ValueError, "distinct"),
        ([2], IndexError, "out of range"),
        ([1, -1], IndexError, "out of range"),
        (-1, IndexError, "out of range"),
        ([], ValueError, "1-D sequence"),
        ([True], ValueError, "1-D sequence"),
        ([[0]], ValueError, "1-D sequence"),
        (0.0, ValueError, "1-D sequence"),
    ],
)
def test_bad_ids(ids: object, error: type[Exception], message: str) -> None:
    venv = DummyVectorEnv([counter(), counter()])
    with pytest.raises(error, match=message):
        venv.reset(ids)  # type: ignore[arg-type]
    venv.close()


def test_action_rows_must_match_ids() -> None:
    venv = DummyVectorEnv([counter(), counter()])
    venv.reset()
    with pytest.raises(ValueError, match="3 rows but 2 envs"):
        venv.step([0, 0, 0])
    with pytest.raises(ValueError, match="without rows"):
        venv.step(0)
    venv.close()


def test_close_is_idempotent_and_final(make_venv: MakeVenv) -> None:
    venv = make_venv([counter()])
    venv.close()
    venv.close()
    assert venv.closed
    with pytest.raises(UsageError, match="closed"):
        venv.reset()


def test_crash_names_env_and_carries_traceback(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(), crashing(crash_at_step=2)])
    venv.reset()
    venv.step([0, 0])
    with pytest.raises(VectorEnvError) as crash:
        venv.step([0, 0])
    assert crash.value.env_index == 1
    text = str(crash.value)
    assert text.startswith("env 1: step() raised RuntimeError: rlfleet/Crashing-v0 crashed")
    assert "--- traceback in the env ---" in text
    assert 'testing.py", line' in text and "in _fault" in text
    # Every env of the failed call must be reset; afterwards they work again.
    with pytest.raises(VectorEnvError, match="reset first"):
        venv.step([0], id=0)
    obs, _ = venv.reset()
    assert venv.step([0, 0])[0].tolist() == [[1.0], [1.0]]
    assert obs.tolist() == [[0.0], [0.0]]


def test_crash_in_reset(make_venv: MakeVenv) -> None:
    venv = make_venv([crashing(crash_at_step=0, crash_in="reset")])
    with pytest.raises(VectorEnvError, match=r"env 0: reset\(\) raised RuntimeError"):
        venv.reset()


def test_factory_errors(make_venv: MakeVenv) -> None:
    with pytest.raises(EnvNotFoundError, match="Did you mean 'CartPole-v1'"):
        make_venv([CARTPOLE, EnvConfig("CartPol-v1")])
    with pytest.raises(
        VectorEnvError, match=r"env 1: make.*returned int, which is neither a gymnasium\.Env"
    ):
        make_venv([CARTPOLE, functools.partial(int, 3)])
    with pytest.raises(ConfigError, match="at least one"):
        make_venv([])
    with pytest.raises(ConfigError, match="not a callable"):
        make_venv(["CartPole-v1"])


def test_stack_batch_handles_dicts_tuples_and_ragged_rows() -> None:
    a = np.zeros(2, dtype=np.float32)
    batch = stack_batch([{"x": a, "t": (1, a)}, {"x": a + 1, "t": (2, a)}])
    assert batch["x"].tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert batch["t"][0].tolist() == [1, 2]
    assert batch["t"][1].shape == (2, 2)
    ragged = stack_batch([np.zeros(1), np.zeros(3)])
    assert ragged.dtype == object and [row.shape for row in ragged] == [(1,), (3,)]
    assert not np.shares_memory(stack_batch([a])[0], a)


# --- subprocesses ------------------------------------------------------------


def test_subproc_matches_dummy_and_gymnasium_on_cartpole() -> None:
    seeds = [3, 4]
    actions = np.random.default_rng(0).integers(0, 2, size=(40, 2))
    expected_first, expected_steps = reference_cartpole_run(seeds, actions)
    venvs = [
        DummyVectorEnv([CARTPOLE, CARTPOLE]),
        SubprocVectorEnv([CARTPOLE, CARTPOLE]),
        SubprocVectorEnv([CARTPOLE, CARTPOLE], shared_memory=False),
    ]
    for venv in venvs:
        obs, _ = venv.reset(seed=seeds)
        assert np.array_equal(obs, expected_first)
        for row, want in zip(actions, expected_steps, strict=False):
            got = venv.step(row)[:4]
            for got_column, want_column in zip(got, want, strict=True):
                assert np.array_equal(got_column, want_column)
        venv.close()
    assert len(expected_steps) > 5  # the episodes ran for a while before one ended


def test_subproc_observations_do_not_alias_shared_memory() -> None:
    venv = SubprocVectorEnv([counter(length=5)])
    first, _ = venv.reset()
    second = venv.step([0])[0]
    venv.step([0])
    assert first.tolist() == [[0.0]] and second.tolist() == [[1.0]]
    venv.close()


def test_subproc_hang_times_out_and_kills_the_child() -> None:
    before = live_children()
    venv = SubprocVectorEnv([counter(), hanging()], call_timeout=1.0)
    pids = venv.pids
    venv.reset()
    with pytest.raises(VectorEnvError, match=r"env 1: step\(\) did not return within 1 s") as hang:
        venv.step([0, 0])
    assert hang.value.env_index == 1
    assert not psutil.pid_exists(pids[1])
    with pytest.raises(VectorEnvError, match="process is gone") as gone:
        venv.reset(id=1)
    assert gone.value.env_index == 1
    # The healthy env keeps working once reset.
    assert venv.reset(id=0)[0].tolist() == [[0.0]]
    assert venv.step([0], id=0)[0].tolist() == [[1.0]]
    venv.close()
    assert_no_process_left(pids, before)


def test_subproc_killed_child_raises() -> None:
    before = live_children()
    venv = SubprocVectorEnv([counter(), counter()])
    pids = venv.pids
    venv.reset()
    os.kill(pids[0], signal.SIGKILL)
    with pytest.raises(VectorEnvError, match=r"env 0: .*died.*SIGKILL") as died:
        venv.step([0, 0])
    assert died.value.env_index == 0
    venv.close()
    assert_no_process_left(pids, before)


def test_subproc_close_and_garbage_collection_leave_no_process() -> None:
    before = live_children()
    venv = SubprocVectorEnv([counter(), counter()])
    pids = venv.pids
    assert all(psutil.pid_exists(pid) for pid in pids)
    venv.close()
    assert_no_process_left(pids, before)

    venv = SubprocVectorEnv([counter()])
    pids = venv.pids
    del venv
    gc.collect()
    assert_no_process_left(pids, before)


def test_subproc_failed_start_leaves_no_process() -> None:
    before = live_children()
    # Env 0 has started, env 1 fails, env 2 may still be starting: all must go.
    with pytest.raises(VectorEnvError, match=r"env 1: make\(\) raised ValueError: length"):
        SubprocVectorEnv([counter(), counter(length=0), counter()])
    assert_no_process_left([], before)


def test_subproc_takes_tianshous_lambdas() -> None:
    """The seed's own usage: lambdas and closures go to the children by cloudpickle."""
    task = "CartPole-v1"
    venv = SubprocVectorEnv([lambda: gym.make(task) for _ in range(2)])
    try:
        obs, _ = venv.reset(seed=[3, 4])
        np.testing.assert_array_equal(obs, first_observations([3, 4]))
    finally:
        venv.close()


def test_subproc_rejects_unpicklable_factories_and_fork() -> None:
    lock = threading.Lock()
    with pytest.raises(ConfigError, match=r"env factory 0 .*cannot be pickled.*lock"):
        SubprocVectorEnv([lambda: lock and gym.make("CartPole-v1")])
    with pytest.raises(ConfigError, match="fork"):
        SubprocVectorEnv([CARTPOLE], context="fork")
    with pytest.raises(ConfigError, match="call_timeout"):
        SubprocVectorEnv([CARTPOLE], call_timeout=0)
    with pytest.raises(ConfigError, match=r"wait_num=3\): give 1 to 2"):
        SubprocVectorEnv([CARTPOLE, CARTPOLE], wait_num=3)
    with pytest.raises(ConfigError, match=r"timeout=0\)"):
        DummyVectorEnv([CARTPOLE], timeout=0)


# --- tianshou's async mode (wait_num, timeout) ---------------------------------


def test_async_dummy_returns_every_env_it_stepped() -> None:
    venv = DummyVectorEnv([counter(), counter(), counter()], wait_num=1)
    assert venv.is_async and venv.wait_num == 1
    venv.reset()
    obs, _, _, _, infos = venv.step([0, 0], id=[2, 0])
    # Results come in env-index order, named by env_id.
    assert [info["env_id"] for info in infos] == [0, 2]
    assert obs.tolist() == [[1.0], [1.0]]
    with pytest.raises(UsageError, match="no env was stepped"):
        venv.step([], id=[])
    venv.close()


def test_async_subproc_returns_ready_envs_and_keeps_slow_ones_in_flight() -> None:
    before = live_children()
    # Env 1 sleeps forever in its first step: it never blocks env 0.
    venv = SubprocVectorEnv(
        [counter(length=10), hanging(length=10), counter(length=10)], wait_num=2, call_timeout=30
    )
    pids = venv.pids
    venv.reset()
    obs, rew, _, _, infos = venv.step([0, 0, 0])
    assert [info["env_id"] for info in infos] == [0, 2]
    assert obs.tolist() == [[1.0], [1.0]] and rew.tolist() == [1.0, 1.0]
    obs, _, _, _, infos = venv.step([0, 0], id=[2, 0])
    assert [info["env_id"] for info in infos] == [0, 2] and obs.tolist() == [[2.0], [2.0]]
    for call in (lambda: venv.reset(id=1), lambda: venv.step([0], id=1), venv.render):
        with pytest.raises(UsageError, match=r"envs \[1\] have a step in flight"):
            call()
    # An env with a step in flight can still be reset-free stepped by the others.
    assert venv.reset(id=0)[0].tolist() == [[0.0]]
    venv.close()  # a step still in flight does not hold up close
    assert_no_process_left(pids, before)


def test_async_timeout_returns_what_is_ready_and_deadline_fails_the_slow_env() -> None:
    venv = SubprocVectorEnv([counter(length=10), hanging(length=10)], timeout=0.2, call_timeout=3)
    assert venv.is_async and venv.wait_num == 2
    venv.reset()
    obs, _, _, _, infos = venv.step([0, 0])
    assert [info["env_id"] for info in infos] == [0]
    # Collecting only (each call returns after 0.2 s with nothing ready,
    # then waits for one env) until env 1 passes its call_timeout.
    with pytest.raises(VectorEnvError, match=r"env 1: step\(\) did not return within 3 s"):
        while True:
            venv.step([], id=[])
    obs, _, _, _, infos = venv.step([0], id=0)
    assert [info["env_id"] for info in infos] == [0] and obs.tolist() == [[2.0]]
    with pytest.raises(VectorEnvError, match="process is gone"):
        venv.reset(id=1)
    venv.close()


def test_async_failure_of_one_env_keeps_the_others_answers(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(), crashing(), counter()], wait_num=3)
    venv.reset()
    # wait_num == env_num and no timeout: synchronous, the first failure raises.
    assert venv.is_async is False
    with pytest.raises(VectorEnvError, match="env 1"):
        venv.step([0, 0, 0])
    async_venv = make_venv([counter(), crashing(), counter()], wait_num=1, timeout=30.0)
    async_venv.reset()
    collected: list[int] = []
    with pytest.raises(VectorEnvError, match="env 1: step"):
        collected += [info["env_id"] for info in async_venv.step([0, 0, 0])[4]]
        while True:
            collected += [info["env_id"] for info in async_venv.step([], id=[])[4]]
    while len(collected) < 2:
        collected += [info["env_id"] for info in async_venv.step([], id=[])[4]]
    assert sorted(collected) == [0, 2]
    with pytest.raises(UsageError, match="no env was stepped"):
        async_venv.step([], id=[])


class ThreadVectorEnv(BaseVectorEnv):
    """A user's own backend: each env steps on a thread (the subclassing contract)."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], wait_num: int) -> None:
        self.envs = [fn() for fn in env_fns]
        self.pool = ThreadPoolExecutor(len(self.envs))
        self.futures: dict[int, Future[object]] = {}
        pool = self.pool

        def release() -> list[BaseException]:
            pool.shutdown(wait=False, cancel_futures=True)
            return []

        super().__init__(len(self.envs), release, wait_num=wait_num)

    def _send(self, ids: list[int], command: str, args: Sequence[object]) -> None:
        for i, arg in zip(ids, args, strict=True):
            self.futures[i] = self.pool.submit(run_command, self.envs[i], command, arg)

    def _receive(self, ids: list[int], count: int, timeout: float | None) -> dict[int, object]:
        pending = {self.futures[i] for i in ids}
        answers: dict[int, object] = {}
        while len(answers) < count:
            done, pending = wait(pending, timeout, return_when=FIRST_COMPLETED)
            if not done:
                break
            for i in ids:
                future = self.futures.get(i)
                if future in done:
                    del self.futures[i]
                    error = future.exception()
                    answers[i] = (
                        future.result() if error is None else FailedCall(cast(Exception, error))
                    )
        return answers


def test_a_subclass_gets_the_whole_api_from_two_methods() -> None:
    # Env 2 sleeps 2 s in its first step (a thread cannot be killed: not forever).
    venv = ThreadVectorEnv(
        [counter(), counter(length=1), hanging(length=10, hang_seconds=2.0)], wait_num=2
    )
    assert isinstance(venv, BaseVectorEnv) and len(venv) == 3
    assert venv.seed(7) == [[7], [8], [9]]
    _, infos = venv.reset(id=[0, 1], seed=7)
    assert [info["seed"] for info in infos] == [7, 8]
    venv.reset(id=2)
    _, _, term, _, infos = venv.step([0, 0, 0])
    assert [info["env_id"] for info in infos] == [0, 1] and term.tolist() == [False, True]
    with pytest.raises(VectorEnvError, match=r"cannot step envs \[1\]"):
        venv.step([0], id=1)
    assert venv.get_env_attr("length", id=[0, 1]) == [3, 1]
    venv.close()


class InterruptedCallError(Exception):
    """Raised by a SIGALRM handler: stands in for Ctrl-C during a call."""


def test_an_interrupted_step_leaves_no_stale_answer_behind() -> None:
    venv = SubprocVectorEnv([counter(length=10), hanging(length=10, hang_seconds=1.0)])

    def interrupt(signum: int, frame: object) -> None:
        raise InterruptedCallError

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        venv.reset()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(InterruptedCallError):
            venv.step([0, 0])
        # Env 1's late answer to the interrupted step is discarded, not read
        # as the answer to reset; both envs must be reset before stepping.
        with pytest.raises(VectorEnvError, match="must be reset first"):
            venv.step([0, 0])
        obs, infos = venv.reset(seed=[1, 2])
        assert obs.tolist() == [[0.0], [0.0]] and [i["seed"] for i in infos] == [1, 2]
        assert venv.step([0, 0])[0].tolist() == [[1.0], [1.0]]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        venv.close()


def test_step_and_reset_in_one_round(make_venv: MakeVenv) -> None:
    venv = make_venv([counter(length=1), counter(), counter()])
    venv.reset()
    _, _, term, _, _ = venv.step([0, 0, 0])
    assert term.tolist() == [True, False, False]
    (obs, rew, term, _, infos), (first, reset_infos) = venv.step_and_reset(
        [0, 0], [2, 1], [0], seed=[9]
    )
    assert obs.tolist() == [[2.0], [2.0]] and rew.tolist() == [1.0, 1.0]
    assert [info["env_id"] for info in infos] == [2, 1]
    assert first.tolist() == [[0.0]] and reset_infos[0] == {"seed": 9, "env_id": 0}
    # Either side may be empty.
    (obs, *_), (first, _) = venv.step_and_reset([0], [0], [])
    assert obs.tolist() == [[1.0]] and first.size == 0
    with pytest.raises(ValueError, match=r"envs \[1\] are both stepped and reset"):
        venv.step_and_reset([0], [1], [1])
    with pytest.raises(UsageError, match="sync mode"):
        DummyVectorEnv([counter()] * 2, wait_num=1).step_and_reset([0], [0], [1])


# --- a worker's engine primitives: reset_env, step_envs, rebuild_env ---------------


def test_step_envs_returns_rows_and_failures_without_raising(make_venv: MakeVenv) -> None:
    # Env 1 raises in its 2nd step; the others' rows come back with the failure.
    venv = make_venv([counter(length=2), crashing(crash_at_step=2), counter(length=4)])
    assert [venv.reset_env(i, seed=i) for i in (2, 0, 1)] == [[0.0], [0.0], [0.0]]
    observations, rewards, ended, infos, failures = venv.step_envs([2, 1, 0], [0, 0, 0])
    assert np.asarray(observations).tolist() == [[1.0], [1.0], [1.0]] and rewards == [1.0] * 3
    assert ended == [] and failures == []
    observations, rewards, ended, infos, failures = venv.step_envs([0, 1, 2], [0, 0, 0])
    assert [np.asarray(o).tolist() for o in (observations[0], observations[2])] == [[2.0], [2.0]]
    assert observations[1] is None and rewards == [1.0, 0.0, 1.0]
    assert ended == [(0, True, False)]  # (env, terminated, truncated)
    assert [(env, type(error).__name__) for env, error in failures] == [
        (1, "RuntimeError" if isinstance(venv, DummyVectorEnv) else "VectorEnvError")
    ]
    assert "crashed on purpose" in str(failures[0][1])
    assert infos == []  # the counter's step info is empty
    # The engine primitives leave tianshou's bookkeeping alone: step() wants a reset().
    with pytest.raises(VectorEnvError, match="must be reset first"):
        venv.step([0], id=2)


def test_reset_env_seeds_one_env_as_gymnasium_does(make_venv: MakeVenv) -> None:
    venv = make_venv([CARTPOLE, CARTPOLE])
    got = np.stack([venv.reset_env(1, seed=5), venv.reset_env(0, seed=4)])
    np.testing.assert_array_equal(got, first_observations([5, 4]))


def env_identity(venv: BaseVectorEnv, index: int) -> int:
    """The child's pid, or the env object's id."""
    if isinstance(venv, SubprocVectorEnv):
        return venv.pids[index]
    assert isinstance(venv, DummyVectorEnv)
    return id(venv.envs[index])


def test_rebuild_env_replaces_a_crashed_env(make_venv: MakeVenv) -> None:
    venv = make_venv([crashing(crash_at_step=1), counter()])
    venv.reset_env(0, seed=0)
    assert venv.step_envs([0], [0])[4][0][0] == 0  # env 0 failed
    before = env_identity(venv, 0)
    venv.rebuild_env(0)
    assert env_identity(venv, 0) != before
    venv.reset_env(0, seed=0)  # a new env: fresh, its crash one step away again
    assert venv.step_envs([0], [0])[4][0][0] == 0


def test_a_killed_child_is_a_failure_of_step_envs_and_rebuild_env_restarts_it() -> None:
    venv = SubprocVectorEnv([counter(), counter()])
    with venv:
        venv.reset_env(0, seed=0)
        venv.reset_env(1, seed=0)
        os.kill(venv.pids[1], signal.SIGKILL)
        observations, _, _, _, failures = venv.step_envs([0, 1], [0, 0])
        assert np.asarray(observations[0]).tolist() == [1.0] and observations[1] is None
        assert [env for env, _ in failures] == [1]
        assert "killed by SIGKILL" in str(failures[0][1])
        victim = venv.pids[1]
        venv.rebuild_env(1)
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == "zombie"
        assert venv.reset_env(1, seed=0).tolist() == [0.0]
        assert np.asarray(venv.step_envs([1], [0])[0][0]).tolist() == [1.0]


def test_a_subclass_gets_reset_env_and_step_envs_but_no_rebuild() -> None:
    venv = ThreadVectorEnv([counter(), crashing(crash_at_step=1)], wait_num=2)
    try:
        assert venv.reset_env(0, seed=1).tolist() == [0.0]
        venv.reset_env(1, seed=1)
        observations, _, _, _, failures = venv.step_envs([0, 1], [0, 0])
        assert np.asarray(observations[0]).tolist() == [1.0] and [e for e, _ in failures] == [1]
        with pytest.raises(UsageError, match="cannot rebuild one env"):
            venv.rebuild_env(1)
    finally:
        venv.close()
