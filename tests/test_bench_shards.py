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
from rlfleet._util.cpus import allowed_cpus, can_pin, cpu_list_text, one_cpu_each
from rlfleet.errors import ConfigError
from tests.netns_support import unavailable_reason

_KEYS = {
    "coordinators",
    "steps",
    "wall_seconds",
    "steps_per_second",
    "coordinator_cpu_seconds",
    "coordinator_us_per_step",
    "capacity_steps_per_second",
    "learner_cpu_seconds",
    "learner_us_per_step",
}
TINY = shards.Setup(
    workers=1, num_envs=8, result_episodes=4, request_episodes=40, requests=1, rounds=2
)


def check(result: dict[str, Any], out: str, setup: shards.Setup = TINY) -> None:
    # Unpinned, every process may run wherever the benchmark may.
    if not setup.pin and can_pin():
        assert result["cpus"] == [[cpu_list_text(allowed_cpus())] * (1 + setup.workers)] * 2
    rounds = result["rounds"]
    assert len(rounds) == setup.rounds
    for number, round_ in enumerate(rounds, start=1):
        reports = round_["reports"]
        assert [r["coordinators"] for r in reports] == [1, 2]
        for report in reports:
            assert set(report) == _KEYS
            steps = setup.turns * setup.requests * setup.request_episodes * setup.episode_steps
            assert report["steps"] == steps
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


@pytest.mark.skipif(not can_pin(), reason="pinning needs Linux's sched_setaffinity")
def test_pinned_each_coordinator_and_its_workers_run_on_a_cpu_of_their_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup = dataclasses.replace(TINY, rounds=1, workers=2, pin=True)
    result = shards.run(setup)
    out = capsys.readouterr().out
    check(result, out, setup)
    # Coordinator i and its workers, every thread of each, on the i-th CPU
    # (the same one twice on a one-CPU machine).
    assert result["cpus"] == [[cpu_list_text(cpus)] * 3 for cpus in one_cpu_each(2)]
    assert "CPUs of each coordinator, then its workers: " in out


def test_a_round_alternates_the_layouts_turn_by_turn_and_sums_each_layouts_turns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = dataclasses.replace(TINY, rounds=2, turns=3)
    measured: list[int] = []

    def measure(*args: Any) -> dict[str, Any]:
        report = original(*args)
        measured.append(report["coordinators"])
        return report

    original = shards.measure
    monkeypatch.setattr(shards, "measure", measure)
    result = shards.run(setup)
    check(result, capsys.readouterr().out, setup)
    assert measured == [1, 2] * setup.turns * setup.rounds
    for round_ in result["rounds"]:
        turns = round_["turns"]
        assert [[r["coordinators"] for r in turn] for turn in turns] == [[1, 2]] * setup.turns
        for i, report in enumerate(round_["reports"]):
            mine = [turn[i] for turn in turns]
            assert report["steps"] == sum(r["steps"] for r in mine)
            assert report["coordinator_cpu_seconds"] == [
                sum(c) for c in zip(*(r["coordinator_cpu_seconds"] for r in mine), strict=True)
            ]
            assert report["learner_cpu_seconds"] == sum(r["learner_cpu_seconds"] for r in mine)
            # The round's capacity: the slowest coordinator over all its turns.
            slowest = max(report["coordinator_cpu_seconds"])
            assert report["capacity_steps_per_second"] == pytest.approx(report["steps"] / slowest)
        one, two = round_["reports"]
        assert round_["capacity_ratio"] == (
            two["capacity_steps_per_second"] / one["capacity_steps_per_second"]
        )


def test_a_round_of_no_turns_is_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="turns must be at least 1, got 0"):
        shards.run(dataclasses.replace(TINY, turns=0))


def test_the_documented_command_parses() -> None:
    documented = ["--request-episodes", "6400", "--requests", "6", "--turns", "8"]
    args = shards._parser().parse_args(documented)
    assert (args.request_episodes, args.requests, args.turns, args.rounds) == (6400, 6, 8, 5)
    assert (args.carrier, args.neighbour, args.netns, args.pin) == ("data", True, False, False)
    assert shards._parser().parse_args([]).turns == 1
    assert shards._parser().parse_args(["--pin"]).pin


@pytest.mark.netns
def test_the_shards_benchmark_runs_on_namespace_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    result = shards.run(dataclasses.replace(TINY, netns=True))
    check(result, capsys.readouterr().out)
