"""CPU of the scheduler's hand-outs: a request's first, and the refills after results.

Run: ``python -m benchmarks.handout [--what first|refill] [--count 100]
[--episodes 1] [--workers 2] [--envs 64]``.

In one process, with no network or threads: a
:class:`~rlfleet.scheduling.scheduler.Scheduler` with ``--workers`` eligible
workers of ``--envs`` env slots (``capacity_steps`` 16384, tail moves on),
the fleet's mean episode length known (100 steps). ``first``: ``--count``
EPISODES requests of ``--episodes`` episodes, each started, handed out
(``Scheduler.dispatch``) and finished, as a coordinator does with a
learner's requests. ``refill``: a STEPS request; ``--count`` results of 80
episodes of 100 steps booked from the workers in turn, each followed by a
dispatch, a fifth of which hand out. Prints the CPU of this thread
(``time.thread_time_ns``) per request or per result; under ``valgrind
--tool=callgrind``, run it with ``--count 0`` as well: the difference over
``--count`` is the instructions per request or per result.
"""

from __future__ import annotations

import argparse
import time

from rlfleet.protocol.modes import Mode
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler

EPISODE_STEPS = 100
RESULT_EPISODES = 80


def _spec(mode: Mode, amount: int, index: int) -> RequestSpec:
    return RequestSpec(mode, amount, index, index, agent_version=0, env_generation=0)


def fleet(workers: int, envs: int) -> Scheduler:
    """A scheduler with eligible workers, the mean episode length known."""
    scheduler = Scheduler(capacity_steps=16384, move_units=True)
    for worker_id in range(1, workers + 1):
        scheduler.add_worker(worker_id, envs)
        scheduler.set_eligible(worker_id, True)
    first = scheduler.start_sample(_spec(Mode.EPISODES, 1, 0))
    (order,) = scheduler.dispatch()
    scheduler.complete(order.worker_id, order.task_id, [0], [EPISODE_STEPS])
    scheduler.finish(first)
    return scheduler


def first_handouts(scheduler: Scheduler, count: int, episodes: int) -> int:
    """Nanoseconds of this thread's CPU to start, hand out and finish ``count`` requests."""
    begin = time.thread_time_ns()
    for index in range(1, count + 1):
        request_id = scheduler.start_sample(_spec(Mode.EPISODES, episodes, index))
        scheduler.dispatch()
        scheduler.finish(request_id)
    return time.thread_time_ns() - begin


def refills(scheduler: Scheduler, count: int) -> tuple[int, int]:
    """Nanoseconds of this thread's CPU to book ``count`` results and dispatch
    after each, and how many of those dispatches handed out."""
    scheduler.start_sample(_spec(Mode.STEPS, 10**12, 1))
    held: dict[int, tuple[int, list[int]]] = {}
    workers = len(scheduler._books.workers)
    handed = 0
    begin = time.thread_time_ns()
    for index in range(-1, count):
        if index >= 0:
            worker_id = 1 + index % workers
            task_id, units = held[worker_id]
            done = tuple(units[:RESULT_EPISODES])
            held[worker_id] = (task_id, units[RESULT_EPISODES:])
            scheduler.complete_many(worker_id, [(task_id, done, (EPISODE_STEPS,) * len(done))])
        orders = scheduler.dispatch()
        handed += bool(orders) and index >= 0
        for order in orders:
            units = held.get(order.worker_id, (order.task_id, []))[1]
            held[order.worker_id] = (order.task_id, units + order.units.episode_indices.tolist())
    return time.thread_time_ns() - begin, handed


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark (``argv``: its arguments, else the command line's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("first", "refill"), default="first")
    parser.add_argument("--count", type=int, default=100, help="requests or results")
    parser.add_argument("--episodes", type=int, default=1, help="episodes per request (first)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs", type=int, default=64, help="env slots per worker")
    args = parser.parse_args(argv)
    scheduler = fleet(args.workers, args.envs)
    if args.what == "first":
        spent = first_handouts(scheduler, args.count, args.episodes)
        each = spent / max(args.count, 1) / 1000
        print(f"first hand-out of {args.episodes}-episode requests: {each:.1f} us per request")
    else:
        spent, handed = refills(scheduler, args.count)
        each = spent / max(args.count, 1) / 1000
        print(
            f"{args.count} results booked, {handed} refills handing out: {each:.1f} us per result"
        )


if __name__ == "__main__":
    main()
