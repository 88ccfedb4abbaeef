"""Units moved at a request's tail from a busy worker to one that ran out, without gRPC."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.core.seeding import episode_seeds
from rlfleet.protocol.modes import Mode
from rlfleet.scheduling import tail_moves
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler, TaskOrder, Verdict

LENGTH = 10  # every episode's length: capacity_steps 200 is 20 units a worker


def spec(mode: Mode, amount: int, **kw: int) -> RequestSpec:
    fields = {"seed": 7, "request_index": 3, "agent_version": 2, "env_generation": 1}
    fields.update(kw)
    return RequestSpec(mode=mode, amount=amount, **fields)


def fleet(*num_envs: int, move_units: bool = True) -> Scheduler:
    scheduler = Scheduler(prefetch_factor=1, capacity_steps=200, move_units=move_units)
    for worker_id, n in enumerate(num_envs, start=1):
        scheduler.add_worker(worker_id, n)
        scheduler.set_eligible(worker_id, True)
    return scheduler


def warmed(scheduler: Scheduler) -> None:
    """Runs a first request so that the fleet's mean episode length is known."""
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 1, request_index=0))
    (order,) = scheduler.dispatch()
    (index, *_) = order.units.episode_indices.tolist()
    assert scheduler.complete(order.worker_id, order.task_id, [index], [LENGTH]).done
    scheduler.finish(request_id)


def complete(scheduler: Scheduler, worker_id: int, task_id: int, indices: list[int]) -> Verdict:
    ruling = scheduler.complete(worker_id, task_id, indices, [LENGTH] * len(indices))
    return ruling.verdict


@pytest.fixture
def small_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 steps: two units of 10 are worth a move in these small fleets.
    monkeypatch.setattr(tail_moves, "MOVE_MIN_STEPS", 20)


def tail(scheduler: Scheduler) -> tuple[TaskOrder, TaskOrder]:
    """An EPISODES request of 40 dealt to two workers of 2 slots (20 units each),
    worker 1's units all back: its refill finds none left."""
    scheduler.start_sample(spec(Mode.EPISODES, 40))
    first, second = scheduler.dispatch()
    assert (first.worker_id, second.worker_id, len(first.units), len(second.units)) == (
        1,
        2,
        20,
        20,
    )
    assert (
        complete(scheduler, 1, first.task_id, first.units.episode_indices.tolist())
        is Verdict.ACCEPT
    )
    return first, second


@pytest.mark.usefixtures("small_floor")
def test_a_worker_out_of_units_takes_the_busiest_workers_unstarted_tail() -> None:
    scheduler = fleet(2, 2)
    warmed(scheduler)
    _, second = tail(scheduler)
    (moved,) = scheduler.dispatch()
    (cancel,) = scheduler.take_cancels()
    held = second.units.episode_indices.tolist()
    # Worker 2 holds 18 beyond its 2 running slots, worker 1 none and 2 idle
    # slots: 10 move, and both hold 10 (8 queued beyond their slots).
    assert moved.worker_id == 1 and cancel.worker_id == 2 and cancel.task_id == second.task_id
    assert list(cancel.episode_indices) == held[-10:]  # the last dealt, least likely started
    assert moved.units.episode_indices.tolist() == held[-10:]
    for unit in moved.units:
        assert (unit.env_seed, unit.policy_seed) == episode_seeds(7, 3, unit.episode_index)
    assert scheduler.units_in_flight(1) == scheduler.units_in_flight(2) == 10
    assert scheduler.moved_units == 10
    assert scheduler.dispatch() == [] and scheduler.take_cancels() == []  # balanced now


def test_no_move_is_worth_less_than_the_floor() -> None:
    scheduler = fleet(2, 2)
    warmed(scheduler)
    tail(scheduler)  # 10 units of 10 steps: below MOVE_MIN_STEPS (128)
    assert scheduler.dispatch() == [] and scheduler.take_cancels() == []


