"""benchmarks/vector_env.py: (a)'s rounds and their comparison.

The figures themselves are not checked (timings of a shared machine);
what is checked is that each round's Remote figure is set against the
strongest alternative of that same round, and that a small run prints
every sampler and both comparisons.
"""

from __future__ import annotations

import re

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
    argv = ["--quick", "--only-a", "--rounds", "2", "--layout", "local"]
    assert vector_env.main(argv) == 0
    out = capsys.readouterr().out
    for name, mode in vector_env.A_SAMPLERS:
        line = next(line for line in out.splitlines() if f"{name} {mode}" in line)
        assert re.search(r"rounds: [\d,]+, [\d,]+$|rounds: [\d,]+, [\d,]+ ", line), line
    for mode in ("sync", "wait_num=8"):
        assert re.search(rf"\[local\] {mode}: .* remote won \d of 2 rounds", out), out
    assert "(b)" not in out
