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
    # again with numpy's search, 70 and 21; in one compiled call, 40 and 3.
    assert total <= 44
    assert numpy_calls <= 4
    # The prefix still waits for episode 0, and books it when it comes.
    assert scheduler.footer(rulings[0].request_id).total_steps == 0
    scheduler.complete_many(1, [(orders[1].task_id, tuple(first), (100,) * len(first))])
    assert scheduler.footer(rulings[0].request_id).total_steps == 100 * (len(first) + 8)
