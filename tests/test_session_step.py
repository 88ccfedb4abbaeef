"""A worker session's hot path (rlfleet/worker/_stepping.py), and the benchmark that runs it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs)
from benchmarks.perenv_session import SessionLoop
from rlfleet.errors import EnvError
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._flush import FlushPolicy
from rlfleet.worker._stepping import SessionStep
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.vec import VecWorker


def test_a_failed_step_is_reported_and_its_finished_episodes_still_counted() -> None:
    """A step that raises (an env past its restart budget) is handed to the
    session's error handler, not raised, and the episodes that step finished
    still reach the flush decision: they hold the steps of a result."""
    made = 0

    def env() -> gym.Env:
        """Slot 0's env crashes at its second step, as slot 1's episode ends."""
        nonlocal made
        made += 1
        if made == 1:
            return gym.make("rlfleet/Crashing-v0", crash_at_step=2, length=3)
        return gym.make("rlfleet/Counter-v0", length=2)

    vec = VecWorker(n_envs=2, env=env, max_env_restarts=0)
    try:
        book = TaskBook(vec)
        book.add(
            EpisodeTask(task_id=1, request_id=1, agent_version=-1, env_generation=0),
            UnitColumns.seeded(0, 1, np.arange(6)),
        )
        errors: list[Exception] = []
        ticks = iter(range(1_000))
        stepper = SessionStep(
            book,
            vec,
            FlushPolicy(max_steps=2, max_bytes=1 << 20, max_seconds=100.0),
            errors.append,
            clock=lambda: float(next(ticks)),
        )
        answers = []
        while not errors:
            answers.append(stepper.step())
        assert isinstance(errors[0], EnvError)
        assert answers == [False, True]  # the second step failed, and ended an episode
        assert vec.finished_steps == 2 and vec.queued_count
    finally:
        vec.shutdown()


def test_the_benchmark_steps_through_the_sessions_own_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks.perenv_session`` measures the session's hot path itself:
    every vector step it takes is a ``SessionStep.step``."""
    calls = 0
    step = SessionStep.step

    def counted(self: SessionStep) -> bool:
        nonlocal calls
        calls += 1
        return step(self)

    monkeypatch.setattr(SessionStep, "step", counted)
    loop = SessionLoop("CartPole-v1", 8, 11e-6)
    vector_steps = 0
    vec_step = loop.vec.step

    def counted_vec_step() -> int:
        nonlocal vector_steps
        vector_steps += 1
        return vec_step()

    monkeypatch.setattr(loop.vec, "step", counted_vec_step)
    loop.run(2_000)
    assert calls == vector_steps > 0
    assert loop.stepped == loop.stepper.steps_total >= loop.sent_steps >= 2_000
