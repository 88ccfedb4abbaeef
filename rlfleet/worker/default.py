"""DefaultWorker: garage's one-env worker, as a one-slot VecWorker."""

from __future__ import annotations

import math
import numbers
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError, PolicyError, UsageError
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
    ``rlfleet.core.seeding.episode_seeds(seed, worker_number, k)``: the worker
    number plays the role of the request, so workers with different numbers
    sample different episodes and a worker's episodes do not depend on its
    agent. Unlike garage, no global random state is touched.

    Episodes are run by a one-slot :class:`VecWorker`, so step types, infos,
    restarts and NaN handling are the same (see there); in particular an
    agent or env update in the middle of an episode restarts that episode
    from its seeds under the new agent.

    Args:
        seed: Base seed; None draws one from fresh entropy (not reproducible).
        max_episode_length: Cut episodes once they reach this many steps
            (any positive number, as in garage: a fractional limit cuts at
            its ceiling, 5.5 at 6 steps); None or ``math.inf`` for the env's
            own limit.
        worker_number: This worker's number.
    """

    def __init__(
        self, *, seed: int | None, max_episode_length: int | float | None, worker_number: int
    ) -> None:
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (1 << 32))  # type: ignore[operator]
        max_episode_length = _episode_limit(max_episode_length)
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
        self._uncollected: list[EpisodeBatch] = []
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

    def update_agent(
        self,
        agent_update: AgentUpdate | np.ndarray | tuple[np.ndarray, ...],
        version: int | None = None,
    ) -> int:
        """Updates the agent (see :meth:`VecWorker.update_agent`).

        Besides VecWorker's forms, garage's flat form is accepted: a 1-D
        array of every parameter raveled and concatenated (or a tuple of
        the arrays), in the order of the current policy's
        ``get_param_values()`` (documented per policy in docs/policies.md).

        Returns:
            The agent version now in force.

        Raises:
            PolicyError: If a flat update comes with no policy to read the
                order from, or its size does not match the policy's.
        """
        if isinstance(agent_update, np.ndarray | tuple):
            agent_update = _named_params(agent_update, self._vec.policy)
        return self._vec.update_agent(agent_update, version)

    def update_env(self, env_update: EnvUpdate) -> None:
        """Replaces the env (see :meth:`VecWorker.update_env`)."""
        self._vec.update_env(env_update)

    def start_episode(self) -> None:
        """Begins a new episode: resets the env with the episode's seed.

        An episode in progress is abandoned; a finished one not yet collected
        is kept for :meth:`collect_episode`.
        """
        self._keep_finished()
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
        """Returns every episode finished since the last collect, and forgets them.

        Returns:
            The episodes, oldest first.

        Raises:
            UsageError: (a RuntimeError) If no episode finished since the
                last collect.
        """
        self._keep_finished()
        episodes, self._uncollected = self._uncollected, []
        if not episodes:
            raise UsageError(
                "collect_episode(): no finished episode; call step_episode() until it returns True"
            )
        return episodes[0] if len(episodes) == 1 else EpisodeBatch.concatenate(*episodes)

    def _keep_finished(self) -> None:
        """Moves finished episodes out of the engine, so that cancel() cannot drop them."""
        while (batch := self._vec.take_finished()) is not None:
            self._uncollected.append(batch)

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


def _episode_limit(value: int | float | None) -> int | None:
    """garage's ``max_episode_length`` as VecWorker's: an int, or None for no limit of its own.

    garage takes any number: it steps while the episode is shorter than the
    limit, so a fractional limit cuts episodes at its ceiling (5.5 gives 6
    steps), and infinity means no limit. Ints are checked by VecWorker.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        pass  # a bool is an Integral, but no episode length
    elif isinstance(value, numbers.Integral):
        return int(value)
    elif isinstance(value, numbers.Real) and value > 0:
        return None if math.isinf(value) else math.ceil(value)
    raise ConfigError(
        "max_episode_length must be a positive number (episodes are cut at its ceiling: 5.5 "
        f"gives 6 steps), None or math.inf, got {value!r}"
    )


def _named_params(flat: np.ndarray | tuple[np.ndarray, ...], policy: Any) -> dict[str, np.ndarray]:
    """garage's flat parameter vector (or tuple of arrays) as the policy's named arrays."""
    if policy is None:
        raise PolicyError(
            "a flat parameter array needs a policy to read names and shapes from; "
            "send a Policy or PolicySpec first"
        )
    template = policy.get_param_values()
    if isinstance(flat, tuple):
        if len(flat) != len(template):
            raise PolicyError(
                f"got a tuple of {len(flat)} parameter arrays; {type(policy).__name__} has "
                f"{len(template)}: {list(template)}"
            )
        return dict(zip(template, flat, strict=True))
    sizes = [value.size for value in template.values()]
    if flat.ndim != 1 or flat.size != sum(sizes):
        raise PolicyError(
            f"a flat parameter array must be 1-D with {sum(sizes)} values (the raveled "
            f"parameters of {type(policy).__name__}: {list(template)}), got shape {flat.shape}"
        )
    pieces = np.split(flat, np.cumsum(sizes)[:-1])
    return {
        name: piece.reshape(value.shape)
        for (name, value), piece in zip(template.items(), pieces, strict=True)
    }


__all__ = ["DefaultWorker"]
