"""The synchronous sample-update loop (garage's ``Trainer.train``, reduced).

Each iteration pushes the learner's current parameters with the sampling
request (``obtain_samples(itr, n, agent_update=params)``), so the batch is
on-policy by construction, then trains on it. The loop stops when the
batch's average return reaches a target or a step or iteration budget runs
out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rlfleet._util.values import check_int
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError
from rlfleet.learners._advantages import undiscounted_returns


class Sampler(Protocol):
    """garage's Sampler contract, as far as the loop uses it."""

    def obtain_samples(
        self, itr: int, num_samples: int, agent_update: Any = None, env_update: Any = None
    ) -> EpisodeBatch:
        """Returns complete episodes totalling at least ``num_samples`` steps."""
        ...


class Learner(Protocol):
    """What the loop needs from a learner (e.g. :class:`~rlfleet.learners.VPG`)."""

    def get_params(self) -> dict[str, np.ndarray]:
        """The parameters to push as the agent update."""
        ...

    def train_step(self, batch: EpisodeBatch) -> dict[str, float]:
        """Trains on one batch; returns statistics."""
        ...


@dataclass(frozen=True)
class IterationRecord:
    """What one iteration sampled and learned.

    Attributes:
        iteration: 0-based iteration index (the ``itr`` given to the sampler).
        average_return: Mean undiscounted return of the batch's episodes.
        n_episodes: Episodes in the batch.
        steps: Env steps in the batch.
        total_steps: Env steps sampled so far, this batch included.
        sample_seconds: Wall time of the ``obtain_samples`` call (pushing
            the agent update, sampling and assembling the batch).
        elapsed_seconds: Wall time since the loop started, training included.
        agent_version: Agent version that produced the batch, if the
            sampler records one (``episode_infos['agent_version']``).
        stats: The learner's statistics for this iteration.
    """

    iteration: int
    average_return: float
    n_episodes: int
    steps: int
    total_steps: int
    sample_seconds: float
    elapsed_seconds: float
    agent_version: int | None
    stats: Mapping[str, float] = field(default_factory=dict)

    @property
    def steps_per_second(self) -> float:
        """Sampling throughput of this iteration, end to end through the sampler."""
        return self.steps / self.sample_seconds if self.sample_seconds > 0 else float("inf")


@dataclass(frozen=True)
class TrainingResult:
    """The outcome of :func:`train`.

    Attributes:
        history: One record per iteration, in order.
        target_return: The target average return, or None.
        reached: Whether an iteration's average return reached the target.
        elapsed_seconds: Wall time of the whole loop.
    """

    history: list[IterationRecord]
    target_return: float | None
    reached: bool
    elapsed_seconds: float

    @property
    def total_steps(self) -> int:
        """Env steps sampled in all iterations."""
        return self.history[-1].total_steps if self.history else 0

    @property
    def best(self) -> IterationRecord | None:
        """The iteration with the highest average return (None if none ran)."""
        return max(self.history, key=lambda r: r.average_return, default=None)


def train(
    sampler: Sampler,
    learner: Learner,
    *,
    steps_per_iteration: int,
    target_return: float | None = None,
    max_steps: int | None = None,
    max_iterations: int | None = None,
    on_iteration: Callable[[IterationRecord], None] | None = None,
) -> TrainingResult:
    """Samples and trains until the target return or a budget is reached.

    Args:
        sampler: Any sampler with garage's ``obtain_samples`` (LocalSampler,
            RemoteSampler).
        learner: Gives the parameters to push and trains on each batch.
        steps_per_iteration: ``num_samples`` of each request.
        target_return: Stop once a batch's average return is >= this.
        max_steps: Do not start an iteration once this many steps were sampled.
        max_iterations: Run at most this many iterations.
        on_iteration: Called with each iteration's record (e.g. to print it).

    Returns:
        The history and whether the target was reached.

    Raises:
        ConfigError: If no stopping condition is given or a budget is < 1.
    """
    if target_return is None and max_steps is None and max_iterations is None:
        raise ConfigError(
            "train needs a stopping condition: target_return, max_steps or max_iterations"
        )
    for name, value in (
        ("steps_per_iteration", steps_per_iteration),
        ("max_steps", max_steps),
        ("max_iterations", max_iterations),
    ):
        if value is not None:
            check_int(f"train {name}", value)

    history: list[IterationRecord] = []
    start = time.perf_counter()
    total_steps = 0
    reached = False
    while not _budget_spent(len(history), total_steps, max_steps, max_iterations):
        itr = len(history)
        sample_start = time.perf_counter()
        batch = sampler.obtain_samples(itr, steps_per_iteration, agent_update=learner.get_params())
        sample_seconds = time.perf_counter() - sample_start
        stats = learner.train_step(batch)
        total_steps += batch.total_steps
        record = IterationRecord(
            iteration=itr,
            average_return=float(undiscounted_returns(batch.rewards, batch.lengths).mean()),
            n_episodes=batch.n_episodes,
            steps=batch.total_steps,
            total_steps=total_steps,
            sample_seconds=sample_seconds,
            elapsed_seconds=time.perf_counter() - start,
            agent_version=_agent_version(batch),
            stats=stats,
        )
        history.append(record)
        if on_iteration is not None:
            on_iteration(record)
        if target_return is not None and record.average_return >= target_return:
            reached = True
            break
    return TrainingResult(history, target_return, reached, time.perf_counter() - start)


def _budget_spent(
    iterations: int, steps: int, max_steps: int | None, max_iterations: int | None
) -> bool:
    return (max_steps is not None and steps >= max_steps) or (
        max_iterations is not None and iterations >= max_iterations
    )


def _agent_version(batch: EpisodeBatch) -> int | None:
    versions = batch.episode_infos.get("agent_version")
    if not isinstance(versions, np.ndarray) or versions.size == 0:
        return None
    # A synchronous request is sampled by one version; max() is the newest
    # if a sampler ever mixes them.
    return int(versions.max())
