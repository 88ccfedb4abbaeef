"""LocalSampler: garage's Sampler contract over in-process VecWorkers.

It runs the same workers the fleet runs remotely, in the learner's own
process and thread, and hands them work with the coordinator's own
:class:`~rlfleet.scheduling.scheduler.Scheduler`: one request logic for
both, so a local batch is a fleet batch. Workers are stepped round-robin.
It is the no-set-up way to sample and the reference the fleet's batches are
compared with.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import gymnasium as gym

from rlfleet._util.closing import ClosesOnExit
from rlfleet._util.values import check_int
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.episode_order import first_episodes, sort_fragments
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import InternalError, WrongTypeError
from rlfleet.policies.base import Policy
from rlfleet.policies.spec import PolicySpec, make_policy
from rlfleet.protocol.modes import Mode
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler
from rlfleet.worker._updates import AgentUpdate, EnvUpdate
from rlfleet.worker.units import UnitRow
from rlfleet.worker.vec import VecWorker

#: A worker hands its finished episodes over once they hold this many steps
#: (or when its queue runs dry), as a remote worker flushes a message.
_FLUSH_STEPS = 4096


class LocalSampler(ClosesOnExit):
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
        # The coordinator's capacities: a worker holds enough units to report
        # at its flush threshold, not at every episode (with only a spare
        # unit per slot it reported 20x as often, ~5% of the CPU). Requests
        # still run no surplus: the scheduler hands out only what they need.
        self._scheduler = Scheduler()
        for number in range(n_workers):
            self._scheduler.add_worker(number, envs_per_worker)
            self._scheduler.set_eligible(number, True)
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
        return self._sample(Mode.STEPS, num_samples)

    def obtain_episodes(
        self, n_episodes: int, agent_update: AgentUpdate = None, env_update: EnvUpdate = None
    ) -> EpisodeBatch:
        """Collects exactly ``n_episodes`` episodes (0..n-1), in index order."""
        check_int("n_episodes", n_episodes, minimum=1)
        self._update(agent_update, env_update)
        return self._sample(Mode.EPISODES, n_episodes)

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
            (:func:`rlfleet.core.episode_order.sort_fragments`, the remote client's
            order too).
        """
        check_int("num_samples", num_samples, minimum=1)
        check_int("fragment_length", fragment_length, minimum=1)
        self._update(agent_update, env_update)
        request_id = self._start(Mode.FRAGMENTS, num_samples, fragment_length)
        scheduler = self._scheduler
        batches: list[EpisodeBatch] = []
        try:
            for order in scheduler.dispatch():  # every worker's windows, planned at once
                worker = self._workers[order.worker_id]
                for _ in range(order.rounds):
                    batch = worker.collect_fragments(
                        order.fragment_length,
                        base_seed=order.base_seed,
                        first_stream=order.worker_id * self.envs_per_worker,
                    )
                    batches.append(batch)
                    scheduler.complete(
                        order.worker_id,
                        order.task_id,
                        batch.episode_infos["episode_index"].tolist(),
                        batch.lengths.tolist(),
                    )
        finally:
            scheduler.finish(request_id)
        return sort_fragments(EpisodeBatch.concatenate(*batches))

    # --------------------------------------------------------------- closing

    def shutdown_worker(self) -> None:
        """Closes every worker's envs (garage's name)."""
        for worker in self._workers:
            worker.shutdown()

    def close(self) -> None:
        """Closes every worker's envs."""
        self.shutdown_worker()

    # ------------------------------------------------------------ internals

    def _shared_policy(self, policy: Policy | PolicySpec | str) -> Policy:
        if isinstance(policy, Policy):
            return policy
        if isinstance(policy, PolicySpec | str):
            # Built once with the sampler's seed: every worker acts with the same weights.
            return make_policy(policy, self.env_spec, seed=self.seed)
        raise WrongTypeError(
            f"policy must be a Policy, a PolicySpec, a spec name or None, got {type(policy)}"
        )

    def _update(self, agent_update: AgentUpdate, env_update: EnvUpdate) -> None:
        """Applies the env update, then the agent update, to every worker.

        The env goes first so that a policy spec is built for the new env.
        """
        if env_update is not None:
            for number, worker in enumerate(self._workers):
                worker.update_env(_copy_instance(env_update, number))
            self._scheduler.set_env_generation(0)  # the old env's lengths say nothing of the new
        if agent_update is None:
            return
        if isinstance(agent_update, PolicySpec | str):
            agent_update = self._shared_policy(agent_update)
        version = self._agent_version + 1
        for worker in self._workers:
            worker.update_agent(agent_update, version=version)
        self._agent_version = version

    def _start(self, mode: Mode, amount: int, fragment_length: int = 0) -> int:
        """Starts the next request on the scheduler; returns its id."""
        request_index = self._requests
        self._requests += 1
        return self._scheduler.start_sample(
            RequestSpec(
                mode=mode,
                amount=amount,
                seed=self.seed,
                request_index=request_index,
                agent_version=self._agent_version,
                env_generation=0,
                fragment_length=fragment_length,
            )
        )

    def _sample(self, mode: Mode, amount: int) -> EpisodeBatch:
        """Runs a STEPS or EPISODES request: the scheduler's units, stepped round-robin."""
        request_id = self._start(mode, amount)
        request = self._requests - 1
        scheduler = self._scheduler
        task_of: dict[int, int] = {}  # episode index -> task
        batches: list[EpisodeBatch] = []
        num_episodes = None
        try:
            while num_episodes is None:
                for order in scheduler.dispatch():
                    indices = order.units.episode_indices.tolist()
                    task_of.update(dict.fromkeys(indices, order.task_id))
                    self._workers[order.worker_id].submit_rows(UnitRow.many(order.units, request))
                if all(w.idle and not w.finished_count for w in self._workers):
                    raise InternalError("LocalSampler: the scheduler left every worker idle")
                for number, worker in enumerate(self._workers):
                    worker.step()
                    # Report before a slot would idle (no queued unit left), as a
                    # remote worker flushes: the scheduler refills on reports.
                    if worker.finished_count and (
                        not worker.queued_count or worker.finished_steps >= _FLUSH_STEPS
                    ):
                        num_episodes = self._report(number, request, task_of, batches)
                        if num_episodes is not None:
                            break
        finally:
            scheduler.finish(request_id)
            for worker in self._workers:
                worker.cancel(request=request)
        return first_episodes(EpisodeBatch.concatenate(*batches), num_episodes)

    def _report(
        self, number: int, request: int, task_of: dict[int, int], batches: list[EpisodeBatch]
    ) -> int | None:
        """Hands a worker's finished episodes to the scheduler, task by task.

        Returns:
            The number of episodes of the answer once the request is done.
        """
        batch = self._workers[number].take_finished(request=request)
        if batch is None:
            return None
        batches.append(batch)
        by_task: dict[int, tuple[list[int], list[int]]] = {}
        for index, length in zip(
            batch.episode_infos["episode_index"].tolist(), batch.lengths.tolist(), strict=True
        ):
            indices, lengths = by_task.setdefault(task_of.pop(index), ([], []))
            indices.append(index)
            lengths.append(length)
        for task_id, (indices, lengths) in by_task.items():
            outcome = self._scheduler.complete(number, task_id, indices, lengths)
            if outcome.done:
                return self._scheduler.footer(outcome.request_id).num_episodes
        return None


def _copy_instance(env: EnvUpdate, number: int) -> EnvUpdate:
    """Worker 0 gets an env instance itself, the others deep copies (garage)."""
    if isinstance(env, gym.Env) and number > 0:
        return copy.deepcopy(env)
    return env


__all__ = ["LocalSampler"]
