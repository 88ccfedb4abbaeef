"""The coordinator's scheduling state machine, without gRPC or threads."""

from __future__ import annotations

import cProfile
import gc
import math
import pstats

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.core.seeding import episode_seeds, episode_seeds_many
from rlfleet.errors import InvalidValueError
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.scheduling import units as units_module
from rlfleet.scheduling.scheduler import (
    CancelOrder,
    RequestSpec,
    ResultRuling,
    Scheduler,
    TaskOrder,
    Verdict,
)


def spec(mode: Mode, amount: int, **kw: int) -> RequestSpec:
    fields = {"seed": 7, "request_index": 3, "agent_version": 2, "env_generation": 1}
    fields.update(kw)
    return RequestSpec(mode=mode, amount=amount, **fields)


def fleet(*num_envs: int, prefetch: int = 1, capacity_steps: int = 0) -> Scheduler:
    """Workers of these env counts; capacities in units only unless capacity_steps."""
    scheduler = Scheduler(prefetch_factor=prefetch, capacity_steps=capacity_steps)
    for worker_id, n in enumerate(num_envs, start=1):
        scheduler.add_worker(worker_id, n)
        scheduler.set_eligible(worker_id, True)
    return scheduler


def indices(order: TaskOrder) -> list[int]:
    return [unit.episode_index for unit in order.units]


def by_worker(orders: list[TaskOrder]) -> dict[int, list[int]]:
    return {order.worker_id: indices(order) for order in orders}


def finish_units(
    scheduler: Scheduler, order: TaskOrder, lengths: dict[int, int], only: list[int] | None = None
) -> ResultRuling:
    done = only if only is not None else indices(order)
    return scheduler.complete(order.worker_id, order.task_id, done, [lengths[i] for i in done])


def test_every_env_slot_is_filled_before_any_prefetch() -> None:
    scheduler = fleet(2, 1)  # capacities 4 and 2
    scheduler.start_sample(spec(Mode.EPISODES, 10))
    orders = scheduler.dispatch()
    # Pass 1: a unit per slot (w1: 0, 1; w2: 2); pass 2: prefetch (w1: 3, 4; w2: 5).
    assert by_worker(orders) == {1: [0, 1, 3, 4], 2: [2, 5]}
    assert scheduler.dispatch() == []  # everyone is full


def test_units_carry_the_request_seeds_and_state() -> None:
    scheduler = fleet(2)
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 2))
    (order,) = scheduler.dispatch()
    assert (order.request_id, order.mode, order.agent_version, order.env_generation) == (
        request_id,
        Mode.EPISODES,
        2,
        1,
    )
    for unit in order.units:
        assert (unit.env_seed, unit.policy_seed) == episode_seeds(7, 3, unit.episode_index)
    # Kept for checking results: the same seeds, without deriving them again.
    assert scheduler.unit_seeds(order.task_id) == order.units
    assert len(scheduler.unit_seeds(order.task_id + 99)) == 0


def test_steps_limits_units_to_what_the_average_length_says_is_needed() -> None:
    scheduler = fleet(2)  # capacity 4
    scheduler.start_sample(spec(Mode.STEPS, 100))
    (first,) = scheduler.dispatch()
    assert indices(first) == [0, 1]  # no length known: one per env slot, no prefetch
    finish_units(scheduler, first, {0: 10}, only=[0])
    # 10 steps done, 90 to go at 10 per episode: 9 needed, 1 outstanding,
    # so the worker may fill its capacity: 3 more.
    assert by_worker(scheduler.dispatch()) == {1: [2, 3, 4]}


def test_steps_stops_generating_once_completed_episodes_reach_the_amount() -> None:
    scheduler = fleet(4, prefetch=0)
    scheduler.start_sample(spec(Mode.STEPS, 25))
    (order,) = scheduler.dispatch()
    assert indices(order) == [0, 1, 2, 3]
    finish_units(scheduler, order, {1: 20, 2: 10}, only=[1, 2])
    # 30 >= 25 steps completed, but episode 0 is missing from the prefix:
    # nothing new is generated, the request waits for episode 0.
    assert scheduler.dispatch() == []


def test_steps_answer_is_the_shortest_prefix_reaching_the_amount() -> None:
    scheduler = fleet(4, prefetch=0)
    request_id = scheduler.start_sample(spec(Mode.STEPS, 30))
    (order,) = scheduler.dispatch()
    lengths = {0: 10, 1: 20, 2: 10, 3: 5}
    assert not finish_units(scheduler, order, lengths, only=[1, 2]).done
    outcome = finish_units(scheduler, order, lengths, only=[0])
    assert outcome.verdict is Verdict.ACCEPT and outcome.done
    footer = scheduler.footer(request_id)
    # Prefix 0..1 holds 10 + 20 = 30, exactly the amount; episode 2 was surplus.
    assert (footer.num_episodes, footer.total_steps, footer.workers_used) == (2, 30, 1)
    assert scheduler.finish(request_id) == [CancelOrder(1, order.task_id, (3,))]


def test_episodes_mode_ends_after_exactly_amount_episodes() -> None:
    scheduler = fleet(2, prefetch=0)
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 3))
    (first,) = scheduler.dispatch()
    assert not finish_units(scheduler, first, {0: 4, 1: 6}).done
    (second,) = scheduler.dispatch()
    assert indices(second) == [2]
    assert finish_units(scheduler, second, {2: 5}).done
    footer = scheduler.footer(request_id)
    assert (footer.num_episodes, footer.total_steps) == (3, 15)
    assert scheduler.dispatch() == []


