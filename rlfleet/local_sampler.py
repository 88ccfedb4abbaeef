"""LocalSampler: garage's Sampler contract over in-process VecWorkers.

It runs the same workers, with the same unit dispatch, that the fleet runs
remotely, in the learner's own process and thread: workers are stepped
round-robin and each idle env slot is handed the next episode unit, as the
coordinator does. It is the no-set-up way to sample and the reference the
fleet's batches are compared with.
"""

from __future__ import annotations

import abc
import copy
import math
from collections.abc import Callable
from types import TracebackType

import gymnasium as gym
import numpy as np

from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.base import Policy
from rlfleet.policies.spec import PolicySpec, make_policy
from rlfleet.sampling import sort_fragments
from rlfleet.worker._updates import AgentUpdate, EnvUpdate
from rlfleet.worker.units import EpisodeUnit
from rlfleet.worker.vec import VecWorker, check_int

#: A worker hands its finished episodes over once they hold this many steps
#: (or when it runs out of work), as a remote worker flushes a message.
_FLUSH_STEPS = 4096


class LocalSampler:
    """Samples with ``n_workers`` in-process workers of ``envs_per_worker`` envs.

    **Determinism.** Every ``obtain_*`` call is a new request with the next
    request index r (0, 1, ...), and episode k of it runs with the seeds
    ``episode_seeds(seed, r, k)``, whichever worker and env slot runs it.
    Batches are ordered by episode index, and which episodes a call returns
    depends only on episode lengths, never on which finished first (see
    :meth:`obtain_samples`). So the same seed, the same calls and the same
    agent updates give identical batches for any ``n_workers`` and
    ``envs_per_worker``, except ``episode_infos["worker"]``, which records
    where each episode ran. Fragment streams (:meth:`obtain_fragments`)
    depend on the total number of env slots, not on how they are split
    into workers.

    **Agent updates** are applied to every worker with the same version
    number (the sampler's :attr:`agent_version`, +1 per update), and a
    Policy given as an update is shared by the workers, as in garage.

    Args:
        env: An EnvConfig or env factory (called for each env slot), or a
            gymnasium Env (worker 0 uses it, the others deep copies).
        policy: A Policy, a PolicySpec or its name (built once with the
            sampler's seed and shared), or None to act randomly.
        n_workers: Number of workers.
        envs_per_worker: Env slots per worker.
        seed: Base seed of every episode's seeds.
        max_episode_length: Cut episodes off after this many steps; None
            uses the env's own limit.

    Raises:
        ConfigError: If an argument is invalid or the env cannot be built.
    """

    def __init__(
        self,
        env: EnvConfig | Callable[[], gym.Env] | gym.Env,
        policy: Policy | PolicySpec | str | None = None,
        *,
        n_workers: int = 1,
        envs_per_worker: int = 1,
        seed: int = 0,
        max_episode_length: int | None = None,
    ) -> None:
        check_int("n_workers", n_workers, minimum=1)
        check_int("envs_per_worker", envs_per_worker, minimum=1)
        check_int("seed", seed, minimum=0)
        self.n_workers = n_workers
        self.envs_per_worker = envs_per_worker
        self.seed = seed
        self._workers = [
            VecWorker(
                n_envs=envs_per_worker,
                seed=seed,
                max_episode_length=max_episode_length,
                worker_number=number,
                env=_copy_instance(env, number),
            )
            for number in range(n_workers)
        ]
        self._agent_version = 0
        self._requests = 0
        self._mean_length = 0.0  # of the episodes seen so far, to pace the dispatch
        if policy is not None:
            shared = self._shared_policy(policy)
            for worker in self._workers:
                worker.update_agent(shared, version=0)

    # ------------------------------------------------------------ properties

    @property
    def agent_version(self) -> int:
        """Version of the workers' agent (0 initially, +1 per agent update)."""
        return self._agent_version

    @property
    def env_spec(self) -> EnvSpec:
        """Spec of the workers' env."""
        return self._workers[0].env_spec

    @property
    def workers(self) -> tuple[VecWorker, ...]:
        """The workers."""
        return tuple(self._workers)

    @property
    def requests_made(self) -> int:
        """Requests made so far: the next ``obtain_*`` call's request index."""
        return self._requests

    def set_next_request(self, request_index: int) -> None:
        """Makes the next ``obtain_*`` call request ``request_index``.

        A run resumed from a snapshot continues the request numbering where
        the interrupted run stopped (``rlfleet.Trainer.restore``).

        Raises:
            ConfigError: If the index is not an int >= 0.
        """
        check_int("request_index", request_index, minimum=0)
        self._requests = request_index

    # -------------------------------------------------------------- sampling

    def obtain_samples(
        self,
        itr: int,
        num_samples: int,
        agent_update: AgentUpdate = None,
        env_update: EnvUpdate = None,
    ) -> EpisodeBatch:
        """Collects complete episodes totalling at least ``num_samples`` steps.

        The batch is episodes 0..m, the shortest prefix by episode index
        whose total length reaches ``num_samples``. Unlike garage's "the
        first episodes to finish", this rule does not depend on how fast
        each worker runs, which keeps batches identical across layouts.

        Args:
            itr: Iteration number (unused, as in garage).
            num_samples: Minimum number of steps (>= 1).
            agent_update: Applied to every worker first (see
                :meth:`VecWorker.update_agent`).
            env_update: Applied to every worker first (see
                :meth:`VecWorker.update_env`).

        Returns:
            The episodes, ordered by episode index.
        """
        del itr
        check_int("num_samples", num_samples, minimum=1)
        self._update(agent_update, env_update)
        return self._sample(_SamplesGoal(num_samples))

    def obtain_episodes(
        self, n_episodes: int, agent_update: AgentUpdate = None, env_update: EnvUpdate = None
    ) -> EpisodeBatch:
        """Collects exactly ``n_episodes`` episodes (0..n-1), in index order."""
        check_int("n_episodes", n_episodes, minimum=1)
        self._update(agent_update, env_update)
        return self._sample(_EpisodesGoal(n_episodes))

    def obtain_exact_episodes(
        self,
        n_eps_per_worker: int,
        agent_update: AgentUpdate = None,
        env_update: EnvUpdate = None,
    ) -> EpisodeBatch:
        """garage's exact sampling: ``n_eps_per_worker * n_workers`` episodes.

        The episodes are handed out dynamically, like any request, so a
        worker may run more or fewer than ``n_eps_per_worker`` of them; the
        batch is ordered by episode index.
        """
        check_int("n_eps_per_worker", n_eps_per_worker, minimum=1)
        return self.obtain_episodes(n_eps_per_worker * self.n_workers, agent_update, env_update)

    def obtain_fragments(
        self,
        num_samples: int,
        fragment_length: int,
        agent_update: AgentUpdate = None,
        env_update: EnvUpdate = None,
    ) -> EpisodeBatch:
        """Collects fragments of the workers' continuous streams (off-policy).

        Every env slot of the sampler is a stream (worker w's slot i is
        stream ``w * envs_per_worker + i``) whose episodes continue across
        calls; see :meth:`VecWorker.collect_fragments` for the pieces' step
        types and infos. Each round returns ``fragment_length`` steps per
        stream; there are as many rounds as it takes to reach
        ``num_samples``.

        Args:
            num_samples: Minimum number of steps (>= 1).
            fragment_length: Steps per stream per round (>= 1).
            agent_update: As in :meth:`obtain_samples`.
            env_update: As in :meth:`obtain_samples`; it ends the streams'
                current episodes.

        Returns:
            Whole rounds, ordered by stream, then episode, then piece
            (:func:`rlfleet.sampling.sort_fragments`, the remote client's
            order too).
        """
        check_int("num_samples", num_samples, minimum=1)
        check_int("fragment_length", fragment_length, minimum=1)
        self._update(agent_update, env_update)
        self._requests += 1  # a request like any other: later seeds stay in step
        per_round = self.n_workers * self.envs_per_worker * fragment_length
        batches = [
            worker.collect_fragments(
                fragment_length,
                base_seed=self.seed,
                first_stream=number * self.envs_per_worker,
            )
            for _ in range(math.ceil(num_samples / per_round))
            for number, worker in enumerate(self._workers)
        ]
        return sort_fragments(EpisodeBatch.concatenate(*batches))

    # --------------------------------------------------------------- closing

    def shutdown_worker(self) -> None:
        """Closes every worker's envs (garage's name)."""
        for worker in self._workers:
            worker.shutdown()

    def close(self) -> None:
        """Closes every worker's envs."""
        self.shutdown_worker()

    def __enter__(self) -> LocalSampler:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _shared_policy(self, policy: Policy | PolicySpec | str) -> Policy:
        if isinstance(policy, Policy):
            return policy
        if isinstance(policy, PolicySpec | str):
            # Built once with the sampler's seed: every worker acts with the same weights.
            return make_policy(policy, self.env_spec, seed=self.seed)
        raise TypeError(
            f"policy must be a Policy, a PolicySpec, a spec name or None, got {type(policy)}"
        )

    def _update(self, agent_update: AgentUpdate, env_update: EnvUpdate) -> None:
        """Applies the env update, then the agent update, to every worker.

        The env goes first so that a policy spec is built for the new env.
        """
        if env_update is not None:
            for number, worker in enumerate(self._workers):
                worker.update_env(_copy_instance(env_update, number))
        if agent_update is None:
            return
        if isinstance(agent_update, PolicySpec | str):
            agent_update = self._shared_policy(agent_update)
        version = self._agent_version + 1
        for worker in self._workers:
            worker.update_agent(agent_update, version=version)
        self._agent_version = version

    def _sample(self, goal: _Goal) -> EpisodeBatch:
        """Hands units out to idle slots, steps the workers round-robin."""
        request = self._requests
        self._requests += 1
        dispatch = _Dispatch(self._workers, self.seed, request, goal, self._mean_length)
        try:
            while not goal.reached:
                for worker in self._workers:
                    dispatch.feed(worker)
                    worker.step()
                    if worker.finished_count and (
                        worker.idle or worker.finished_steps >= _FLUSH_STEPS or dispatch.ending
                    ):
                        dispatch.take(worker)
                    if goal.reached:
                        break
        finally:
            for worker in self._workers:
                worker.cancel(request=request)
        self._mean_length = dispatch.mean_length
        assert goal.last_index is not None  # the goal is reached
        return dispatch.result(goal.last_index)


