"""A worker's results booked as one batch are booked as one at a time would be.

The lease data channel's lane books every result it holds at once
(``WorkerEvents.on_results``: one lock to judge them, the checks outside it,
one lock to book them and one refill). Whatever the batch holds (honest
results, a duplicate, a result of a task that is over, one of a request that
ended in the batch, one of a task never sent, a result whose seeds are not
its units'), the learner's call gets the same events, the scheduler holds
the same units, the same refusal is counted and the same error is raised
(with its text) as when each result is booked alone, in order, until the
first error. In process: a real ``FleetState`` and ``WorkerEvents``, results
run by a real ``VecWorker`` on CartPole and read by the coordinator's own
parser.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from rlfleet.coordinator.calls import CallOutbox, Finished, Forward
from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.registry import TaskDispatch, WorkerHandle
from rlfleet.coordinator.state import FleetState, OpenCall
from rlfleet.coordinator.worker_events import CAPABILITIES, WorkerEvents
from rlfleet.envs import EnvConfig
from rlfleet.errors import ProtocolError, WireFormatError
from rlfleet.protocol.join import EnvBuilt, WorkerHello
from rlfleet.protocol.modes import Mode
from rlfleet.scheduling.scheduler import RequestSpec
from rlfleet.scheduling.units import EpisodeRequest
from rlfleet.transport import rpc as _rpc
from rlfleet.wire import encode_env_spec
from rlfleet.wire.results import JoinedResult
from rlfleet.worker.units import EpisodeUnit, make_units
from rlfleet.worker.vec import VecWorker
from tests._coordinator_fakes import joined, result_messages

SEED = 5
FIRST_AMOUNT = 2  # episodes of the request that ends before the batches
AMOUNT = 4  # episodes of the request the batches answer


@dataclass
class Fleet:
    """A coordinator's state with one worker that ran a request, and holds a second's units."""

    state: FleetState
    events: WorkerEvents
    handle: WorkerHandle
    outbox: CallOutbox
    request_id: int
    tasks: list[int]


def start(state: FleetState, request_index: int, amount: int) -> tuple[int, CallOutbox]:
    with state.lock:
        spec = RequestSpec(
            Mode.EPISODES, amount, SEED, request_index, agent_version=0, env_generation=1
        )
        request_id = state.scheduler.start_sample(spec)
        outbox = CallOutbox(request_id, subscription=False)
        state.calls[request_id] = OpenCall(outbox, wait_for_workers=10.0)
        state.dispatch()
    return request_id, outbox


def tasks_sent(handle: WorkerHandle) -> list[int]:
    sent = []
    while not handle.outbox.empty():
        message = handle.outbox.get()
        if isinstance(message, TaskDispatch):
            sent.append(message.order.task_id)
    return sent


def new_fleet(first_result: JoinedResult | None) -> Fleet:
    state = FleetState(CoordinatorConfig(env=EnvConfig("CartPole-v1")))
    events = WorkerEvents(state)
    hello = WorkerHello(_rpc.PROTOCOL_VERSION, CAPABILITIES, num_envs=2, name="w")
    handle = events.admit(hello, "test")
    spec = encode_env_spec(EnvConfig("CartPole-v1").env_spec())
    events.on_env_ready(handle, EnvBuilt(1, spec.SerializeToString(deterministic=True)))
    request_id, outbox = start(state, 0, FIRST_AMOUNT)
    if first_result is None:  # the first request's task, to run its result
        return Fleet(state, events, handle, outbox, request_id, tasks_sent(handle))
    events.on_results(handle, (first_result,))  # request 0 ends: its task is over
    tasks_sent(handle)
    request_id, outbox = start(state, 1, AMOUNT)
    return Fleet(state, events, handle, outbox, request_id, tasks_sent(handle))


class Results:
    """Results of the second request's units, of the first's, and spoiled ones."""

    def __init__(self) -> None:
        self.vec = VecWorker(n_envs=2, env=EnvConfig("CartPole-v1"), worker_number=1)
        self.batch_ids = iter(range(1, 1000))

    def result(self, task_id: int, units: list[EpisodeUnit]) -> JoinedResult:
        batch = self.vec.run(units)
        messages = result_messages(
            batch, task_id=task_id, env_generation=1, batch_id=next(self.batch_ids), max_bytes=700
        )
        return joined([_rpc.serialize(m) for m in messages])

    def close(self) -> None:
        self.vec.shutdown()


@pytest.fixture(scope="module")
def pool() -> dict[str, JoinedResult]:
    results = Results()
    try:
        template = new_fleet(None)
        first_task = template.tasks[0]
        first = results.result(first_task, make_units(SEED, 0, range(FIRST_AMOUNT)))
        fleet = new_fleet(first)
        (task,) = set(fleet.tasks)
        assert fleet.state.scheduler.unit_seeds(task).episode_indices.tolist() == [0, 1, 2, 3]

        def of(*indices: int) -> JoinedResult:
            return results.result(task, make_units(SEED, 1, indices))

        forged = make_units(SEED, 1, [0, 1])
        forged[1] = EpisodeUnit(1, forged[1].env_seed + 1, forged[1].policy_seed)
        return {
            "first": first,
            "0-1": of(0, 1),
            "2-3": of(2, 3),
            "1-2": of(1, 2),  # overlaps both
            "0-1 seeds forged": results.result(task, forged),
            "stale": results.result(first_task, make_units(SEED, 0, [2, 3])),
            "never sent": results.result(task + 50, make_units(SEED, 1, [0])),
        }
    finally:
        results.close()


def outcome(fleet: Fleet, error: Exception | None) -> dict[str, Any]:
    """What the booking left: the learner's events, the units out, refusals,
    the error, the counts of results forwarded and episodes thrown away."""
    events: list[Any] = []
    while not fleet.outbox._queue.empty():
        event = fleet.outbox.get()
        if isinstance(event, Forward):
            events.append(("forward", event.header.task_id, event.header.episode_indices))
        elif isinstance(event, Finished):
            events.append(("finished", event.footer.num_episodes, event.footer.total_steps))
        else:
            events.append((type(event).__name__, str(event)))
    call = fleet.state.calls.get(fleet.request_id)
    registry = fleet.state.metrics.registry
    return {
        "metrics": [
            registry.get_sample_value(f"rlfleet_{name}_total")
            for name in ("results", "result_bytes", "units_lost")
        ],
        "events": events,
        "units out": fleet.state.scheduler.units_in_flight(fleet.handle.worker_id),
        "refused": None if call is None else call.refused_results,
        "error": None if error is None else (type(error).__name__, str(error)),
        "tasks sent": tasks_sent(fleet.handle),
    }


def one_at_a_time(pool: dict[str, JoinedResult], names: list[str]) -> dict[str, Any]:
    fleet = new_fleet(pool["first"])
    error = None
    for name in names:
        try:
            fleet.events.on_results(fleet.handle, (pool[name],))
        except (ProtocolError, WireFormatError) as exc:
            error = exc
            break  # the worker is dropped: nothing after it is booked
    return outcome(fleet, error)


def batched(pool: dict[str, JoinedResult], names: list[str]) -> dict[str, Any]:
    fleet = new_fleet(pool["first"])
    error = None
    try:
        fleet.events.on_results(fleet.handle, [pool[name] for name in names])
    except (ProtocolError, WireFormatError) as exc:
        error = exc
    return outcome(fleet, error)


CASES = [
    ["0-1", "2-3"],
    ["0-1", "0-1", "2-3"],  # a duplicate
    ["0-1", "2-3", "1-2"],  # late: its request ended in the batch
    ["stale", "0-1", "1-2"],  # a task that is over, then an overlap
    ["0-1", "0-1 seeds forged", "2-3"],  # refused by its check
    ["2-3", "0-1", "0-1 seeds forged", "1-2"],  # late ones, one would fail its check
    ["0-1", "never sent", "2-3"],
]


@pytest.mark.parametrize("names", CASES, ids=["+".join(c) for c in CASES])
def test_a_batch_is_booked_as_its_results_one_at_a_time(
    pool: dict[str, JoinedResult], names: list[str]
) -> None:
    assert batched(pool, names) == one_at_a_time(pool, names)


def test_random_batches_are_booked_as_their_results_one_at_a_time(
    pool: dict[str, JoinedResult],
) -> None:
    rng = random.Random(11)
    names = sorted(set(pool) - {"first"})
    for _ in range(150):
        drawn = [rng.choice(names) for _ in range(rng.randint(1, 6))]
        assert batched(pool, drawn) == one_at_a_time(pool, drawn), drawn


def test_results_of_one_task_are_judged_with_one_search_unless_one_is_wrong(
    pool: dict[str, JoinedResult],
) -> None:
    fleet = new_fleet(pool["first"])
    scheduler, worker = fleet.state.scheduler, fleet.handle.worker_id
    (task,) = set(fleet.tasks)
    for names in (["0-1", "2-3"], ["0-1", "1-2"], ["0-1", "0-1"], ["stale", "2-3"]):
        batch = [(pool[n].header.task_id, pool[n].header.episode_indices) for n in names]
        alone = [scheduler.classify(worker, t, indices) for t, indices in batch]
        assert scheduler.classify_many(worker, batch) == alone
    assert task in fleet.tasks


def test_a_tasks_expectation_is_kept_until_what_it_is_made_of_changes() -> None:
    """Batch after batch a task's results are checked against one expectation,
    made again once its units grow (a refill), the latest agent version or
    the env changes; an ended request's are dropped."""
    fleet = new_fleet(None)
    state, events, handle = fleet.state, fleet.events, fleet.handle
    (task,) = set(fleet.tasks)
    env_spec = state.env.spec
    assert env_spec is not None

    def expect(latest: int = 0, spec: Any = env_spec) -> Any:
        with state.lock:
            return events._expectations.get(
                handle, task, fleet.request_id, spec, latest, native=False
            )

    first = expect()
    assert expect() is first
    assert first.units.episode_indices.tolist() == [0, 1]
    assert expect(latest=1) is not first
    assert expect(latest=1).latest_agent_version == 1
    assert expect(spec=EnvConfig("CartPole-v1").env_spec()) is not expect()
    again = expect()
    request = state.scheduler._books.requests[fleet.request_id]
    assert isinstance(request, EpisodeRequest)
    state.scheduler._books.tasks[task].units.add(request.units(np.array([7, 9])))
    refilled = expect()
    assert refilled is not again
    assert refilled.units.episode_indices.tolist() == [0, 1, 7, 9]
    events._expectations.forget(fleet.request_id)
    assert expect() is not refilled