def test_an_episode_range_runs_exactly_its_indices_with_their_seeds() -> None:
    """A request cut over several coordinators (docs/sharding.md): episodes
    first_episode..first_episode+amount-1, with the seeds they have in the whole request."""
    scheduler = fleet(2, prefetch=1)  # capacity 4
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 5, first_episode=40))
    (first,) = scheduler.dispatch()
    assert indices(first) == [40, 41, 42, 43]
    for unit in first.units:
        assert (unit.env_seed, unit.policy_seed) == episode_seeds(7, 3, unit.episode_index)
    assert not finish_units(scheduler, first, dict.fromkeys(range(40, 44), 3)).done
    (second,) = scheduler.dispatch()
    assert indices(second) == [44]
    assert finish_units(scheduler, second, {44: 3}).done
    footer = scheduler.footer(request_id)
    assert (footer.num_episodes, footer.total_steps) == (5, 15)
    assert scheduler.dispatch() == []


def test_an_episode_range_is_for_episodes_requests_only() -> None:
    with pytest.raises(InvalidValueError, match="first_episode is for EPISODES requests"):
        fleet(1).start_sample(spec(Mode.STEPS, 5, first_episode=40))


def test_lost_units_are_rerun_before_new_ones_with_the_same_seeds() -> None:
    scheduler = fleet(2, 2, prefetch=0)
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 6))
    orders = scheduler.dispatch()
    assert by_worker(orders) == {1: [0, 1], 2: [2, 3]}
    lost = orders[0]
    assert scheduler.remove_worker(1) == 2
    finish_units(scheduler, orders[1], {2: 1, 3: 1})
    (rerun,) = scheduler.dispatch()
    assert rerun.worker_id == 2 and indices(rerun) == [0, 1]
    assert rerun.units == lost.units  # same seeds
    assert scheduler.footer(request_id).reassigned_units == 2


def test_results_of_a_lost_worker_are_ignored() -> None:
    scheduler = fleet(1, 1, prefetch=0)
    scheduler.start_sample(spec(Mode.EPISODES, 2))
    orders = scheduler.dispatch()
    scheduler.remove_worker(1)
    outcome = scheduler.classify(1, orders[0].task_id, indices(orders[0]))
    assert outcome.verdict is Verdict.IGNORE


@pytest.mark.parametrize(
    ("task_offset", "worker_id", "episodes", "reason"),
    [
        (100, 1, [0], "never sent"),
        (0, 2, [0], "another worker"),
        (0, 1, [5], "not units"),
        (0, 1, [], "at least one episode"),
    ],
)
def test_results_that_break_the_protocol_are_rejected(
    task_offset: int, worker_id: int, episodes: list[int], reason: str
) -> None:
    scheduler = fleet(2, 1, prefetch=0)
    scheduler.start_sample(spec(Mode.EPISODES, 3))
    order = scheduler.dispatch()[0]
    outcome = scheduler.classify(worker_id, order.task_id + task_offset, episodes)
    assert outcome.verdict is Verdict.REJECT
    assert reason in outcome.reason


def test_an_episode_sent_twice_is_rejected() -> None:
    scheduler = fleet(2, prefetch=0)
    scheduler.start_sample(spec(Mode.EPISODES, 4))
    (order,) = scheduler.dispatch()
    finish_units(scheduler, order, {0: 3}, only=[0])
    outcome = scheduler.classify(1, order.task_id, [0])
    assert outcome.verdict is Verdict.REJECT and "came twice" in outcome.reason


def test_results_after_the_request_finished_are_ignored() -> None:
    scheduler = fleet(2, prefetch=0)
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 2))
    (order,) = scheduler.dispatch()
    scheduler.finish(request_id)
    assert scheduler.classify(1, order.task_id, [0]).verdict is Verdict.IGNORE


def test_ineligible_workers_get_no_work_until_ready() -> None:
    scheduler = fleet(1, 1, prefetch=0)
    scheduler.set_eligible(1, False)
    scheduler.start_sample(spec(Mode.EPISODES, 4))
    assert by_worker(scheduler.dispatch()) == {2: [0]}
    scheduler.set_eligible(1, True)  # a worker joining mid-request is used at once
    assert by_worker(scheduler.dispatch()) == {1: [1]}


def test_leased_envs_take_sampling_slots_until_released() -> None:
    scheduler = fleet(4, 4)  # capacities 8 and 8
    scheduler.set_leased(1, 4)  # every slot of worker 1 is leased
    scheduler.set_leased(2, 1)  # 3 slots of worker 2 are left: capacity 6
    scheduler.start_sample(spec(Mode.EPISODES, 20))
    assert by_worker(scheduler.dispatch()) == {2: [0, 1, 2, 3, 4, 5]}
    scheduler.set_leased(1, 0)  # the lease was released: worker 1 samples again
    assert by_worker(scheduler.dispatch()) == {1: [6, 7, 8, 9, 10, 11, 12, 13]}


def test_a_worker_hosting_leased_envs_takes_no_fragment_windows() -> None:
    scheduler = fleet(2, 2)
    scheduler.set_leased(1, 1)  # a window would run both of its slots
    scheduler.start_sample(spec(Mode.FRAGMENTS, 20, fragment_length=5))
    assert [(o.worker_id, o.rounds) for o in scheduler.dispatch()] == [(2, 2)]


def test_only_one_sample_request_at_a_time() -> None:
    scheduler = fleet(1)
    scheduler.start_sample(spec(Mode.EPISODES, 1))
    with pytest.raises(ValueError, match="still running"):
        scheduler.start_sample(spec(Mode.EPISODES, 1))


def test_fragments_plan_rounds_for_the_amount_and_wait_for_every_window() -> None:
    scheduler = fleet(2, 1)
    request_id = scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    orders = scheduler.dispatch()
    # 3 slots x 5 steps = 15 steps per round: 3 rounds make 45 >= 40.
    assert [(o.worker_id, o.rounds, o.fragment_length, o.base_seed) for o in orders] == [
        (1, 3, 5, 7),
        (2, 3, 5, 7),
    ]
    assert scheduler.dispatch() == []
    windows = [(orders[0], [5, 5])] * 3 + [(orders[1], [5])] * 2
    for order, lengths in windows:
        outcome = scheduler.complete(order.worker_id, order.task_id, [0] * len(lengths), lengths)
        assert outcome.verdict is Verdict.ACCEPT and not outcome.done
    # 40 steps are in, but worker 2's last window is not: not done yet.
    assert scheduler.complete(2, orders[1].task_id, [0], [5]).done
    footer = scheduler.footer(request_id)
    assert (footer.num_episodes, footer.total_steps) == (9, 45)


