"""benchmarks/vector_env.py: (a)'s rounds and their comparison.

The figures themselves are not checked (timings of a shared machine);
what is checked is that each round's Remote figure is set against the
strongest alternative of that same round, and that a small run prints
every sampler and both comparisons.
"""

from __future__ import annotations

import re

import psutil
import pytest

from benchmarks import vector_env


def test_each_round_is_compared_with_its_own_strongest_alternative() -> None:
    ratios, won = vector_env.compare_rounds(
        [100.0, 90.0, 120.0], {"subproc": [50.0, 100.0, 60.0], "gymnasium": [80.0, 60.0, 130.0]}
    )
    assert ratios == pytest.approx([100 / 80, 90 / 100, 120 / 130])
    assert won == 1


def test_a_tie_is_not_a_win() -> None:
    assert vector_env.compare_rounds([10.0], {"gymnasium": [10.0]}) == ([1.0], 0)


def test_a_small_run_prints_every_sampler_and_both_comparisons(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One round: each round's comparison is checked above; here, that a run
    # prints them (every round starts three 16-process vector envs).
    argv = ["--quick", "--only-a", "--rounds", "1", "--layout", "local"]
    assert vector_env.main(argv) == 0
    out = capsys.readouterr().out
    for name, mode in vector_env.A_SAMPLERS:
        line = next(line for line in out.splitlines() if f"{name} {mode}" in line)
        assert re.search(r"rounds: [\d,]+(\s|$)", line), line
    for mode in ("sync", "wait_num=8"):
        assert re.search(rf"\[local\] {mode}: .* remote won \d of 1 rounds", out), out
    assert "(b)" not in out


def test_the_latency_bound_is_each_envs_sleep_plus_one_round_trip() -> None:
    # 32 envs, each stepping once per 1.07 ms sleep + 0.03 ms round trip.
    assert vector_env.latency_bound(32, 1.07, 0.03) == pytest.approx(32_000 / 1.1)
    # The goal's share of 32,000 steps/s on 2 cores leaves 2 s of CPU per 25,600 steps.
    assert vector_env.cpu_budget_us(2, 0.8 * 32_000) == pytest.approx(78.125)


def test_the_sleep_floor_measures_its_bare_processes_and_leaves_none() -> None:
    before = {child.pid for child in psutil.Process().children()}
    floor = vector_env.sleep_floor(2, 0.2)
    assert floor.sleep_ms >= 1.0  # time.sleep never returns early
    assert floor.round_trip_ms > 0
    assert floor.sync > 0 and floor.free_running > 0
    assert floor.free_running_cpu_us > 0
    assert {child.pid for child in psutil.Process().children()} <= before
