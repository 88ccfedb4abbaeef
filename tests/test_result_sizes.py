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
from rlfleet.envs import EnvConfig
from rlfleet.scheduling.scheduler import DEFAULT_CAPACITY_STEPS
from rlfleet.v1 import worker_pb2
from rlfleet.worker._flush import FLUSH_STEPS as DEFAULT_FLUSH_STEPS
from rlfleet.worker._flush import NATIVE_FLUSH_STEPS
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


def _results_before_tail(
    workers: list[WorkerProcess],
    log_path: Path,
    *,
    capacity_steps: int,
    flush_steps: int | None,
    tail_steps: int,
    native: bool = False,
    request_steps: int = REQUEST_STEPS,
) -> tuple[list[worker_pb2.EpisodeResult], list[worker_pb2.EpisodeResult]]:
    """A real coordinator and one real worker (8 envs, or 64 of a native vector
    env; flushing at ``flush_steps`` steps, None: its default; the timer never
    binds, so a result's size says how the work was dealt) answer a request of
    ``request_steps`` steps, after one that teaches the fleet the mean episode
    length. Returns the answer's results, and those whose episodes all start
    more than ``tail_steps`` before the answer's end."""
    config = CoordinatorConfig(
        listen="127.0.0.1:0",
        wait_for_workers_seconds=60.0,
        capacity_steps=capacity_steps,
        env=EnvConfig("CartPole-v1", vectorization="vector_entry_point" if native else None),
    )
    flush = () if flush_steps is None else ("--flush-steps", str(flush_steps))
    with serve(config) as server:
        workers.append(
            spawn_worker(
                server.address,
                name=log_path.stem,
                envs=64 if native else 8,
                log_path=log_path,
                extra_args=(*flush, "--flush-seconds", "60"),
            )
        )
        wait_for_workers(server.address, 1)
        # The fleet learns the mean episode length: capacities in steps from now on.
        sample(server.address, mode=1, amount=2_000, seed=5, request_index=0)
        answer = sample(server.address, mode=1, amount=request_steps, seed=5, request_index=1)
    lengths = answer.batch.lengths
    starts = np.cumsum(lengths) - lengths
    tail_start = int(np.searchsorted(starts, request_steps - tail_steps))
    results = list(answer.results)
    return results, [r for r in results if max(r.episode_indices) < tail_start]


def test_a_large_requests_results_hold_flush_steps_each_except_its_tail(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    # The tail: the request hands out no more than its remaining steps need,
    # so the worker's queue may run dry once less than its capacity is left.
    # Twice that, counted back from the answer's end, is surely past it.
    results, before_tail = _results_before_tail(
        workers,
        tmp_path / "full.log",
        capacity_steps=CAPACITY_STEPS,
        flush_steps=FLUSH_STEPS,
        tail_steps=2 * CAPACITY_STEPS,
    )
    assert len(before_tail) >= 70  # ~85k steps in 1024-step results
    small = [
        (position, sum(r.lengths), len(r.lengths))
        for position, r in enumerate(results)
        if r in before_tail and sum(r.lengths) < FLUSH_STEPS
    ]
    assert small == [], (
        f"{len(small)} of {len(before_tail)} results before the tail are small "
        f"(position of {len(results)}, steps, episodes): {small}"
    )


#: A worker reporting twice what the coordinator's capacity_steps holds.
LARGE_FLUSH_STEPS = 4096


def test_a_worker_reporting_more_than_capacity_steps_at_a_time_still_sends_full_results(
    workers: list[WorkerProcess], tmp_path: Path
) -> None:
    # A refill only follows a result. Sized by capacity_steps alone, this
    # worker would hold less than one result's worth: every result would be
    # sent when its queue ran dry, never full. The coordinator sizes the
    # queue to the worker's results instead (five of them), and tops it up
    # while two are left unstarted, so the refill comes before it runs dry.
    # The tail: the worker holds up to 5 results' worth and more as it
    # learns their size; twice that from the answer's end is surely past it.
    _, before_tail = _results_before_tail(
        workers,
        tmp_path / "large.log",
        capacity_steps=LARGE_FLUSH_STEPS // 2,
        flush_steps=LARGE_FLUSH_STEPS,
        tail_steps=10 * LARGE_FLUSH_STEPS,
    )
    full = [r for r in before_tail if sum(r.lengths) >= LARGE_FLUSH_STEPS]
    assert len(before_tail) >= 20  # ~125k steps in 4096-step results
    # The first results, before the worker's result size is known, may be
    # sent dry; a busy machine may delay a refill past two results now and then.
    assert len(full) >= 0.8 * len(before_tail), (
        f"{len(full)} of {len(before_tail)} results before the tail are full: "
        f"{[sum(r.lengths) for r in before_tail]}"
    )


#: Enough steps that a native worker's results before its tail are many: it
#: holds five results' worth (82k steps) and more.
NATIVE_REQUEST_STEPS = 600_000


@pytest.mark.parametrize(
    ("given", "limit"), [(None, NATIVE_FLUSH_STEPS), (DEFAULT_FLUSH_STEPS, DEFAULT_FLUSH_STEPS)]
)
def test_a_native_workers_results_hold_twice_the_default_flush_steps_unless_given(
    workers: list[WorkerProcess], tmp_path: Path, given: int | None, limit: int
) -> None:
    # Each result costs the coordinator and the learner about the same CPU
    # whatever its size, and a native worker's are full: by default it sends
    # them at NATIVE_FLUSH_STEPS, not at the per-env worker's 8,192; a
    # flush_steps it is given holds.
    results, before_tail = _results_before_tail(
        workers,
        tmp_path / f"native_{given}.log",
        capacity_steps=DEFAULT_CAPACITY_STEPS,
        flush_steps=given,
        tail_steps=10 * limit,
        native=True,
        request_steps=NATIVE_REQUEST_STEPS * limit // NATIVE_FLUSH_STEPS,
    )
    sizes = [sum(r.lengths) for r in results]
    # A result is sent after the vector step that took it past the limit: a
    # few CartPole episodes more at most, never a second result's worth.
    assert max(sizes) < limit + 2_000, sizes
    assert len(before_tail) >= 15, sizes
    full = [r for r in before_tail if sum(r.lengths) >= limit]
    assert len(full) >= 0.8 * len(before_tail), sizes