@pytest.mark.usefixtures("small_floor")
def test_with_moves_off_a_worker_out_of_units_takes_none_and_the_busy_one_runs_its_own() -> None:
    # The tail from which 10 units move with moves on
    # (test_a_worker_out_of_units_takes_the_busiest_workers_unstarted_tail).
    scheduler = fleet(2, 2, move_units=False)
    warmed(scheduler)
    first, second = tail(scheduler)
    assert scheduler.dispatch() == [] and scheduler.take_cancels() == []
    assert scheduler.moved_units == 0
    assert (scheduler.units_in_flight(1), scheduler.units_in_flight(2)) == (0, 20)
    held = second.units.episode_indices.tolist()
    ruling = scheduler.complete(2, second.task_id, held, [LENGTH] * len(held))
    assert ruling.verdict is Verdict.ACCEPT and ruling.done
    assert sorted([*first.units.episode_indices.tolist(), *held]) == list(range(40))


@pytest.mark.usefixtures("small_floor")
def test_subscriptions_move_no_units() -> None:
    scheduler = fleet(2, 2)
    warmed(scheduler)
    scheduler.start_subscription(spec(Mode.EPISODES, 0, max_buffered_steps=10**9))
    orders = scheduler.dispatch()
    for order in orders:
        done = order.units.episode_indices.tolist()
        if order.worker_id == 1:
            complete(scheduler, 1, order.task_id, done)
    scheduler.dispatch()
    assert scheduler.take_cancels() == []


def run_to_end(scheduler: Scheduler, booked: list[int], live: list[TaskOrder]) -> None:
    """Completes every order still live, one order at a time, dispatching after each."""
    while live:
        order = live.pop(0)
        pending = scheduler.take_cancels()
        dropped = {i for c in pending if c.task_id == order.task_id for i in c.episode_indices}
        indices = [i for i in order.units.episode_indices.tolist() if i not in dropped]
        if indices:
            verdict = complete(scheduler, order.worker_id, order.task_id, indices)
            if verdict is Verdict.ACCEPT:
                booked.extend(indices)
        live.extend(scheduler.dispatch())


@pytest.mark.usefixtures("small_floor")
def test_the_old_workers_late_result_is_ignored_after_the_new_workers_is_booked() -> None:
    scheduler = fleet(2, 2)
    warmed(scheduler)
    first, second = tail(scheduler)
    booked = first.units.episode_indices.tolist()
    (moved,) = scheduler.dispatch()
    scheduler.take_cancels()
    moved_indices = moved.units.episode_indices.tolist()
    assert complete(scheduler, 1, moved.task_id, moved_indices) is Verdict.ACCEPT
    booked += moved_indices
    # Worker 2 ran one of them before the Cancel arrived: its result, with a
    # unit it still holds, is ignored (not rejected); that unit goes back.
    kept = second.units.episode_indices.tolist()[0]
    ruling = scheduler.complete(2, second.task_id, [kept, moved_indices[0]], [LENGTH] * 2)
    assert ruling.verdict is Verdict.IGNORE and "moved to another worker" in ruling.reason
    assert ruling.requeued == 1
    # A unit that came back never rejoins the task it was taken from.
    again = scheduler.dispatch()
    assert all(
        o.task_id not in (first.task_id, second.task_id)
        for o in again
        if kept in o.units.episode_indices
    )
    assert any(kept in o.units.episode_indices.tolist() for o in again)
    rest = [
        i for i in second.units.episode_indices.tolist() if i not in moved_indices and i != kept
    ]
    assert complete(scheduler, 2, second.task_id, rest) is Verdict.ACCEPT
    booked += rest
    run_to_end(scheduler, booked, again)
    assert sorted(booked) == list(range(40))  # every unit booked once


