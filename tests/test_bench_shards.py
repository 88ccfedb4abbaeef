"""benchmarks/shards.py runs end to end (tiny), on loopback and on namespace hosts.

Real coordinator processes, each with its own synthetic workers, and one
learner over them; the figures are not checked against any speed (a shared
machine's timings), only that each is reported and finite.
"""

from __future__ import annotations

import dataclasses
import math

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
TINY = shards.Setup(workers=1, num_envs=8, result_episodes=4, request_episodes=40, requests=1)


def check(result: dict[str, object], out: str) -> None:
    reports = result["reports"]
    assert isinstance(reports, list)
    assert [r["coordinators"] for r in reports] == [1, 2]
    for report in reports:
        assert set(report) == _KEYS
        assert report["steps"] == TINY.requests * TINY.request_episodes * TINY.episode_steps
        assert len(report["coordinator_cpu_seconds"]) == report["coordinators"]
        for key in _KEYS - {"coordinator_cpu_seconds"}:
            assert math.isfinite(report[key]) and report[key] > 0, (key, report)
    for key in ("capacity_ratio", "wall_ratio"):
        value = result[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0
    assert "2 over 1 coordinator(s): capacity" in out


def test_the_shards_benchmark_reports_both_layouts(capsys: pytest.CaptureFixture[str]) -> None:
    check(shards.run(TINY), capsys.readouterr().out)


@pytest.mark.netns
def test_the_shards_benchmark_runs_on_namespace_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    result = shards.run(dataclasses.replace(TINY, netns=True))
    check(result, capsys.readouterr().out)