def test_a_lanes_result_is_parsed_checked_and_booked_in_few_python_calls() -> None:
    """From its frame to its booking (the parse, the size bound, the join and
    ``on_results`` with one result per batch, as a result lane books a lone
    result), a 4-episode CartPole result of a learned layout and a kept
    expectation runs a bounded number of Python frames: the layers between
    the compiled calls, counted so that none creeps back."""
    import sys
    from types import FrameType

    from benchmarks.result_booking import EventsFleet, event_frames
    from rlfleet.coordinator.leases.result_lane import join_frame

    frames = event_frames(4, 4)
    calls = 0

    def count(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    # The first fleet books them all: the layout's skeletons for their
    # counts are kept in the process, as a lane's are after its first results.
    for counted in (False, True):
        fleet = EventsFleet(4 * 400 + 1)  # units enough that no refill runs between them
        handle, events = fleet.handle, fleet.events
        budget = handle.inflight.carrier()
        for number, frame in enumerate(frames):
            if counted and number >= 2:  # the layout learned, the expectation kept
                sys.setprofile(count)
            try:
                joined = join_frame(events, handle, budget, frame)
                assert isinstance(joined, JoinedResult)
                events.on_results(handle, [joined], send_here=True)
            finally:
                sys.setprofile(None)
            fleet.drain()
    # Two results counted: 147 calls when each ruling was made anew, the
    # counters were Prometheus's and a batch was grouped by task; 105 while
    # the header and chunk were made in Python and a whole result went
    # through join_chunk; 89 while the refill's look listed the eligible
    # workers before it looked at their marks; 81 now (docs/performance.md,
    # "Coordinator capacity: where a result's CPU goes").
    assert calls <= 81, calls
