"""A per-env fleet worker's work in one process: ``python -m benchmarks.perenv_session``.

What a remote worker's session does on its stepping thread, over K gym
envs: a ``TaskBook`` holding tasks of units as columns and feeding the
``VecWorker`` in blocks, one vector step, the flush decision after it (the
session's own :class:`~rlfleet.worker._stepping.SessionStep`), and at each
flush the finished episodes taken per task and written as result messages
into reused memory. Its clock is simulated (``--step-us`` per env step), so
flushes fall at the same steps in every run and under any load or profiler.

Instruction counts are the figure that holds on a shared machine: run it
under ``valgrind --tool=callgrind`` with two ``--steps`` (say 5,000 and
25,000) and divide the difference of the totals by the difference of the
``steps`` it prints, so that start-up cancels. ``--plain`` runs the plain
per-env loop of :mod:`rlfleet.bench.plain_loop` instead, for comparison.

``--native`` runs a native worker's session instead: CartPole's vector
entry point, 64 envs (``--envs``), one task per request whose refills join
it, each refill following a flush with as many units as that flush
reported (the coordinator tops a worker up to its capacity when a result
is booked). ``--native --sampler`` runs the ``VecWorker`` alone as
``rlfleet bench --native`` and :mod:`benchmarks.native_worker` time it (no
``TaskBook``, no flush decision, finished episodes taken as a batch every
``flush_steps``), for comparison.
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from rlfleet.bench.plain_loop import plain_loop
from rlfleet.bench.report import BenchConfig
from rlfleet.bench.samplers import vec_worker_sampler
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._flush import FlushMemory, FlushPolicy, flush_steps_for
from rlfleet.worker._join_messages import result_messages
from rlfleet.worker._stepping import SessionStep
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.remote import WorkerConfig
from rlfleet.worker.vec import VecWorker

#: Units per task: a refill's size for a per-env CartPole worker.
TASK_UNITS = 400

#: Units a native worker of 64 CartPoles holds (about 64 slots and three of
#: its 8,192-step results, the scheduler's floor for it).
NATIVE_CAPACITY = 1_250


class SessionLoop:
    """The stepping thread's work of a per-env worker session, without its connection.

    Args:
        env_id: A gymnasium id.
        n_envs: Env slots (K).
        step_seconds: Simulated seconds per env step (the flush timer's clock).
        native: Step the env's vector entry point, and refill one task after
            each flush (a native worker's refills), instead of a new task of
            :data:`TASK_UNITS` whenever fewer than two units per slot wait.
    """

    def __init__(
        self, env_id: str, n_envs: int, step_seconds: float, *, native: bool = False
    ) -> None:
        config = WorkerConfig("local:0")
        env = EnvConfig(env_id, vectorization="vector_entry_point" if native else None)
        self.native = native
        self.vec = VecWorker(n_envs=n_envs, env=env, policy="mlp-categorical")
        self.book = TaskBook(self.vec)
        # The simulated clock counts env steps, so the flush timer is given in
        # steps: reading the clock is one C call, as a session's
        # time.monotonic is. (The loop never runs out of units, where the
        # dry-spell rules' TAIL_SECONDS would apply.)
        self.policy = FlushPolicy(
            flush_steps_for(config.flush_steps, native=native),
            config.flush_bytes,
            config.flush_seconds / step_seconds,
        )
        self.memory = FlushMemory()
        self.step_seconds = step_seconds
        self.stepper = SessionStep(self.book, self.vec, self.policy, _raise)
        self.stepper.clock = functools.partial(getattr, self.stepper, "steps_total")
        self.sent_steps = 0
        self.results = 0
        self._tasks = 0
        self._episodes = 0

    @property
    def stepped(self) -> int:
        """Env steps taken so far."""
        return self.stepper.steps_total

    def run(self, steps: int) -> int:
        """Steps until at least ``steps`` more steps were sent; returns how many were."""
        vec, book, step = self.vec, self.book, self.stepper.step
        start = self.sent_steps
        if self.native and not self._tasks:
            self._add_task(NATIVE_CAPACITY)
        while self.sent_steps - start < steps:
            if not self.native and book.queued_units < 2 * vec.n_envs:
                self._add_task(TASK_UNITS)
            if step():
                self._flush()
        return self.sent_steps - start

    def _add_task(self, count: int) -> None:
        """A new task of ``count`` units, or for a native worker its refill."""
        if not (self.native and self._tasks):
            self._tasks += 1
        first = self._episodes
        self._episodes += count
        units = UnitColumns.seeded(0, self._tasks, np.arange(first, self._episodes))
        self.book.add(EpisodeTask(self._tasks, self._tasks, -1, 0), units)

    def _flush(self) -> None:
        self.policy.sent()
        reported = 0
        for task_id in list(self.book.episode_tasks):
            while (batch := self.vec.take_finished_pieces(request=task_id)) is not None:
                indices = batch.episode_infos["episode_index"]
                _, total = result_messages(
                    batch,
                    task_id=task_id,
                    episode_indices=indices,
                    env_generation=0,
                    batch_id=self.results,
                    max_message_bytes=64 << 20,
                    allocate=self.memory.allocate,
                )
                self.results += 1
                self.policy.expect_step_bytes(total / batch.total_steps)
                self.book.reported(task_id, indices.tolist())
                self.sent_steps += batch.total_steps
                reported += len(indices)
        self.memory.reset()
        if self.native and reported:
            self._add_task(reported)


def _raise(exc: Exception) -> None:
    """A session reports a step's error to the coordinator; here it ends the run."""
    raise exc


def run_sampler(env_id: str, n_envs: int, warmup: int, steps: int) -> None:
    """The bench's native ``VecWorker`` sampler alone: a warm-up, then ``steps``.

    The warm-up is long enough to leave the units of the run queued (the
    sampler tops its queue up to an eighth of a run's steps, and an episode
    lasts about 21): the sampler's clock leaves out making units, and so do
    the instruction counts.
    """
    config = BenchConfig(workers=1, envs_per_worker=n_envs, steps=steps)
    env = EnvConfig(env_id, vectorization="vector_entry_point")
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=config.hidden_sizes, seed=0)
    with vec_worker_sampler(config, env, policy) as sample:
        sample(max(warmup, 3 * steps))
        run = sample(steps)
    print(f"VecWorker sampler: steps {run.steps} CPU {run.cpu_us['this process']:.3f} us/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=3_000)
    parser.add_argument("--step-us", type=float, default=11.0)
    parser.add_argument("--plain", action="store_true", help="the plain per-env loop instead")
    parser.add_argument("--native", action="store_true", help="a native worker (64 envs)")
    parser.add_argument(
        "--sampler", action="store_true", help="with --native: the VecWorker alone instead"
    )
    args = parser.parse_args()
    if args.native and args.envs == parser.get_default("envs"):
        args.envs = 64
    if args.native and args.sampler:
        run_sampler(args.env, args.envs, args.warmup, args.steps)
        return
    if args.plain:
        plain_loop(args.env, args.envs, args.warmup)
        run = plain_loop(args.env, args.envs, args.steps)
        print(f"plain loop: steps {run.steps} CPU {run.cpu / run.steps * 1e6:.3f} us/step")
        return
    loop = SessionLoop(args.env, args.envs, args.step_us * 1e-6, native=args.native)
    loop.run(args.warmup)
    cpu = time.process_time()
    steps, results = loop.run(args.steps), loop.results
    cpu = time.process_time() - cpu
    print(
        f"session loop: steps {steps} CPU {cpu / steps * 1e6:.3f} us/step, {results} results in all"
    )


if __name__ == "__main__":
    main()