class _Goal(abc.ABC):
    """When a request is complete, and whether it needs more units."""

    #: Index of the request's last episode, once known.
    last_index: int | None = None

    @property
    @abc.abstractmethod
    def reached(self) -> bool:
        """Whether episodes 0..last_index have all been taken."""

    @abc.abstractmethod
    def wants_unit(self, index: int, expected_steps: float) -> bool:
        """Whether to hand out unit ``index`` given the steps expected so far."""

    @abc.abstractmethod
    def ending(self, known_steps: int, next_index: int) -> bool:
        """Whether the request may be complete, so results should be taken at once."""

    @abc.abstractmethod
    def observe(self, lengths: dict[int, int]) -> None:
        """Learns the lengths of the episodes taken so far."""


class _EpisodesGoal(_Goal):
    """Exactly episodes 0..n-1."""

    def __init__(self, n_episodes: int) -> None:
        self.n_episodes = n_episodes
        self.last_index = n_episodes - 1
        self._taken = 0

    @property
    def reached(self) -> bool:
        return self._taken == self.n_episodes

    def wants_unit(self, index: int, expected_steps: float) -> bool:
        return index < self.n_episodes

    def ending(self, known_steps: int, next_index: int) -> bool:
        return next_index == self.n_episodes

    def observe(self, lengths: dict[int, int]) -> None:
        self._taken = len(lengths)