@pytest.mark.usefixtures("small_floor")
def test_the_old_workers_result_arriving_first_is_ignored_and_the_new_workers_booked() -> None:
    scheduler = fleet(2, 2)
    warmed(scheduler)
    first, second = tail(scheduler)
    booked = first.units.episode_indices.tolist()
    (moved,) = scheduler.dispatch()
    scheduler.take_cancels()
    moved_indices = moved.units.episode_indices.tolist()
    # Worker 2 sent only moved units before the Cancel landed: nothing goes back.
    ruling = scheduler.complete(2, second.task_id, moved_indices[:3], [LENGTH] * 3)
    assert ruling.verdict is Verdict.IGNORE and ruling.requeued == 0
    assert scheduler.classify(2, second.task_id, moved_indices[:3]).verdict is Verdict.IGNORE
    assert complete(scheduler, 1, moved.task_id, moved_indices) is Verdict.ACCEPT
    booked += moved_indices
    rest = [i for i in second.units.episode_indices.tolist() if i not in moved_indices]
    ruling = scheduler.complete(2, second.task_id, rest, [LENGTH] * len(rest))
    assert ruling.verdict is Verdict.ACCEPT and ruling.done
    booked += rest
    assert sorted(booked) == list(range(40))
    # A moved unit sent twice by its new worker is still a protocol error.
    assert scheduler.classify(1, moved.task_id, moved_indices[:1]).verdict is not Verdict.ACCEPT


@pytest.mark.usefixtures("small_floor")
@pytest.mark.parametrize("lost", [1, 2])
def test_a_worker_lost_after_a_move_has_its_units_rerun_once(lost: int) -> None:
    scheduler = fleet(2, 2)
    warmed(scheduler)
    first, second = tail(scheduler)
    booked = first.units.episode_indices.tolist()
    (moved,) = scheduler.dispatch()
    scheduler.take_cancels()
    moved_indices = moved.units.episode_indices.tolist()
    kept = [i for i in second.units.episode_indices.tolist() if i not in moved_indices]
    # Worker 1 now holds the moved units, worker 2 the rest.
    requeued = scheduler.remove_worker(lost)
    assert requeued == len(moved_indices if lost == 1 else kept)
    survivor = 3 - lost
    live = scheduler.dispatch()
    assert live and {o.worker_id for o in live} == {survivor}
    if survivor == 2:
        live.append(second)  # its own units still run
    else:
        live.append(moved)
    run_to_end(scheduler, booked, live)
    assert sorted(booked) == list(range(40))


@pytest.mark.usefixtures("small_floor")
def test_books_stay_consistent_over_many_moves() -> None:
    """A STEPS request over three workers, one of them slow: every result is
    booked or ignored, the counts of units in flight match what is left, and
    the answer is the prefix of the episodes with their lengths."""
    scheduler = fleet(2, 2, 2)
    warmed(scheduler)
    rng = np.random.default_rng(5)
    request_id = scheduler.start_sample(spec(Mode.STEPS, 600))
    live = scheduler.dispatch()
    booked: list[int] = []
    cancelled: dict[int, set[int]] = {}
    done = False
    while not done:
        for cancel in scheduler.take_cancels():
            cancelled.setdefault(cancel.task_id, set()).update(cancel.episode_indices)
        # Worker 3 is slow: it reports only every fourth turn.
        choices = [o for o in live if o.worker_id != 3 or rng.random() < 0.25] or live
        order = choices[int(rng.integers(len(choices)))]
        live.remove(order)
        indices = order.units.episode_indices.tolist()
        # Now and then a worker sends a unit already cancelled (sent before the Cancel landed).
        gone = cancelled.get(order.task_id, set())
        late = [i for i in indices if i in gone]
        sent = [i for i in indices if i not in gone]
        if late and rng.random() < 0.5:
            sent = sorted([*sent, late[0]])
        if sent:
            ruling = scheduler.complete(order.worker_id, order.task_id, sent, [LENGTH] * len(sent))
            assert ruling.verdict is not Verdict.REJECT, ruling.reason
            if ruling.verdict is Verdict.ACCEPT:
                booked.extend(sent)
                done = ruling.done
        live.extend(scheduler.dispatch())
    assert len(booked) == len(set(booked))  # none twice
    assert scheduler.footer(request_id).num_episodes == 60  # 60 episodes of 10 reach 600
    assert set(range(60)) <= set(booked)
    assert scheduler.moved_units > 0