def test_fragments_of_a_lost_worker_are_made_up_by_the_others() -> None:
    scheduler = fleet(2, 2)
    scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    first, second = scheduler.dispatch()
    assert (first.rounds, second.rounds) == (2, 2)  # 20 steps per round
    scheduler.complete(2, second.task_id, [0, 0], [5, 5])
    scheduler.remove_worker(2)
    # 10 received + 20 planned on worker 1 = 30: 10 short, one more round.
    (extra,) = scheduler.dispatch()
    assert (extra.worker_id, extra.rounds) == (1, 1)


def takeover_fleet(*num_envs: int) -> Scheduler:
    """Workers that declare rlfleet.stream-takeover."""
    scheduler = Scheduler(prefetch_factor=1, capacity_steps=0)
    for worker_id, n in enumerate(num_envs, start=1):
        scheduler.add_worker(worker_id, n, takeover=True)
        scheduler.set_eligible(worker_id, True)
    return scheduler


def window(scheduler: Scheduler, order: TaskOrder, length: int = 5) -> bool:
    """Completes one window of a fragment order; True if the request is done."""
    n = len(order.streams)
    outcome = scheduler.complete(order.worker_id, order.task_id, [0] * n, [length] * n)
    assert outcome.verdict is Verdict.ACCEPT
    return outcome.done


def test_a_lost_workers_windows_go_to_a_taker_under_the_same_stream_ids() -> None:
    scheduler = takeover_fleet(2, 2)
    request_id = scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    first, second = scheduler.dispatch()
    assert (first.streams, second.streams, first.rounds) == ((0, 1), (2, 3), 2)
    window(scheduler, second)
    scheduler.remove_worker(2, keep_streams=True)
    (taken,) = scheduler.dispatch()
    # Its one window left, on its own streams: the undisturbed plan, not extra rounds.
    assert (taken.worker_id, taken.streams, taken.rounds) == (1, (2, 3), 1)
    assert scheduler.orphaned_streams == (2, 3)
    assert not window(scheduler, first) and not window(scheduler, first)
    assert window(scheduler, taken)
    assert scheduler.footer(request_id).total_steps == 40
    scheduler.finish(request_id)
    # The next request plans every stream, orphans included, on the survivor.
    scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    own, orphans = scheduler.dispatch()
    assert [(o.streams, o.rounds) for o in (own, orphans)] == [((0, 1), 2), ((2, 3), 2)]


def test_a_new_taker_adopts_orphans_and_others_get_new_streams() -> None:
    scheduler = takeover_fleet(2)
    scheduler.add_worker(2, 2, takeover=True)
    scheduler.remove_worker(2, keep_streams=True)
    assert scheduler.add_worker(3, 1, takeover=False) == (4,)  # never a used number
    assert scheduler.add_worker(4, 3, takeover=True) == (2, 3, 5)
    assert scheduler.orphaned_streams == ()


def test_a_worker_joining_mid_takeover_adopts_the_streams_but_not_their_windows() -> None:
    scheduler = takeover_fleet(2, 2)
    request_id = scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    first, _ = scheduler.dispatch()
    scheduler.remove_worker(2, keep_streams=True)
    (taken,) = scheduler.dispatch()
    assert (taken.worker_id, taken.streams, taken.rounds) == (1, (2, 3), 2)
    # The replacement adopts streams 2 and 3 although worker 1 runs them now.
    assert scheduler.add_worker(3, 2, takeover=True) == (2, 3)
    scheduler.set_eligible(3, True)
    assert scheduler.dispatch() == []  # no window of 2 or 3 twice
    for order in (first, first, taken, taken):
        window(scheduler, order)
    assert scheduler.footer(request_id).total_steps == 40
    scheduler.finish(request_id)
    scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    assert [(o.worker_id, o.streams) for o in scheduler.dispatch()] == [(1, (0, 1)), (3, (2, 3))]


def test_the_streams_of_a_taker_that_is_not_ready_are_run_by_the_others() -> None:
    scheduler = takeover_fleet(2)
    assert scheduler.add_worker(2, 2, takeover=True) == (2, 3)  # joined, env not built yet
    scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    own, stand_in = scheduler.dispatch()
    assert [(o.worker_id, o.streams, o.rounds) for o in (own, stand_in)] == [
        (1, (0, 1), 2),
        (1, (2, 3), 2),
    ]
    scheduler.set_eligible(2, True)
    assert scheduler.dispatch() == []  # its streams run on worker 1 in this request


def test_without_takers_a_lost_workers_windows_are_made_up_by_other_streams() -> None:
    scheduler = fleet(2, 2)
    scheduler.start_sample(spec(Mode.FRAGMENTS, 40, fragment_length=5))
    _, second = scheduler.dispatch()
    scheduler.complete(2, second.task_id, [0, 0], [5, 5])
    scheduler.remove_worker(2, keep_streams=True)
    (extra,) = scheduler.dispatch()
    assert (extra.worker_id, extra.rounds, extra.streams) == (1, 1, ())


def test_subscription_backpressure_stops_new_units_until_consumed() -> None:
    scheduler = fleet(1, prefetch=0)
    sub = scheduler.start_subscription(
        spec(Mode.EPISODES, 0, agent_version=-1, max_buffered_steps=30)
    )
    (order,) = scheduler.dispatch()
    assert order.agent_version == -1
    finish_units(scheduler, order, {0: 30})
    assert scheduler.dispatch() == []  # 30 steps wait for the subscriber
    scheduler.consumed(sub, 30)
    assert by_worker(scheduler.dispatch()) == {1: [1]}


