"""A request's tail against real processes: a worker that runs out takes a slow one's units.

Two workers of two slots hold as many units each (a worker's capacity is
in steps), but one steps its envs with no pause and the other sleeps 4 ms
a step: the fast one runs out first and takes the slow one's unstarted
tail. Every answer must equal LocalSampler's bit for bit (all fields but
``episode_infos["worker"]``): no unit lost or booked twice. With tail moves
turned off, none moves and the answer is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.envs import EnvConfig
from tests._coordinator_fakes import assert_same_batch, sample
from tests.fixtures.paced_envs import ENV_ID, PACE_VARIABLE
from tests.fleet_processes import (
    SLOW_ENV_TWIN,
    ProcessFleet,
    env_flags,
    free_port,
    local_episodes,
    run_in_thread,
)
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.timeout(240)

SEED = 17
EPISODES = 2  # SAMPLE_MODE_EPISODES
#: Counter episodes of 5 steps (SLOW_ENV_TWIN's), at each worker's pace.
PACED = EnvConfig(ENV_ID, {"length": 5})
AMOUNT = 600
MOVED = "rlfleet_units_moved_total"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[ProcessFleet]:
    with ProcessFleet(tmp_path) as processes:
        yield processes


def start(fleet: ProcessFleet, env: dict[str, str] | None = None) -> int:
    """A coordinator (its metrics port returned; ``env``: more variables of
    its process) whose workers hold 2,000 steps (400 units), a fast worker
    and a slow one (20 ms an episode)."""
    port = free_port()
    fleet.start_coordinator(
        "--metrics-listen",
        f"127.0.0.1:{port}",
        "--capacity-steps",
        "2000",
        *env_flags(PACED),
        env=env,
    )
    module = ["tests.fixtures.paced_envs"]
    fleet.start_worker(name="fast", envs=2, imports=module)
    fleet.start_worker(name="slow", envs=2, imports=module, env={PACE_VARIABLE: "0.004"})
    fleet.wait_for_workers(2)
    return port


def test_the_fast_worker_takes_the_slow_workers_tail_and_the_batch_is_unchanged(
    fleet: ProcessFleet,
) -> None:
    port = start(fleet)
    answer = sample(fleet.address, timeout=120, mode=EPISODES, amount=AMOUNT, seed=SEED)
    (expected,) = local_episodes(SLOW_ENV_TWIN, AMOUNT, seed=SEED)
    assert_same_batch(answer.batch, expected)
    assert answer.footer.num_episodes == AMOUNT and answer.footer.reassigned_units == 0
    samples = scrape(port)
    assert value(samples, MOVED) > 0
    assert value(samples, "rlfleet_episodes_total") == AMOUNT


def test_with_tail_moves_off_no_unit_moves_and_the_batch_is_unchanged(
    fleet: ProcessFleet,
) -> None:
    # The operator's way: the variable a ConfigMap sets (--tail-moves off).
    port = start(fleet, env={"RLFLEET_TAIL_MOVES": "off"})
    answer = sample(fleet.address, timeout=120, mode=EPISODES, amount=AMOUNT, seed=SEED)
    (expected,) = local_episodes(SLOW_ENV_TWIN, AMOUNT, seed=SEED)
    assert_same_batch(answer.batch, expected)
    assert answer.footer.num_episodes == AMOUNT and answer.footer.reassigned_units == 0
    samples = scrape(port)
    assert value(samples, MOVED) == 0
    assert value(samples, "rlfleet_episodes_total") == AMOUNT


def test_the_worker_holding_moved_units_killed_loses_and_repeats_nothing(
    fleet: ProcessFleet,
) -> None:
    port = start(fleet)
    taker = fleet.workers[0]
    answer = run_in_thread(
        lambda: sample(fleet.address, timeout=180, mode=EPISODES, amount=AMOUNT, seed=SEED)
    )
    fleet.wait_until(lambda: value(scrape(port), MOVED) > 0 or None, what="units moved")
    fleet.kill(taker)  # the moved units run again, on the worker they were taken from
    result = answer(180)
    (expected,) = local_episodes(SLOW_ENV_TWIN, AMOUNT, seed=SEED)
    assert_same_batch(result.batch, expected)
    assert result.footer.num_episodes == AMOUNT
