"""CPU time of episode units on their way from the scheduler to a worker's slots.

Run: ``python -m benchmarks.unit_path [--units 1200] [--result 400] [--rounds 55]``.

In one process, with no network: a coordinator's
:class:`~rlfleet.scheduling.scheduler.Scheduler` with one worker of 64 env
slots refills ``--units`` units of a STEPS request (episodes of 20 steps),
and the Task message is written as the coordinator writes it; the worker
side reads it (``parse_coordinator_message``) and takes it into a
``TaskBook`` over a native CartPole ``VecWorker``; the units of a refill are
booked back in results of ``--result`` episodes (the scheduler's judging,
the seeds the result is checked against, and the booking). Each is timed
with ``time.thread_time`` (CPU of this thread only, so other processes'
load inflates it little); the best of ``--rounds`` rounds is shown, for a
Task carrying its units as columns (workers with ``rlfleet.unit-columns``)
and as one ``EpisodeUnit`` message each. docs/data_plane.md quotes it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from rlfleet.coordinator.registry import TaskDispatch
from rlfleet.coordinator.worker_messages import task_message
from rlfleet.envs import EnvConfig
from rlfleet.protocol.join import TaskAssignment
from rlfleet.protocol.modes import Mode
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler
from rlfleet.worker._join_messages import parse_coordinator_message
from rlfleet.worker._tasks import TaskBook, book_entry
from rlfleet.worker.vec import VecWorker

EPISODE_STEPS = 20
SLOTS = 64
STAGES = ("refill: pick, seed, book, write the Task", "worker: read the Task", "worker: take it in")


def _timed(call: Callable[[], object]) -> tuple[float, object]:
    start = time.thread_time()
    value = call()
    return time.thread_time() - start, value


def _scheduler(units: int) -> Scheduler:
    """One worker whose refills are about ``units`` units, the mean length known."""
    scheduler = Scheduler(capacity_steps=2 * units * EPISODE_STEPS)
    scheduler.add_worker(1, SLOTS)
    scheduler.set_eligible(1, True)
    # One episode of EPISODE_STEPS steps sets the fleet's mean length.
    first = scheduler.start_sample(RequestSpec(Mode.EPISODES, 1, 7, 0, 0, 1))
    (order,) = scheduler.dispatch()
    scheduler.complete(1, order.task_id, [0], [EPISODE_STEPS])
    scheduler.finish(first)
    scheduler.start_sample(RequestSpec(Mode.STEPS, 10**9, 7, 1, 0, 1))
    return scheduler


def one_round(
    vec: VecWorker, units: int, result: int, *, unit_columns: bool
) -> tuple[int, list[float], float]:
    """Units of the refill, CPU seconds of each stage, and per booked episode."""
    scheduler = _scheduler(units)
    (first,) = scheduler.dispatch()
    held = first.units.episode_indices
    booking = 0.0
    for start in range(0, units, result):
        indices = tuple(held[start : start + result].tolist())  # as a result's header holds them

        def book(indices: tuple[int, ...] = indices) -> None:
            scheduler.classify(1, first.task_id, indices)
            seeds = scheduler.unit_seeds(first.task_id)
            positions, _ = seeds.positions(np.asarray(indices, dtype=np.int64))
            np.stack([seeds.env_seeds[positions], seeds.policy_seeds[positions]], axis=1)
            scheduler.complete(1, first.task_id, indices, [EPISODE_STEPS] * len(indices))

        booking += _timed(book)[0]
    booked = min(units, len(held))

    def refill() -> bytes:
        (order,) = scheduler.dispatch()
        message = task_message(TaskDispatch(order, unit_columns=unit_columns))
        return message.SerializeToString()

    refill_seconds, data = _timed(refill)
    assert isinstance(data, bytes)
    read_seconds, task = _timed(lambda: parse_coordinator_message(data))
    assert isinstance(task, TaskAssignment)
    task_book = TaskBook(vec)
    intake_seconds, _ = _timed(lambda: task_book.add(*book_entry(task)))
    task_book.drop([task.task_id])
    return len(task.units), [refill_seconds, read_seconds, intake_seconds], booking / booked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1200, help="units of a refill")
    parser.add_argument("--result", type=int, default=400, help="episodes per result")
    parser.add_argument("--rounds", type=int, default=55, help="rounds; the best is shown")
    args = parser.parse_args()
    vec = VecWorker(n_envs=SLOTS, env=EnvConfig("CartPole-v1", vectorization="vector_entry_point"))
    try:
        for unit_columns in (True, False):
            rounds = [
                one_round(vec, args.units, args.result, unit_columns=unit_columns)
                for _ in range(args.rounds + 1)
            ][1:]  # the first round warms up
            count = rounds[0][0]
            form = "columns" if unit_columns else "an EpisodeUnit message per unit"
            print(f"\nTask units as {form}: a refill of {count} units, best of {args.rounds}")
            for k, stage in enumerate(STAGES):
                best = min(r[1][k] for r in rounds)
                print(f"  {stage:44s} {best * 1e6:9.1f} us  {best / count * 1e9:7.0f} ns/unit")
            best = min(r[2] for r in rounds)
            stage = f"book a result of {args.result} episodes"
            print(f"  {stage:44s} {best * args.result * 1e6:9.1f} us  {best * 1e9:7.0f} ns/unit")
    finally:
        vec.shutdown()


if __name__ == "__main__":
    main()
