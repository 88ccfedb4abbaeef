"""benchmarks/shards.py runs end to end (tiny), on loopback and on namespace hosts.

Real coordinator processes, each with its own synthetic workers, and one
learner over them; the figures are not checked against any speed (a shared
machine's timings), only that each is reported and finite, that the layouts
take turns round by round on the same coordinators, and that every round's
ratio is reported.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from benchmarks import shards
from tests.netns_support import unavailable_reason

_KEYS = {
    "coordinators",
    "steps",
    "wall_seconds",
    "steps_per_second",
    "coordinator_cpu_seconds",
    "coordinator_us_per_step",
    "capacity_steps_per_second",
    "learner_us_per_step",
}
TINY = shards.Setup(
    workers=1, num_envs=8, result_episodes=4, request_episodes=40, requests=1, rounds=2
)


def check(result: dict[str, Any], out: str, setup: shards.Setup = TINY) -> None:
    rounds = result["rounds"]
    assert len(rounds) == setup.rounds
    for number, round_ in enumerate(rounds, start=1):
        reports = round_["reports"]
        assert [r["coordinators"] for r in reports] == [1, 2]
        for report in reports:
            assert set(report) == _KEYS
            assert report["steps"] == setup.requests * setup.request_episodes * setup.episode_steps
            assert len(report["coordinator_cpu_seconds"]) == report["coordinators"]
            for key in _KEYS - {"coordinator_cpu_seconds"}:
                assert math.isfinite(report[key]) and report[key] > 0, (key, report)
        for key in ("capacity_ratio", "wall_ratio"):
            value = round_[key]
            assert isinstance(value, float) and math.isfinite(value) and value > 0
        # Layout 1 then layout 2, each round, with the round's ratio printed.
        assert f"round {number}, 2 over 1 coordinator(s): capacity" in out
    assert result["capacity_ratios"] == [r["capacity_ratio"] for r in rounds]
    assert result["met"] == sum(r >= shards.GOAL_RATIO for r in result["capacity_ratios"])
    assert "capacity ratio, every round: " in out


def test_the_shards_benchmark_reports_every_round_of_both_layouts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    check(shards.run(TINY), capsys.readouterr().out)


def test_the_shards_benchmark_runs_on_grpc_only_without_a_neighbour(
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup = dataclasses.replace(TINY, rounds=1, carrier="join", neighbour=False)
    check(shards.run(setup), capsys.readouterr().out, setup)


def test_the_documented_command_parses() -> None:
    args = shards._parser().parse_args(["--request-episodes", "6400", "--requests", "6"])
    assert (args.request_episodes, args.requests, args.rounds) == (6400, 6, 5)
    assert (args.carrier, args.neighbour, args.netns) == ("data", True, False)


@pytest.mark.netns
def test_the_shards_benchmark_runs_on_namespace_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    result = shards.run(dataclasses.replace(TINY, netns=True))
    check(result, capsys.readouterr().out)
