"""A per-env fleet worker's work in one process: ``python -m benchmarks.perenv_session``.

What a remote worker's session does on its stepping thread, over K gym
envs: a ``TaskBook`` holding tasks of units as columns and feeding the
``VecWorker`` in blocks, one vector step, the flush decision after it (as
``Session._step`` asks it), and at each flush the finished episodes taken
per task and written as result messages into reused memory. Its clock is
simulated (``--step-us`` per env step), so flushes fall at the same steps in
every run and under any load or profiler.

Instruction counts are the figure that holds on a shared machine: run it
under ``valgrind --tool=callgrind`` with two ``--steps`` (say 5,000 and
25,000) and divide the difference of the totals by the difference of the
``steps`` it prints, so that start-up cancels. ``--plain`` runs the plain
per-env loop of :mod:`rlfleet.bench.plain_loop` instead, for comparison.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rlfleet.bench.plain_loop import plain_loop
from rlfleet.envs.config import EnvConfig
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.worker._flush import FlushMemory, FlushPolicy
from rlfleet.worker._join_messages import result_messages
from rlfleet.worker._tasks import EpisodeTask, TaskBook
from rlfleet.worker.remote import WorkerConfig
from rlfleet.worker.vec import VecWorker

#: Units per task: a refill's size for a per-env CartPole worker.
TASK_UNITS = 400


class SessionLoop:
    """The stepping thread's work of a per-env worker session, without its connection.

    Args:
        env_id: A gymnasium id.
        n_envs: Env slots (K).
        step_seconds: Simulated seconds per env step (the flush timer's clock).
    """

    def __init__(self, env_id: str, n_envs: int, step_seconds: float) -> None:
        config = WorkerConfig("local:0")
        self.vec = VecWorker(n_envs=n_envs, env=EnvConfig(env_id), policy="mlp-categorical")
        self.book = TaskBook(self.vec)
        self.policy = FlushPolicy(config.flush_steps, config.flush_bytes, config.flush_seconds)
        self.memory = FlushMemory()
        self.step_seconds = step_seconds
        self.clock = 0.0
        self.stepped = 0
        self.sent_steps = 0
        self.results = 0
        self._tasks = 0
        self._episodes = 0

    def run(self, steps: int) -> int:
        """Steps until at least ``steps`` more steps were sent; returns how many were."""
        vec, book, policy = self.vec, self.book, self.policy
        start = self.sent_steps
        while self.sent_steps - start < steps:
            if book.queued_units < 2 * vec.n_envs:
                self._add_task()
            book.feed()
            started = self.clock
            taken = vec.step()
            self.stepped += taken
            self.clock += taken * self.step_seconds
            if not vec.finished_count:
                continue
            now, queued = self.clock, book.queued_units
            if queued:
                if policy.holds(now, vec.finished_steps, now - started):
                    continue
            elif not policy.due(
                now,
                finished_steps=vec.finished_steps,
                queued_units=queued,
                running=vec.active_count,
                slots=vec.n_envs,
                step_seconds=now - started,
            ):
                continue
            self._flush()
        return self.sent_steps - start

    def _add_task(self) -> None:
        self._tasks += 1
        first = self._episodes
        self._episodes += TASK_UNITS
        units = UnitColumns.seeded(0, self._tasks, np.arange(first, self._episodes))
        self.book.add(EpisodeTask(self._tasks, self._tasks, -1, 0), units)

    def _flush(self) -> None:
        self.policy.sent()
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
        self.memory.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--warmup", type=int, default=3_000)
    parser.add_argument("--step-us", type=float, default=11.0)
    parser.add_argument("--plain", action="store_true", help="the plain per-env loop instead")
    args = parser.parse_args()
    if args.plain:
        plain_loop(args.env, args.envs, args.warmup)
        run = plain_loop(args.env, args.envs, args.steps)
        print(f"plain loop: steps {run.steps} CPU {run.cpu / run.steps * 1e6:.3f} us/step")
        return
    loop = SessionLoop(args.env, args.envs, args.step_us * 1e-6)
    loop.run(args.warmup)
    cpu = time.process_time()
    steps, results = loop.run(args.steps), loop.results
    cpu = time.process_time() - cpu
    print(
        f"session loop: steps {steps} CPU {cpu / steps * 1e6:.3f} us/step, {results} results in all"
    )


if __name__ == "__main__":
    main()
