"""The cost of booking a result in the scheduler, counted in calls (never time)."""

from __future__ import annotations

import cProfile
import pstats

from rlfleet.protocol.modes import Mode
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler, Verdict


def _calls(profile: cProfile.Profile) -> tuple[int, int]:
    """(all calls, numpy's calls) the profile saw."""
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(calls for (_, _, _), (_, calls, *_) in stats.items())
    numpy_calls = sum(
        calls for (path, _, name), (_, calls, *_) in stats.items() if "numpy" in path + name
    )
    return total, numpy_calls


def test_a_steps_result_off_the_prefix_books_in_few_calls() -> None:
    """A lone 4-episode result of a STEPS request, booked after it was judged,
    is found again and marked back in one compiled call over its header's
    tuple (not judged a second time, no array made for its indices), and
    leaves the prefix unwalked when it does not bring the prefix's next
    episode (most results: each worker runs its own indices)."""
    scheduler = Scheduler(prefetch_factor=1, capacity_steps=0)
    for worker_id in (1, 2):
        scheduler.add_worker(worker_id, 8)
        scheduler.set_eligible(worker_id, True)
    scheduler.start_sample(
        RequestSpec(
            mode=Mode.STEPS,
            amount=10**9,
            seed=7,
            request_index=3,
            agent_version=2,
            env_generation=1,
        )
    )
    orders = {order.worker_id: order for order in scheduler.dispatch()}
    first = orders[1].units.episode_indices.tolist()
    later = orders[2].units.episode_indices.tolist()  # past worker 1's: off the prefix
    assert min(later) > max(first)
    warm = tuple(later[:4])
    scheduler.complete_many(2, [(orders[2].task_id, warm, (100,) * 4)])
    result = (orders[2].task_id, tuple(later[4:8]), (100,) * 4)
    assert scheduler.classify(2, result[0], result[1]).verdict is Verdict.ACCEPT
    profile = cProfile.Profile()
    profile.enable()
    rulings = scheduler.complete_many(2, [result])
    profile.disable()
    assert [r.verdict for r in rulings] == [Verdict.ACCEPT]
    assert not rulings[0].done
    total, numpy_calls = _calls(profile)
    # Judged again then walked, it took 88 calls, 37 of them numpy's; found
    # again with numpy's search, 70 and 21; in one compiled call, 40 and 3;
    # its ACCEPT ruling kept per request, 36.
    assert total <= 38
    assert numpy_calls <= 4
    # The prefix still waits for episode 0, and books it when it comes.
    assert scheduler.footer(rulings[0].request_id).total_steps == 0
    scheduler.complete_many(1, [(orders[1].task_id, tuple(first), (100,) * len(first))])
    assert scheduler.footer(rulings[0].request_id).total_steps == 100 * (len(first) + 8)


def test_an_accept_ruling_is_made_once_per_request_and_outcome() -> None:
    """Judging and booking results of a request make its ACCEPT ruling once per
    outcome (done or not), then hand out that frozen ruling again; another
    request, or the result that completes one, gets its own."""
    scheduler = Scheduler(prefetch_factor=1, capacity_steps=0)
    scheduler.add_worker(1, 8)
    scheduler.set_eligible(1, True)
    rulings = []
    for request_index in (5, 6):
        request_id = scheduler.start_sample(
            RequestSpec(Mode.EPISODES, 8, 7, request_index, agent_version=0, env_generation=1)
        )
        (order,) = scheduler.dispatch()
        indices = order.units.episode_indices.tolist()
        results = [(order.task_id, (i,), (10,)) for i in indices]
        judged = scheduler.classify_many(1, [(task, held) for task, held, _ in results])
        first = scheduler.complete_many(1, results[:1])
        profile = cProfile.Profile()
        profile.enable()
        rest = scheduler.complete_many(1, results[1:])
        profile.disable()
        made = [
            calls
            for (_, _, name), (_, calls, *_) in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
            if name == "prebuilt"
        ]
        # At most the ruling of the result that completes the request (kept in
        # the process: an earlier scheduler's request of that id may have made it).
        assert sum(made) <= 1
        booked = [*first, *rest]
        assert all(r.verdict is Verdict.ACCEPT and r.request_id == request_id for r in booked)
        assert [r.done for r in booked] == [False] * 7 + [True]
        assert len({id(r) for r in booked[:7]} | {id(r) for r in judged}) == 1
        rulings.append(booked[0])
        scheduler.finish(request_id)
    assert rulings[0].request_id != rulings[1].request_id


def test_a_batch_of_one_tasks_results_is_judged_in_few_calls() -> None:
    """Results of one episode task, every episode outstanding (the common
    batch), are judged by one compiled call over their header tuples, with
    no grouping by task: a handful of calls, however many results."""
    scheduler = Scheduler(prefetch_factor=1, capacity_steps=0)
    scheduler.add_worker(1, 8)
    scheduler.set_eligible(1, True)
    request_id = scheduler.start_sample(
        RequestSpec(Mode.EPISODES, 8, 7, 3, agent_version=0, env_generation=1)
    )
    (order,) = scheduler.dispatch()
    indices = order.units.episode_indices.tolist()
    batch = [(order.task_id, tuple(indices[k : k + 2])) for k in range(0, 8, 2)]
    scheduler.classify_many(1, batch)  # the ruling kept
    profile = cProfile.Profile()
    profile.enable()
    rulings = scheduler.classify_many(1, batch)
    profile.disable()
    assert [(r.verdict, r.request_id) for r in rulings] == [(Verdict.ACCEPT, request_id)] * 4
    total, numpy_calls = _calls(profile)
    # Grouped by task first, it took 18 calls.
    assert total <= 10
    assert numpy_calls == 0