class _SamplesGoal(_Goal):
    """The shortest index prefix 0..m with at least ``num_samples`` steps."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples
        self._prefix_end = 0  # episodes 0.._prefix_end - 1 have known lengths
        self._prefix_steps = 0

    @property
    def reached(self) -> bool:
        return self.last_index is not None

    def wants_unit(self, index: int, expected_steps: float) -> bool:
        return self.last_index is None and expected_steps < self.num_samples

    def ending(self, known_steps: int, next_index: int) -> bool:
        return known_steps >= self.num_samples

    def observe(self, lengths: dict[int, int]) -> None:
        while self.last_index is None and self._prefix_end in lengths:
            self._prefix_steps += lengths[self._prefix_end]
            self._prefix_end += 1
            if self._prefix_steps >= self.num_samples:
                self.last_index = self._prefix_end - 1


class _Dispatch:
    """One request's bookkeeping: units handed out, batches and lengths taken.

    Units go only to idle slots (nothing queues in the workers), so a
    request never holds more episodes in flight than there are slots. For
    ``obtain_samples``, a unit is handed out only while the steps expected
    from the episodes already out fall short: steps of finished episodes,
    plus, per worker, the larger of its in-flight episodes' steps so far and
    the mean episode length seen so far times their number. This only saves
    work; which episodes are returned does not depend on it.
    """

    def __init__(
        self,
        workers: list[VecWorker],
        seed: int,
        request: int,
        goal: _Goal,
        mean_length: float,
    ) -> None:
        self._workers = workers
        self._seed = seed
        self._request = request
        self._goal = goal
        self._next_index = 0
        self._batches: list[EpisodeBatch] = []
        self._lengths: dict[int, int] = {}
        self._taken_steps = 0
        self._prior_mean = mean_length

    @property
    def mean_length(self) -> float:
        """Mean length of the episodes taken (or the prior mean if none)."""
        return self._taken_steps / len(self._lengths) if self._lengths else self._prior_mean

    @property
    def ending(self) -> bool:
        """Whether the request may be complete: take results without waiting."""
        known = self._taken_steps + sum(worker.finished_steps for worker in self._workers)
        return self._goal.ending(known, self._next_index)

    def feed(self, worker: VecWorker) -> None:
        """Gives the worker's idle slots the next units the goal wants."""
        free = worker.n_envs - worker.active_count - worker.queued_count
        if free <= 0:
            return
        expected = self._expected_steps()
        units: list[EpisodeUnit] = []
        while len(units) < free and self._goal.wants_unit(self._next_index, expected):
            units.append(EpisodeUnit.seeded(self._seed, self._request, self._next_index))
            self._next_index += 1
            expected += self.mean_length
        if units:
            worker.submit(units)

    def _expected_steps(self) -> float:
        mean = self.mean_length
        return self._taken_steps + sum(
            worker.finished_steps + max(worker.active_steps, mean * worker.active_count)
            for worker in self._workers
        )

    def take(self, worker: VecWorker) -> None:
        """Takes the worker's finished episodes of this request."""
        batch = worker.take_finished(request=self._request)
        if batch is None:
            return
        self._batches.append(batch)
        indices = batch.episode_infos["episode_index"].tolist()
        for index, length in zip(indices, batch.lengths.tolist(), strict=True):
            self._lengths[index] = length
        self._taken_steps += batch.total_steps
        self._goal.observe(self._lengths)

    def result(self, last_index: int) -> EpisodeBatch:
        """Episodes 0..last_index of the batches taken, in index order."""
        batch = EpisodeBatch.concatenate(*self._batches)
        indices = batch.episode_infos["episode_index"]
        keep = np.flatnonzero(indices <= last_index)
        return batch.take_episodes(keep[np.argsort(indices[keep], kind="stable")])


def _copy_instance(env: EnvUpdate, number: int) -> EnvUpdate:
    """Worker 0 gets an env instance itself, the others deep copies (garage)."""
    if isinstance(env, gym.Env) and number > 0:
        return copy.deepcopy(env)
    return env


__all__ = ["LocalSampler"]
