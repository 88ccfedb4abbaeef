"""A large request's results are full: a real coordinator and a real worker process.

Each result costs the coordinator and the learner a fixed amount of CPU
whatever its size (docs/data_plane.md, "From the worker to the learner"),
so a worker sends its finished episodes once they hold ``flush_steps``
steps. Only a request's tail may send less: slots idle as the request stops
handing out units, and the coordinator must hear of its last episodes soon.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlfleet.client.fleet import WorkerProcess, spawn_worker, stop_processes
from rlfleet.coordinator import CoordinatorConfig, serve
from rlfleet.scheduling.scheduler import DEFAULT_CAPACITY_STEPS
from tests._coordinator_fakes import sample, wait_for_workers

pytestmark = pytest.mark.timeout(180)

FLUSH_STEPS = 1024
#: Twice the coordinator's default. A worker is refilled while it still holds
#: about half of it, so a refill is late (the worker's queue runs dry and it
#: sends what finished) only if the coordinator, decoding and checking each
#: result, falls more than 16 results behind the worker: on a machine busy
#: with other tests (8 behind, the default's slack, happened there), that is
#: a stall, not the scheduler. Refills still come every ~16 results, so a
#: scheduler that cut results at refills fails here.
CAPACITY_STEPS = 2 * DEFAULT_CAPACITY_STEPS
REQUEST_STEPS = 150_000


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        stop_processes([w.process for w in started], grace=5.0)


def test_a_large_requests_results_hold_flush_steps_each_except_its_tail(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    config = CoordinatorConfig(
        listen="127.0.0.1:0", wait_for_workers_seconds=60.0, capacity_steps=CAPACITY_STEPS
    )
    with serve(config) as server:
        workers.append(
            spawn_worker(
                server.address,
                name="full",
                envs=8,
                log_path=tmp_path / "full.log",
                # The timer never binds here: a result is sent at FLUSH_STEPS
                # (or in the tail), so its size says how the work was dealt.
                extra_args=("--flush-steps", str(FLUSH_STEPS), "--flush-seconds", "60"),
            )
        )
        wait_for_workers(server.address, 1)
        # The fleet learns the mean episode length: capacities in steps from now on.
        sample(server.address, mode=1, amount=2_000, seed=5, request_index=0)
        answer = sample(server.address, mode=1, amount=REQUEST_STEPS, seed=5, request_index=1)
    lengths = answer.batch.lengths
    # The tail: the request hands out no more than its remaining steps need,
    # so the worker's queue may run dry once less than its capacity is left.
    # Twice that, counted back from the answer's end, is surely past it.
    starts = np.cumsum(lengths) - lengths
    tail_start = int(np.searchsorted(starts, REQUEST_STEPS - 2 * CAPACITY_STEPS))
    before_tail = [r for r in answer.results if max(r.episode_indices) < tail_start]
    assert len(before_tail) >= 70  # ~85k steps in 1024-step results
    small = [
        (position, sum(r.lengths), len(r.lengths))
        for position, r in enumerate(answer.results)
        if r in before_tail and sum(r.lengths) < FLUSH_STEPS
    ]
    assert small == [], (
        f"{len(small)} of {len(before_tail)} results before the tail are small "
        f"(position of {len(answer.results)}, steps, episodes): {small}"
    )