def test_sample_requests_have_priority_over_subscriptions() -> None:
    scheduler = fleet(1, prefetch=0)
    sub = scheduler.start_subscription(spec(Mode.EPISODES, 0, max_buffered_steps=100))
    (sub_order,) = scheduler.dispatch()
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 1))
    assert scheduler.dispatch() == []  # the slot is busy with the subscription's unit
    finish_units(scheduler, sub_order, {0: 1})
    (sample_order,) = scheduler.dispatch()
    assert sample_order.request_id == request_id
    finish_units(scheduler, sample_order, {0: 1})
    scheduler.finish(request_id)
    (resumed,) = scheduler.dispatch()
    assert resumed.request_id == sub and indices(resumed) == [1]


def test_env_change_cancels_and_requeues_subscription_work() -> None:
    scheduler = fleet(2, prefetch=0)
    scheduler.start_subscription(spec(Mode.EPISODES, 0, max_buffered_steps=100))
    (old,) = scheduler.dispatch()
    assert scheduler.set_env_generation(2) == [CancelOrder(1, old.task_id, (0, 1))]
    (new,) = scheduler.dispatch()
    assert new.env_generation == 2 and indices(new) == [0, 1]
    assert scheduler.classify(1, old.task_id, [0]).verdict is Verdict.IGNORE


# --- capacity in steps, batched refills ---------------------------------------


def test_capacity_is_counted_in_expected_steps_and_refills_come_in_batches() -> None:
    scheduler = fleet(2, capacity_steps=60)  # floor: 2 envs x (1 + 1) = 4 units
    scheduler.start_sample(spec(Mode.EPISODES, 100))
    (first,) = scheduler.dispatch()
    assert indices(first) == [0, 1, 2, 3]  # no length known yet: the floor
    finish_units(scheduler, first, dict.fromkeys(range(4), 2))
    assert scheduler.mean_episode_length == 2.0
    assert scheduler.capacity(1) == 30  # 60 steps / 2 per episode
    (refill,) = scheduler.dispatch()
    assert indices(refill) == list(range(4, 34))  # one task up to capacity
    # Spare units: 30 - 2 slots = 28. No refill until half of them are done
    # (results of 8 steps: five of them, 40 steps, are within the 60)...
    lengths = dict.fromkeys(range(4, 34), 2)
    for done in ([4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15], [16]):
        finish_units(scheduler, refill, lengths, only=done)
    assert scheduler.dispatch() == []  # 17 held: 15 spare left
    finish_units(scheduler, refill, lengths, only=[17])
    (topped,) = scheduler.dispatch()  # 16 held: 14 spare left, half of 28
    assert indices(topped) == list(range(34, 48))


def test_capacity_never_falls_below_the_prefetch_floor() -> None:
    scheduler = fleet(2, prefetch=5, capacity_steps=40)  # floor: 2 envs x (1 + 5) = 12 units
    scheduler.start_sample(spec(Mode.EPISODES, 100))
    (first,) = scheduler.dispatch()
    finish_units(scheduler, first, {0: 500}, only=[0])
    # 40 steps hold not even one 500-step episode; three results of one, 3 units.
    assert scheduler.capacity(1) == 12


def _native_worker_results(
    results: int, *, slots: int = 64, length: int = 20
) -> tuple[Scheduler, list[tuple[int, int, int]]]:
    """A worker of ``slots`` envs that runs its units in order and reports
    8,192 steps at a time, each result followed by a refill.

    Returns:
        The scheduler, and per result booked: the units it then held not
        started (before its refill), the refill's units (0: none), and
        the Task messages the refill sent.
    """
    result = 8192 // length
    scheduler = fleet(slots, capacity_steps=16384)
    scheduler.start_sample(spec(Mode.STEPS, 10**8))
    (first,) = scheduler.dispatch()  # a unit per slot: no length known yet
    given, task_id, done = indices(first), first.task_id, 0
    log = []
    for _ in range(results):
        batch = given[done : done + result]
        ruling = scheduler.complete(1, task_id, batch, [length] * len(batch))
        assert ruling.verdict is Verdict.ACCEPT
        done += len(batch)
        unstarted = len(given) - done - slots
        orders = scheduler.dispatch()
        for order in orders:
            given += indices(order)
            task_id = order.task_id
        log.append((unstarted, sum(len(order.units) for order in orders), len(orders)))
    return scheduler, log


def test_a_worker_is_topped_up_while_it_still_holds_two_of_its_results_unstarted() -> None:
    # A refill only ever follows a result, so what a worker holds beyond its
    # running episodes when a result of it is booked must last until the
    # refill arrives: two results' worth, one for the time until its next
    # result and one for the refill's round trip. With capacity_steps alone
    # (16384, two results of 8192) it held less than one.
    slots, length, result = 64, 20, 8192 // 20
    scheduler, log = _native_worker_results(24, slots=slots, length=length)
    # Once its results' size is known and it was topped up to it (the
    # third result on), it never holds fewer than two results' worth
    # unstarted when a result is booked, and is refilled by then at the latest.
    for count, (unstarted, refill, _) in enumerate(log[2:], start=2):
        assert unstarted >= 2 * result, f"result {count}: {unstarted} units unstarted"
        if unstarted < 3 * result:
            assert refill, f"result {count}: no refill at {unstarted} unstarted"
    assert scheduler.capacity(1) == slots + math.ceil(5 * result * length / length)


