"""benchmarks/lease_cpu.py runs end to end (small), so its figures stay readable.

It drives the real lease code of the three parts in one process; this
keeps it in step with them. The figures themselves are not checked: they
are timings of a shared machine.
"""

from __future__ import annotations

import re

import pytest

from benchmarks import lease_cpu


def test_the_per_part_cpu_benchmark_runs_every_part(capsys: pytest.CaptureFixture[str]) -> None:
    assert lease_cpu.main(["--calls", "40", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for mode in ("sync", "wait_num=8"):
        line = next(line for line in out.splitlines() if line.startswith(mode))
        for part in ("learner", "coordinator", "worker"):
            assert re.search(rf"{part}\s+\d+", line), line
    assert "env steps" in out


def test_the_pool_benchmark_answers_every_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert lease_cpu.main(["--pool", "--calls", "10"]) == 0
    out = capsys.readouterr().out
    assert "whole reply" in out and "as finished" in out
