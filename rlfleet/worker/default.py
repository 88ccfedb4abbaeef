"""DefaultWorker: garage's one-env worker, as a one-slot VecWorker."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np

from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError, UsageError
from rlfleet.policies.base import Policy
from rlfleet.worker._updates import AgentUpdate, EnvUpdate
from rlfleet.worker.units import EpisodeUnit
from rlfleet.worker.vec import VecWorker


class DefaultWorker:
    """Samples one episode at a time in one env (garage's ``DefaultWorker``).

    The contract is garage's: :meth:`update_agent`, :meth:`update_env`, then
    :meth:`rollout`, or :meth:`start_episode`, :meth:`step_episode` until it
    returns True, and :meth:`collect_episode`.

    Seeds: the worker's k-th episode (counting from :meth:`worker_init`) uses
    ``rlfleet.seeding.episode_seeds(seed, worker_number, k)``: the worker
    number plays the role of the request, so workers with different numbers
    sample different episodes and a worker's episodes do not depend on its
    agent. Unlike garage, no global random state is touched.

    Episodes are run by a one-slot :class:`VecWorker`, so step types, infos,
    restarts and NaN handling are the same (see there); in particular an
    agent or env update in the middle of an episode restarts that episode
    from its seeds under the new agent.

    Args:
        seed: Base seed; None draws one from fresh entropy (not reproducible).
        max_episode_length: Cut episodes after this many steps; None or
            ``math.inf`` for the env's own limit.
        worker_number: This worker's number.
    """

    def __init__(
        self, *, seed: int | None, max_episode_length: int | float | None, worker_number: int
    ) -> None:
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 32))  # type: ignore[operator]
        if max_episode_length is not None and not isinstance(max_episode_length, int):
            if not (isinstance(max_episode_length, float) and math.isinf(max_episode_length)):
                raise ConfigError(
                    "max_episode_length must be a positive int, None or math.inf, "
                    f"got {max_episode_length!r}"
                )
            max_episode_length = None
        self._seed = seed
        self._max_episode_length = max_episode_length
        self._worker_number = worker_number
        self._vec = VecWorker(
            n_envs=1,
            seed=seed,
            max_episode_length=max_episode_length,
            worker_number=worker_number,
        )
        self._episodes_started = 0
        self.worker_init()

    # garage's attribute names
    @property
    def agent(self) -> Policy | None:
        """The policy the worker acts with."""
        return self._vec.policy

    @property
    def env(self) -> gym.Env | None:
        """The worker's env."""
        return self._vec.envs[0]

    @property
    def agent_version(self) -> int:
        """Version of the current agent (see :meth:`VecWorker.update_agent`)."""
        return self._vec.agent_version

    def worker_init(self) -> None:
        """Initialises the worker: the next episode is episode 0 of its seeds.

        garage seeds global random generators here; rlfleet seeds each
        episode instead (see the class docstring).
        """
        self._vec.cancel()
        self._episodes_started = 0

    def update_agent(self, agent_update: AgentUpdate, version: int | None = None) -> int:
        """Updates the agent (see :meth:`VecWorker.update_agent`).

        Returns:
            The agent version now in force.
        """
        return self._vec.update_agent(agent_update, version)

    def update_env(self, env_update: EnvUpdate) -> None:
        """Replaces the env (see :meth:`VecWorker.update_env`)."""
        self._vec.update_env(env_update)

    def start_episode(self) -> None:
        """Begins a new episode: resets the env with the episode's seed.

        An episode in progress is abandoned.
        """
        self._vec.cancel()
        unit = EpisodeUnit.seeded(self._seed, self._worker_number, self._episodes_started)
        self._episodes_started += 1
        self._vec.submit([unit])
        self._vec.start_queued()

    def step_episode(self) -> bool:
        """Takes one step of the current episode.

        Returns:
            True when the episode is done (terminated, truncated or cut off
            at ``max_episode_length``).

        Raises:
            RuntimeError: If no episode was started.
        """
        if self._vec.idle and not self._vec.finished_count:
            raise UsageError("step_episode() called with no episode: call start_episode() first")
        self._vec.step()
        return self._vec.finished_count > 0

    def collect_episode(self) -> EpisodeBatch:
        """Returns the finished episode and clears it from the worker.

        Raises:
            RuntimeError: If the episode is not finished yet.
        """
        batch = self._vec.take_finished()
        if batch is None:
            raise UsageError(
                "collect_episode(): no finished episode; call step_episode() until it returns True"
            )
        return batch

    def rollout(self) -> EpisodeBatch:
        """Samples one whole episode.

        Returns:
            A batch of one episode.
        """
        self.start_episode()
        while not self.step_episode():
            pass
        return self.collect_episode()

    def shutdown(self) -> None:
        """Closes the env."""
        self._vec.shutdown()


__all__ = ["DefaultWorker"]
