"""CPU of a worker's results booked by the coordinator, in batches as a result lane books them.

Run: ``python -m benchmarks.result_booking [--episodes 4] [--results 400] [--batch 2]
[--level scheduler|events|lane] [--rounds 5] [--episode-steps 100]``.

In one process, with no network or threads. ``scheduler``: a
:class:`~rlfleet.scheduling.scheduler.Scheduler` with one worker of 64 env
slots, holding a STEPS request's units in one task, judges results of
``--episodes`` episodes each (``classify_many``) and books them
(``complete_many``), ``--batch`` results at a time, as the result lane does
with the results it finds queued. ``events``: the same through the
coordinator's own :meth:`WorkerEvents.on_results` (both locks, the task's
expectation, the one-pass check of the result's bytes, the booking and the
counters), with CartPole results a ``VecWorker`` ran for the task's units.
``lane``: what a result lane does with each frame of those results before
and around ``on_results``: the parse, the size bound and the join.
CartPole's episodes under a random policy last about 22 steps, so a
4-episode result holds about 100 steps, an 80-episode one about 1,800;
``--episode-steps L`` (``lane`` only) books instead the results
``benchmarks.capacity``'s synthetic workers send (episodes of exactly ``L``
steps, serialized by :class:`~benchmarks.capacity_workers.ResultTemplate`):
with 100, the 400- and 8,000-step results of that benchmark's cartpole
shape, the work its result lanes do per result.
The worker holds enough units (``prefetch_factor``) that no refill runs
between the timed batches: the refill is not what this measures. Prints the
CPU of this thread (``time.thread_time_ns``) per result, best of
``--rounds``; under ``valgrind --tool=callgrind``, run it with
``--no-book`` as well (every round set up, no result booked): the
difference over ``--results`` times ``--rounds`` is the instructions per result.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from benchmarks.capacity_workers import ResultTemplate
from rlfleet.coordinator.calls import CallOutbox
from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.leases.result_lane import join_frame
from rlfleet.coordinator.registry import TaskDispatch, WorkerHandle
from rlfleet.coordinator.state import FleetState, OpenCall
from rlfleet.coordinator.worker_events import CAPABILITIES, WorkerEvents
from rlfleet.envs import EnvConfig
from rlfleet.protocol.join import EnvBuilt, TaskAssignment, WorkerHello
from rlfleet.protocol.modes import Mode
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler
from rlfleet.transport import rpc as _rpc
from rlfleet.v1 import worker_pb2
from rlfleet.wire import encode_env_spec
from rlfleet.wire.results import JoinedResult

SLOTS = 64
SEED = 7
EPISODE_STEPS = 100  # the scheduler level's lengths (a 4-episode result: 400 steps)


def _spec(request_index: int) -> RequestSpec:
    return RequestSpec(Mode.STEPS, 10**12, SEED, request_index, agent_version=0, env_generation=1)


def _start(scheduler: Scheduler) -> int:
    """Starts the STEPS request of index 1, the mean episode length known
    (else a STEPS request hands out a unit per slot only)."""
    first = scheduler.start_sample(RequestSpec(Mode.EPISODES, 1, SEED, 0, 0, 1))
    (order,) = scheduler.dispatch()
    scheduler.complete(order.worker_id, order.task_id, [0], [EPISODE_STEPS])
    scheduler.finish(first)
    return scheduler.start_sample(_spec(1))


def scheduler_round(episodes: int, results: int, batch: int, *, book: bool = True) -> int:
    """Nanoseconds of this thread's CPU to judge and book ``results`` results."""
    units = episodes * results + 1
    scheduler = Scheduler(prefetch_factor=units // SLOTS + 2, capacity_steps=0)
    scheduler.add_worker(1, SLOTS)
    scheduler.set_eligible(1, True)
    _start(scheduler)
    (order,) = scheduler.dispatch()
    # Past the first unit: the prefix waits for it, so results are only
    # stored, as most are (each worker of a fleet runs its own block of indices).
    held = order.units.episode_indices.tolist()[1:]
    lengths = (EPISODE_STEPS,) * episodes
    batches = []
    for start in range(0, episodes * results, episodes * batch):
        batches.append(
            [
                (order.task_id, tuple(held[k : k + episodes]), lengths)
                for k in range(start, start + episodes * batch, episodes)
            ]
        )
    spent = 0
    for entries in batches if book else ():
        begin = time.thread_time_ns()
        scheduler.classify_many(1, [(task, indices) for task, indices, _ in entries])
        scheduler.complete_many(1, entries)
        spent += time.thread_time_ns() - begin
    return spent


class EventsFleet:
    """A coordinator's state with one worker holding a STEPS request's units."""

    def __init__(self, units: int) -> None:
        config = CoordinatorConfig(
            env=EnvConfig("CartPole-v1"), prefetch_factor=units // SLOTS + 2, capacity_steps=0
        )
        self.state = FleetState(config)
        self.events = WorkerEvents(self.state)
        hello = WorkerHello(_rpc.PROTOCOL_VERSION, CAPABILITIES, num_envs=SLOTS, name="w")
        self.handle: WorkerHandle = self.events.admit(hello, "bench")
        spec = encode_env_spec(EnvConfig("CartPole-v1").env_spec())
        self.events.on_env_ready(
            self.handle, EnvBuilt(1, spec.SerializeToString(deterministic=True))
        )
        with self.state.lock:
            request_id = _start(self.state.scheduler)
            self.outbox = CallOutbox(request_id, subscription=False)
            self.state.calls[request_id] = OpenCall(self.outbox, wait_for_workers=10.0)
            self.state.dispatch()
        self.orders = []
        while not self.handle.outbox.empty():
            message = self.handle.outbox.get()
            if isinstance(message, TaskDispatch):
                self.orders.append(message.order)

    def drain(self) -> None:
        """Empties the learner's queue (as the call's thread would)."""
        while not self.outbox._queue.empty():
            self.outbox.get()


def event_results(episodes: int, results: int) -> list[JoinedResult]:
    """The worker's results for the units of the fleet's first task, run on CartPole."""
    from rlfleet.worker.units import make_units
    from rlfleet.worker.vec import VecWorker
    from tests._coordinator_fakes import joined, result_messages

    fleet = EventsFleet(episodes * results + 1)
    (order,) = fleet.orders
    held = order.units.episode_indices.tolist()[1:]  # off the prefix, as most are
    vec = VecWorker(n_envs=SLOTS, env=EnvConfig("CartPole-v1"), worker_number=1)
    try:
        pool: list[JoinedResult] = []
        for k in range(results):
            batch = vec.run(make_units(SEED, 1, held[k * episodes : (k + 1) * episodes]))
            messages = result_messages(
                batch, task_id=order.task_id, env_generation=1, batch_id=k + 1, max_bytes=1 << 22
            )
            pool.append(joined([_rpc.serialize(m) for m in messages]))
        return pool
    finally:
        vec.shutdown()


def event_frames(episodes: int, results: int) -> list[bytes]:
    """The frames a worker sends for :func:`event_results`' results (one chunk each)."""
    pool = event_results(episodes, results)
    frames = []
    for joined in pool:
        (chunk,) = joined.chunks
        meta = worker_pb2.EpisodeResult.FromString(joined.header.wire)  # chunk 0's, as sent
        message = _rpc.WithChunk(worker_pb2.WorkerMessage(result=meta), chunk)
        frames.append(bytes(_rpc.serialize(message)))
    return frames


def template_frames(episodes: int, results: int, episode_steps: int) -> list[bytes]:
    """The frames a synthetic worker of ``benchmarks.capacity`` sends for the
    units of the fleet's first task: ``results`` results of ``episodes``
    episodes of ``episode_steps`` steps each (one chunk each)."""
    fleet = EventsFleet(episodes * results + 1)
    (order,) = fleet.orders
    units = order.units
    # Past the first unit, as event_results' are.
    held = list(
        zip(
            units.episode_indices.tolist()[1:],
            units.env_seeds.tolist()[1:],
            units.policy_seeds.tolist()[1:],
            strict=True,
        )
    )
    template = ResultTemplate(EnvConfig("CartPole-v1").env_spec(), episode_steps, episodes)
    task = TaskAssignment(order.task_id, order.request_id, int(order.mode), 0, 1)
    frames = []
    for k in range(results):
        (frame,) = template.messages(
            held[k * episodes : (k + 1) * episodes],
            task=task,
            worker_id=fleet.handle.worker_id,
            agent_version=0,
            env_generation=1,
            batch_id=k + 1,
            max_message_bytes=1 << 24,
            chunk_bytes=1 << 22,
        )
        frames.append(frame)
    return frames


def lane_round(frames: list[bytes], episodes: int, batch: int, *, book: bool = True) -> int:
    """Nanoseconds of this thread's CPU to parse, bound, join and book ``frames``
    as a result lane does (``join_frame`` and ``on_results``, without its thread)."""
    fleet = EventsFleet(episodes * len(frames) + 1)
    handle, events = fleet.handle, fleet.events
    budget = handle.inflight.carrier()
    spent = 0
    for start in range(0, len(frames) if book else 0, batch):
        begin = time.thread_time_ns()
        results = []
        for frame in frames[start : start + batch]:
            joined = join_frame(events, handle, budget, frame)
            assert isinstance(joined, JoinedResult)  # the benchmark's own frames, one chunk each
            results.append(joined)
        fleet.events.on_results(handle, results, send_here=True)
        spent += time.thread_time_ns() - begin
        fleet.drain()
    return spent


def events_round(pool: list[JoinedResult], episodes: int, batch: int, *, book: bool = True) -> int:
    """Nanoseconds of this thread's CPU to book the results of ``pool`` with on_results."""
    fleet = EventsFleet(episodes * len(pool) + 1)
    spent = 0
    for start in range(0, len(pool) if book else 0, batch):
        begin = time.thread_time_ns()
        fleet.events.on_results(fleet.handle, pool[start : start + batch], send_here=True)
        spent += time.thread_time_ns() - begin
        fleet.drain()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4, help="episodes per result")
    parser.add_argument("--results", type=int, default=400, help="results per round")
    parser.add_argument("--batch", type=int, default=2, help="results booked at a time")
    parser.add_argument("--level", choices=("scheduler", "events", "lane"), default="scheduler")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the best is shown")
    parser.add_argument(
        "--episode-steps",
        type=int,
        default=0,
        help="lane level: episodes of exactly this many steps, as benchmarks.capacity's "
        "synthetic workers send them (0: CartPole episodes a VecWorker ran)",
    )
    parser.add_argument(
        "--no-book", action="store_true", help="set every round up, book nothing (callgrind's base)"
    )
    args = parser.parse_args()
    run: Callable[[], int]
    if args.level == "scheduler":

        def run() -> int:
            return scheduler_round(args.episodes, args.results, args.batch, book=not args.no_book)

    elif args.level == "lane":
        frames = (
            template_frames(args.episodes, args.results, args.episode_steps)
            if args.episode_steps > 0
            else event_frames(args.episodes, args.results)
        )

        def run() -> int:
            return lane_round(frames, args.episodes, args.batch, book=not args.no_book)

    else:
        pool = event_results(args.episodes, args.results)

        def run() -> int:
            return events_round(pool, args.episodes, args.batch, book=not args.no_book)

    best = min(run() for _ in range(args.rounds))
    per = best / max(args.results, 1) / 1000
    lengths = f" of {args.episode_steps} steps" if args.episode_steps > 0 else ""
    print(
        f"{args.level}: {args.results} results of {args.episodes} episodes{lengths}, "
        f"{args.batch} per batch: {per:.1f} us per result (best of {args.rounds})"
    )


if __name__ == "__main__":
    main()
