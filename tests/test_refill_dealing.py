"""A refill's units dealt to its workers in one compiled call (rlfleet/scheduling/_deal.c).

The numpy dealing (``units._owners`` and ``units._dealt``, each worker's
units sorted) is the reference: the compiled call must give the same units
to the same workers in the same order, and answer None (the numpy path
then deals) for anything out of its common case.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlfleet.protocol.modes import Mode
from rlfleet.scheduling import units as units_module
from rlfleet.scheduling._deal import deal
from rlfleet.scheduling.scheduler import RequestSpec, Scheduler, TaskOrder


def reference(
    taken: np.ndarray, slots: list[int], idle: list[int], room: list[int]
) -> list[list[int]]:
    owners = units_module._owners(slots, idle, room)[: len(taken)]
    picked = units_module._dealt(taken, owners, len(slots))
    return [np.sort(mine).tolist() for mine in picked]


def compiled(
    taken: np.ndarray, slots: list[int], idle: list[int], room: list[int]
) -> list[list[int]] | None:
    out = np.full(len(taken), -1, dtype=np.int64)
    ends = deal(taken, slots, idle, room, out)
    if ends is None:
        assert (out == -1).all()  # nothing written
        return None
    starts = [0, *ends[:-1]]
    return [out[start:end].tolist() for start, end in zip(starts, ends, strict=True)]


@st.composite
def refills(draw: st.DrawFn) -> tuple[np.ndarray, list[int], list[int], list[int]]:
    """Workers' slots, idle slots and room, and ascending units no more than they take."""
    workers = draw(st.integers(1, 6))
    slots = draw(st.lists(st.integers(1, 9), min_size=workers, max_size=workers))
    idle = [draw(st.integers(0, s)) for s in slots]
    room = draw(st.lists(st.integers(0, 60), min_size=workers, max_size=workers))
    total = sum(idle) + sum(room)
    count = draw(st.integers(0, total))
    # Requeued units (ascending, below the new ones), then new ones.
    requeued = sorted(draw(st.sets(st.integers(0, 99), max_size=count)))
    first = 100 + draw(st.integers(0, 1000))
    taken = np.array([*requeued, *range(first, first + count - len(requeued))], dtype=np.int64)
    return taken, slots, idle, room


@settings(max_examples=500, deadline=None)
@given(refills())
def test_the_compiled_dealing_gives_what_the_numpy_dealing_gives(
    refill: tuple[np.ndarray, list[int], list[int], list[int]],
) -> None:
    taken, slots, idle, room = refill
    assert compiled(taken, slots, idle, room) == reference(taken, slots, idle, room)


@pytest.mark.parametrize(
    ("taken", "slots", "idle", "room"),
    [
        ([3, 2], [2], [2], [0]),  # not ascending: each worker's would need a sort
        ([1, 1], [2], [2], [0]),  # twice
        ([1, 2, 3], [2], [1], [1]),  # more units than the workers take
        ([1], [0], [1], [0]),  # a worker with no slot
        ([1], [1], [-1], [2]),  # a negative idle count
        ([1], [1], [1], [True]),  # not an exact int
        ([1], [1, 1], [1], [0]),  # lists of different lengths
        ([1], [], [], []),  # no worker
    ],
)
def test_the_compiled_dealing_leaves_the_uncommon_cases_to_numpy(
    taken: list[int], slots: list[int], idle: list[int], room: list[int]
) -> None:
    column = np.array(taken, dtype=np.int64)
    assert compiled(column, slots, idle, room) is None


def test_the_compiled_dealing_takes_only_int64_columns_of_one_length() -> None:
    taken = np.arange(4, dtype=np.int64)
    assert deal(taken.astype(np.int32), [2], [2], [2], np.empty(4, dtype=np.int64)) is None
    assert deal(taken, [2], [2], [2], np.empty(3, dtype=np.int64)) is None
    assert deal(taken, [2], [2], [2], np.empty(4, dtype=np.int32)) is None
    assert deal(taken[::2], [2], [2], [0], np.empty(2, dtype=np.int64)) is None
    assert deal(taken, [2], [2], [2], taken) is None  # out overlapping taken
    frozen = np.empty(4, dtype=np.int64)
    frozen.flags.writeable = False
    assert deal(taken, [2], [2], [2], frozen) is None
    with pytest.raises(TypeError):
        deal(taken, [2], [2], [2])  # type: ignore[call-arg]


def run_fleet(
    num_envs: list[int], amount: int, lengths: list[int], lose: int | None
) -> list[tuple[int, int, list[int], list[int], list[int]]]:
    """Every order of a STEPS request run to its end on these workers (one
    lost after its first result when ``lose``), as (worker, task, indices,
    env seeds, policy seeds)."""
    scheduler = Scheduler(prefetch_factor=1, capacity_steps=64)
    for worker_id, n in enumerate(num_envs, start=1):
        scheduler.add_worker(worker_id, n)
        scheduler.set_eligible(worker_id, True)
    scheduler.start_sample(RequestSpec(Mode.STEPS, amount, 7, 3, 0, 1))
    sent: list[tuple[int, int, list[int], list[int], list[int]]] = []
    held: dict[int, list[TaskOrder]] = {}
    turn = 0
    while True:
        for order in scheduler.dispatch():
            units = order.units
            sent.append(
                (
                    order.worker_id,
                    order.task_id,
                    units.episode_indices.tolist(),
                    units.env_seeds.tolist(),
                    units.policy_seeds.tolist(),
                )
            )
            held.setdefault(order.worker_id, []).append(order)
        busy = sorted(w for w, orders in held.items() if orders)
        if not busy:
            return sent
        worker = busy[turn % len(busy)]
        turn += 1
        order = held[worker].pop(0)
        done = order.units.episode_indices.tolist()
        steps = [lengths[i % len(lengths)] for i in done]
        ruling = scheduler.complete(worker, order.task_id, done, steps)
        if ruling.done:
            return sent
        if lose == worker:
            scheduler.remove_worker(worker)
            held.pop(worker)
            lose = None


@settings(max_examples=60, deadline=None)
@given(
    num_envs=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    amount=st.integers(1, 600),
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=5),
    lose=st.one_of(st.none(), st.integers(1, 4)),
)
def test_a_fleet_gets_the_same_tasks_bit_for_bit_whichever_dealing_runs(
    num_envs: list[int], amount: int, lengths: list[int], lose: int | None
) -> None:
    compiled_run = run_fleet(num_envs, amount, lengths, lose)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(units_module, "deal", lambda *args: None)
        numpy_run = run_fleet(num_envs, amount, lengths, lose)
    assert compiled_run == numpy_run