def test_a_worker_of_large_results_gets_a_task_per_several_results() -> None:
    # Each Task message costs the coordinator 250-300 us of gRPC CPU and the
    # worker a wake-up: topped up by one result's worth, a worker of
    # 8,192-step results got one per result. Its refills carry three.
    result = 8192 // 20
    _, log = _native_worker_results(30)
    steady = log[6:]  # past the first request's start
    tasks = sum(count for _, _, count in steady)
    assert tasks <= len(steady) / 3 + 1, log
    assert all(refill >= 2 * result for _, refill, count in steady if count), log


def test_spare_units_are_dealt_round_robin_in_slices_of_num_envs() -> None:
    scheduler = fleet(2, 2, prefetch=2)  # capacities 6
    scheduler.start_sample(spec(Mode.EPISODES, 100))
    # Every worker works near the front of the request, which the prefix
    # rule waits for, instead of one worker holding a block of late indices.
    assert by_worker(scheduler.dispatch()) == {1: [0, 1, 4, 5, 8, 9], 2: [2, 3, 6, 7, 10, 11]}


def test_a_refill_deals_in_calls_per_worker_not_per_slice() -> None:
    # A per-env worker of 8 slots holds hundreds of units (capacity_steps
    # over a short mean length): dozens of slices per refill. The dealing
    # is worked out as a grid, so a refill of 61 slices per worker makes
    # as many calls as one of 3; slice by slice it made about 30 more per slice.
    calls = {}
    # The first refill of the process fills caches the later ones use: it is
    # not counted, so that neither count depends on what ran before.
    for prefetch in (2, 2, 60):
        scheduler = fleet(8, 8, prefetch=prefetch)
        scheduler.start_sample(spec(Mode.EPISODES, 10_000))
        profile = cProfile.Profile()
        gc.disable()  # finalizers of other tests' objects would be counted
        profile.enable()
        orders = scheduler.dispatch()
        profile.disable()
        gc.enable()
        dealt = by_worker(orders)
        held = 8 * (1 + prefetch)
        assert dealt == {
            1: [i for i in range(2 * held) if i // 8 % 2 == 0],
            2: [i for i in range(2 * held) if i // 8 % 2 == 1],
        }
        calls[prefetch] = sum(n for _, n, *_ in pstats.Stats(profile).stats.values())  # type: ignore[attr-defined]
    assert calls[60] == calls[2], calls


def test_a_refill_tops_up_every_worker_with_room_for_a_slice() -> None:
    scheduler = fleet(2, 2, prefetch=3)  # capacities 8: refill at <= 2 + 6 // 2 = 5 held
    scheduler.start_sample(spec(Mode.EPISODES, 100))
    first = {order.worker_id: order for order in scheduler.dispatch()}
    lengths = dict.fromkeys(range(100), 1)
    finish_units(scheduler, first[1], lengths, only=[0, 1, 4])  # 5 held: asks for a refill
    finish_units(scheduler, first[2], lengths, only=[2, 3])  # 6 held: has room for 2
    assert by_worker(scheduler.dispatch()) == {1: [16, 17, 20], 2: [18, 19]}
    finish_units(scheduler, first[1], lengths, only=[5, 8, 9])  # 5 held: asks again
    finish_units(scheduler, first[2], lengths, only=[6])  # 7 held: room for 1 < a slice
    assert by_worker(scheduler.dispatch()) == {1: [21, 22, 23]}


def test_a_refill_joins_the_workers_live_task_so_a_flush_is_one_result() -> None:
    scheduler = fleet(2, prefetch=3)  # capacity 8: refill at <= 2 + 6 // 2 = 5 held
    scheduler.start_sample(spec(Mode.EPISODES, 100))
    (first,) = scheduler.dispatch()
    lengths = dict.fromkeys(range(100), 1)
    finish_units(scheduler, first, lengths, only=[0, 1, 2])  # 5 held: asks for a refill
    (refill,) = scheduler.dispatch()
    # The worker sends one result per task it holds: a new task per refill
    # would split each flush that spans a refill into two results.
    assert refill.task_id == first.task_id and indices(refill) == [8, 9, 10]
    given = scheduler.unit_seeds(first.task_id).episode_indices.tolist()
    assert given == list(range(11))  # both messages
    # One result may now hold units of both Task messages, each still once.
    both = [3, 4, 8]
    ruling = scheduler.complete(1, first.task_id, both, [1, 1, 1])
    assert ruling.verdict is Verdict.ACCEPT
    assert scheduler.classify(1, first.task_id, [4]).verdict is Verdict.REJECT  # came twice
    assert scheduler.classify(1, first.task_id, [11]).verdict is Verdict.REJECT  # not given
    # A lost worker's units of every Task message go back to the request.
    assert scheduler.remove_worker(1) == 5  # 5, 6, 7, 9, 10


def test_a_new_steps_request_sizes_its_first_units_with_the_fleets_mean_length() -> None:
    scheduler = fleet(2, capacity_steps=1000)
    earlier = scheduler.start_sample(spec(Mode.EPISODES, 2))
    (order,) = scheduler.dispatch()
    finish_units(scheduler, order, {0: 10, 1: 10})
    scheduler.finish(earlier)
    scheduler.start_sample(spec(Mode.STEPS, 55, request_index=4))
    (first,) = scheduler.dispatch()
    # 55 steps at 10 per episode: 6 units, although the worker has room for 100.
    assert indices(first) == [0, 1, 2, 3, 4, 5]
    assert scheduler.capacity(1) == 100
    assert scheduler.dispatch() == []


def test_the_mean_length_follows_recent_episodes() -> None:
    scheduler = fleet(1, prefetch=0)
    scheduler.start_sample(spec(Mode.EPISODES, 3))
    (first,) = scheduler.dispatch()
    finish_units(scheduler, first, {0: 10})
    assert scheduler.mean_episode_length == 10.0  # the first episode sets it
    (second,) = scheduler.dispatch()
    finish_units(scheduler, second, {1: 266})
    # One more episode moves it 1/256 of the way: it forgets over ~256 episodes.
    assert scheduler.mean_episode_length == 11.0


def test_an_env_change_forgets_the_mean_length() -> None:
    scheduler = fleet(2, capacity_steps=200)
    request_id = scheduler.start_sample(spec(Mode.EPISODES, 2))
    (order,) = scheduler.dispatch()
    finish_units(scheduler, order, {0: 10, 1: 10})
    scheduler.finish(request_id)
    assert scheduler.capacity(1) == 20
    scheduler.set_env_generation(2)
    assert scheduler.mean_episode_length is None
    assert scheduler.capacity(1) == 4  # back to the floor until new lengths come


# --- subscriptions: work in flight counts toward the buffer bound ----------------


def test_subscription_units_in_flight_count_toward_max_buffered_steps() -> None:
    scheduler = fleet(4, capacity_steps=1000)
    sub = scheduler.start_subscription(
        spec(Mode.EPISODES, 0, agent_version=-1, max_buffered_steps=50)
    )
    (order,) = scheduler.dispatch()
    assert indices(order) == [0, 1, 2, 3]  # no length known: one unit per env slot
    finish_units(scheduler, order, {0: 10}, only=[0])
    # 10 buffered + 3 in flight x 10 = 40 < 50: one more unit, then 50.
    assert by_worker(scheduler.dispatch()) == {1: [4]}
    assert scheduler.dispatch() == []
    scheduler.consumed(sub, 10)  # sent to the subscriber: 40 in flight
    assert by_worker(scheduler.dispatch()) == {1: [5]}


def test_subscription_windows_in_flight_count_toward_max_buffered_steps() -> None:
    scheduler = fleet(2, 2, prefetch=0)
    sub = scheduler.start_subscription(
        spec(Mode.FRAGMENTS, 0, agent_version=-1, fragment_length=5, max_buffered_steps=25)
    )
    # Windows of 2 slots x 5 steps: 0 and 10 in flight are below 25, 20 too...
    assert [o.worker_id for o in scheduler.dispatch()] == [1, 2]
    (third,) = scheduler.dispatch()
    assert third.worker_id == 1
    assert scheduler.dispatch() == []  # ...30 is not
    first_task = third.task_id - 2
    scheduler.complete(1, first_task, [0, 0], [5, 5])  # 10 buffered + 20 in flight
    assert scheduler.dispatch() == []
    scheduler.consumed(sub, 10)  # 20 in flight: room for one more window
    (fourth,) = scheduler.dispatch()
    assert fourth.worker_id == 1


# --- seeds --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base_seed", "request_index"),
    [(0, 0), (7, 3), (2**32 - 1, 1), (2**32, 5), (2**64 + 5, 2**40)],
)
def test_units_get_exactly_the_seeds_of_episode_seeds(base_seed: int, request_index: int) -> None:
    indices = [*range(40), 2**31, 2**32 - 1]
    many = episode_seeds_many(base_seed, request_index, indices)
    assert many == [episode_seeds(base_seed, request_index, i) for i in indices]
    few = episode_seeds_many(base_seed, request_index, [3, 0])
    assert few == [episode_seeds(base_seed, request_index, i) for i in (3, 0)]
    with pytest.raises(ValueError, match="non-negative"):
        episode_seeds_many(-1, request_index, list(range(40)))


@pytest.mark.parametrize(
    ("mode", "amount", "first_episode"),
    [(Mode.EPISODES, 3000, 0), (Mode.EPISODES, 2500, 1700), (Mode.STEPS, 3000 * 5, 0)],
)
def test_a_refill_derives_the_seeds_of_the_units_it_hands_out_and_no_others(
    monkeypatch: pytest.MonkeyPatch, mode: Mode, amount: int, first_episode: int
) -> None:
    # The compiled hash derives a refill's seeds in one call whatever their
    # number, so nothing is derived ahead (a block of seeds kept per request
    # paid for the numpy hash's cost per call) and nothing twice; one call
    # for every worker the refill tops up.
    derived: list[list[int]] = []
    derive = UnitColumns.seeded

    def counted(base_seed: int, request: int, episode_indices: np.ndarray) -> UnitColumns:
        derived.append(np.asarray(episode_indices).tolist())
        return derive(base_seed, request, episode_indices)

    monkeypatch.setattr(UnitColumns, "seeded", counted)
    scheduler = fleet(8, 8, prefetch=3)  # capacity 32 each: many refills of a slot's worth
    request_id = scheduler.start_sample(spec(mode, amount, first_episode=first_episode))
    handed_out: list[list[int]] = []
    while orders := scheduler.dispatch():
        handed_out.append([i for order in orders for i in indices(order)])
        for order in orders:
            for unit in order.units:
                assert (unit.env_seed, unit.policy_seed) == episode_seeds(7, 3, unit.episode_index)
            # The worker reports its units in two results, as a flush would.
            done = indices(order)
            for part in (done[: len(done) // 2], done[len(done) // 2 :]):
                if part:
                    finish_units(scheduler, order, dict.fromkeys(part, 5), only=part)
    episodes = scheduler.footer(request_id).num_episodes
    assert episodes == amount // (5 if mode is Mode.STEPS else 1)
    assert len(handed_out) >= 30
    assert derived == handed_out


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from([Mode.STEPS, Mode.EPISODES]),
    amount=st.integers(1, 400),
    handed=st.integers(0, 60),
    requeued=st.lists(st.integers(0, 59), max_size=10, unique=True),
    completed=st.lists(st.integers(1, 30), max_size=20),
    count=st.integers(-3, 80),
    prior=st.one_of(st.none(), st.floats(1.0, 50.0)),
)
def test_take_many_hands_out_what_as_many_takes_would(  # noqa: PLR0917 (hypothesis)
    mode: Mode,
    amount: int,
    handed: int,
    requeued: list[int],
    completed: list[int],
    count: int,
    prior: float | None,
) -> None:
    from rlfleet.scheduling.units import EpisodeRequest

    def state() -> EpisodeRequest:
        request = EpisodeRequest(1, spec(mode, amount), subscription=False)
        request.next_index = handed
        request.handed_out(handed)
        lengths = completed[:handed]
        if lengths:
            request.complete(np.arange(len(lengths)), np.array(lengths))
        request.requeue(np.array([i for i in requeued if i < handed], dtype=np.int64), lost=True)
        return request

    def fields(request: EpisodeRequest) -> dict[str, object]:
        return {
            name: value.tolist() if isinstance(value, np.ndarray) else value
            for name, value in vars(request).items()
            if name != "_seeds"  # a cache of seeds, not what was handed out
        }

    one_by_one, batched = state(), state()
    expected = []
    for _ in range(count):
        index = one_by_one.take(16, prior)
        if index is None:
            break
        expected.append(index)
        one_by_one.handed_out(1)
    assert batched.take_many(count, 16, prior).tolist() == expected
    assert fields(batched) == fields(one_by_one)


def _dispatch_slice_by_slice(
    planner: units_module.UnitPlanner,
    request: units_module.EpisodeRequest,
    workers: list[units_module.WorkerLoad],
) -> list[TaskOrder]:
    """The refill rule with each slice taken from the request on its own."""
    limits = {w.worker_id: planner._limits(w, planner.mean_length.value) for w in workers}
    capacity = {worker_id: limit for worker_id, (limit, _) in limits.items()}
    wanting = {w.worker_id for w in workers if w.units <= limits[w.worker_id][1]}
    if not wanting:
        return []
    refilled = [
        w for w in workers if w.worker_id in wanting or capacity[w.worker_id] - w.units >= w.slots
    ]
    fleet_slots = sum(w.slots for w in workers)
    prior = planner.mean_length.value
    picked: dict[int, list[np.ndarray]] = {w.worker_id: [] for w in refilled}
    counts = dict.fromkeys(picked, 0)

    def room(worker: units_module.WorkerLoad, limit: int) -> int:
        return limit - worker.units - counts[worker.worker_id]

    def give(worker: units_module.WorkerLoad, count: int) -> bool:
        taken = request.take_many(count, fleet_slots, prior)
        picked[worker.worker_id].append(taken)
        counts[worker.worker_id] += len(taken)
        return len(taken) >= count

    more = all(give(w, room(w, w.slots)) for w in refilled)
    hungry = [w for w in refilled if room(w, capacity[w.worker_id]) > 0]
    while more and hungry:
        for worker in hungry:
            more = give(worker, min(room(worker, capacity[worker.worker_id]), worker.slots))
            if not more:
                break
        hungry = [w for w in hungry if room(w, capacity[w.worker_id]) > 0]
    orders = []
    books = planner._books
    for worker in refilled:
        if not counts[worker.worker_id]:
            continue
        task = books.live_task(worker, request) or books.new_task(worker, request)
        units = request.units(np.sort(np.concatenate(picked[worker.worker_id])))
        task.units.add(units)
        worker.units += len(units)
        orders.append(books.order(task, request, units=units))
    return orders


@settings(max_examples=60, deadline=None)
@given(
    num_envs=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    prefetch=st.integers(0, 4),
    capacity_steps=st.sampled_from([0, 40, 400]),
    mode=st.sampled_from([Mode.STEPS, Mode.EPISODES]),
    amount=st.integers(1, 600),
    seed=st.integers(0, 2**16),
)
def test_a_refill_deals_what_taking_each_slice_on_its_own_dealt(  # noqa: PLR0917 (hypothesis)
    num_envs: list[int],
    prefetch: int,
    capacity_steps: int,
    mode: Mode,
    amount: int,
    seed: int,
) -> None:
    # Many refills of workers with few env slots (slices of a few units),
    # results of random parts of what each holds, lengths at random: the
    # same units to the same workers, and the request's units taken once
    # per refill however many slices it deals.
    takes: list[int] = []
    take_many = units_module.EpisodeRequest.take_many

    def counted(self: units_module.EpisodeRequest, *args: object) -> np.ndarray:
        takes.append(1)
        return take_many(self, *args)  # type: ignore[arg-type]

    scheduled = {}
    for rule in ("at once", "slice by slice"):
        rng = np.random.default_rng(seed)
        scheduler = fleet(*num_envs, prefetch=prefetch, capacity_steps=capacity_steps)
        if rule == "slice by slice":
            planner = scheduler._units

            def one_slice_at_a_time(
                request: units_module.EpisodeRequest,
                workers: list[units_module.WorkerLoad],
                planner: units_module.UnitPlanner = planner,
                *,
                looked: bool = False,
            ) -> list[TaskOrder]:
                return _dispatch_slice_by_slice(planner, request, workers)

            planner.dispatch = one_slice_at_a_time  # type: ignore[method-assign]
        scheduler.start_sample(spec(mode, amount))
        held: dict[int, tuple[int, list[int]]] = {}
        log = []
        for _ in range(25):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(units_module.EpisodeRequest, "take_many", counted)
                takes.clear()
                orders = scheduler.dispatch()
                if rule == "at once" and orders:
                    assert len(takes) == 1, "one take of the request's units per refill"
            log.append(by_worker(orders))
            for order in orders:
                previous = held.get(order.worker_id, (order.task_id, []))[1]
                held[order.worker_id] = (order.task_id, previous + indices(order))
            for worker_id, (task_id, units) in sorted(held.items()):
                done = units[: int(rng.integers(0, len(units) + 1))]
                if done:
                    lengths = rng.integers(1, 30, len(done)).tolist()
                    scheduler.complete(worker_id, task_id, done, lengths)
                held[worker_id] = (task_id, units[len(done) :])
        scheduled[rule] = log
    assert scheduled["at once"] == scheduled["slice by slice"]


@settings(max_examples=30, deadline=None)
@given(
    num_envs=st.lists(st.integers(1, 16), min_size=1, max_size=3),
    capacity_steps=st.sampled_from([0, 200, 800]),
    seed=st.integers(0, 2**16),
    toggled=st.booleans(),
)
def test_a_refill_hands_out_what_working_every_mark_out_would(
    num_envs: list[int], capacity_steps: int, seed: int, toggled: bool
) -> None:
    # A dispatch skips working the workers' marks out while they hold more
    # than the marks it kept for a shorter mean length (the scheduler looks
    # at every worker's, eligible or not, before it lists the eligible
    # ones). Episodes that turn long then short (the mean length rising and
    # falling by far more than the slack), results of every size and, if
    # toggled, the first worker in and out of eligibility and the second's
    # slots leased, some or all (a worker given no units is skipped by the
    # look): the same refills, round by round, as a planner that works
    # every mark out each time.
    scheduled = {}
    for rule in ("kept marks", "every time"):
        rng = np.random.default_rng(seed)
        scheduler = fleet(*num_envs, capacity_steps=capacity_steps)
        if rule == "every time":
            scheduler._units.surely_full = lambda *_: False  # type: ignore[method-assign]
        scheduler.start_sample(spec(Mode.STEPS, 10**7))
        held: dict[int, tuple[int, list[int]]] = {}
        log = []
        for round_ in range(40):
            if toggled:
                scheduler.set_eligible(1, bool(rng.integers(0, 3)))
                if len(num_envs) > 1:
                    scheduler.set_leased(2, int(rng.integers(0, num_envs[1] + 1)))
            orders = scheduler.dispatch()
            given = {o.worker_id: o.units.episode_indices.tolist() for o in orders}
            log.append(given)
            for order in orders:
                previous = held.get(order.worker_id, (order.task_id, []))[1]
                held[order.worker_id] = (order.task_id, previous + given[order.worker_id])
            long_episodes = round_ // 8 % 2 == 1
            for worker_id, (task_id, units) in sorted(held.items()):
                done = units[: int(rng.integers(0, max(len(units) // 4, 1) + 1))]
                if done:
                    lengths = rng.integers(40, 120) if long_episodes else rng.integers(2, 8)
                    scheduler.complete(worker_id, task_id, done, [int(lengths)] * len(done))
                held[worker_id] = (task_id, units[len(done) :])
        scheduled[rule] = log
    assert scheduled["kept marks"] == scheduled["every time"]


def test_a_refill_that_hands_out_nothing_works_no_mark_out() -> None:
    # After most results no worker wants a refill; the dispatch then checks
    # what each worker holds against the mark it kept, and works out no
    # capacity: that took most of a dispatch handing out nothing.
    scheduler = fleet(*[64] * 8, capacity_steps=16384)
    scheduler.start_sample(spec(Mode.STEPS, 10**8))
    live = {order.worker_id: order for order in scheduler.dispatch()}
    for worker_id, order in live.items():
        scheduler.complete(worker_id, order.task_id, indices(order), [100] * 64)
    refills = scheduler.dispatch()
    assert {order.worker_id for order in refills} == set(live)
    for order in refills:
        # A result each: every worker still above its mark.
        scheduler.complete(order.worker_id, order.task_id, indices(order)[:64], [100] * 64)
    profile = cProfile.Profile()
    profile.enable()
    assert scheduler.dispatch() == []
    profile.disable()
    called = {name for (_, _, name), *_ in pstats.Stats(profile).stats.items()}  # type: ignore[attr-defined]
    assert "_limits" not in called, called
    # Nor lists the eligible workers: the look is one call below dispatch.
    assert "_dispatch_request" not in called, called


def test_a_refill_that_hands_out_looks_at_the_marks_once() -> None:
    # The scheduler asks the kept marks over the fleet; when they do not
    # settle it, the planner works the eligible workers' marks out at once
    # (not asking the kept marks a second time): each worker's for today's
    # mean length and the one it keeps, and that one only if what it
    # depends on changed (a request's first hand-out after another's).
    def calls_of_a_dispatch(scheduler: Scheduler) -> tuple[list[TaskOrder], dict[str, int]]:
        profile = cProfile.Profile()
        profile.enable()
        orders = scheduler.dispatch()
        profile.disable()
        stats = pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
        return orders, {name: row[1] for (_, _, name), row in stats}

    scheduler = fleet(*[8] * 3, capacity_steps=400)
    request_id = scheduler.start_sample(spec(Mode.STEPS, 10**6))
    held = {order.worker_id: order for order in scheduler.dispatch()}
    for worker_id, order in held.items():
        scheduler.complete(worker_id, order.task_id, indices(order), [10] * len(order.units))
    orders, calls = calls_of_a_dispatch(scheduler)
    assert orders
    assert calls.get("surely_full") == 1, calls
    assert calls.get("_limits") == 6, calls
    scheduler.finish(request_id)
    scheduler.start_sample(spec(Mode.STEPS, 10**6))
    orders, calls = calls_of_a_dispatch(scheduler)
    assert orders
    assert calls.get("surely_full") == 1, calls
    assert calls.get("_limits") == 3, calls  # the same mean length: marks kept as they are


def test_a_worker_that_leaves_takes_its_kept_mark_with_it() -> None:
    # A coordinator that runs for weeks sees workers come and go: what a
    # dispatch keeps per worker goes when the worker does.
    scheduler = fleet(4, 4, capacity_steps=400)
    scheduler.start_sample(spec(Mode.STEPS, 10**6))
    for order in scheduler.dispatch():
        scheduler.complete(order.worker_id, order.task_id, indices(order)[:4], [10] * 4)
    scheduler.dispatch()
    assert set(scheduler._units._marks) == {1, 2}
    scheduler.remove_worker(2)
    assert set(scheduler._units._marks) == {1}
