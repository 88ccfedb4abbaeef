"""benchmarks/native_fleet_threads.py runs end to end (small), so its figures stay readable.

It starts a real native fleet (the coordinator in this process, worker
processes) and reads every thread from /proc. The timings themselves are
not checked: they are a shared machine's; what is checked is that each
side's threads are there, named, and that the results it counts are the
coordinator's.
"""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import native_fleet_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_native_fleet_benchmark_names_each_sides_threads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--workers", "1", "--envs", "8", "--request-steps", "4000", "--requests", "2"]
    assert native_fleet_threads.main([*argv, "--warmup", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["steps"] >= 8000
    # A worker of 8 envs flushes at 8,192 steps at most: a 4,000-step request
    # takes at least one result, and no result holds more than its request.
    assert 2 <= figures["results"] <= figures["steps"]
    assert figures["steps_per_result"] == pytest.approx(figures["steps"] / figures["results"])
    learner = figures["learner_process"]
    assert learner[native_fleet_threads.LEARNER_MAIN]["us_per_step"] > 0
    # The data loop reads and books the results; the lanes' threads wake only
    # for what the loop must not wait for, so their row may hold nothing.
    assert learner["result lanes"]["us_per_step"] >= 0
    assert learner["data loop"]["us_per_step"] > 0
    assert figures["learner_process_us_per_step"] == pytest.approx(
        sum(t["us_per_step"] for t in learner.values())
    )
    assert figures["workers"]["main"]["us_per_step"] > 0


def test_the_text_report_has_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--workers", "1", "--envs", "8", "--request-steps", "2000", "--requests", "1"]
    assert native_fleet_threads.main([*argv, "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "coordinator and learner (this process)" in out
    assert "result lanes" in out
    assert "workers (each, per step it takes)" in out


def test_per_env_runs_the_bench_fleet_of_gym_envs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--per-env", "--workers", "1", "--request-steps", "2000", "--requests", "1"]
    assert native_fleet_threads.main([*argv, "--warmup", "1", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["steps"] >= 2000
    # rlfleet bench's fleet: gym.make envs (no vectorization), 8 per worker.
    assert figures["env"]["id"] == "CartPole-v1"
    assert "vectorization" not in figures["env"]
    assert figures["envs_per_worker"] == 8
    workers = figures["workers"]
    assert workers["main"]["us_per_step"] > 0
    # Its data connection's reader takes the coordinator's tasks (rlfleet.data-tasks).
    assert "rlfleet-worker-lease-data" in workers
