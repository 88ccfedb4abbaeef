"""benchmarks/capacity.py runs end to end (tiny), so its report stays readable.

A real coordinator process serves synthetic workers over the real Join
protocol; a result it refused would end the run. The figures themselves
are not checked against any speed: they are timings of a shared machine.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks import capacity

_SETTING_KEYS = {
    "result_steps",
    "requests",
    "steps",
    "results",
    "messages",
    "coordinator_us_per_step",
    "coordinator_us_per_result",
    "steps_per_core_second",
    "mb_per_core_second",
    "learner_us_per_step",
    "tasks_per_result",
}


def test_the_capacity_benchmark_reports_every_figure_for_both_step_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    shapes = [
        dataclasses.replace(shape, request_steps=tuple(s // 20 for s in shape.request_steps))
        for shape in capacity.SHAPES
    ]
    reports = capacity.run(shapes, workers=2, num_envs=16, repeats=1, carriers=capacity.CARRIERS)
    assert [(r["shape"], r["carrier"]) for r in reports] == [
        ("cartpole", "join"),
        ("cartpole", "data"),
        ("atari", "join"),
        ("atari", "data"),
    ]
    for report, shape in zip(reports, [s for s in shapes for _ in capacity.CARRIERS], strict=True):
        assert report["bytes_per_step"] > 0
        settings = report["settings"]
        assert [s["result_steps"] for s in settings] == [
            k * shape.episode_steps for k in shape.result_episodes
        ]
        for setting in settings:
            assert set(setting) == _SETTING_KEYS
            assert setting["requests"] == len(shape.request_steps)
            assert setting["steps"] >= sum(shape.request_steps)
            assert setting["messages"] >= setting["results"] > 0
            for key in _SETTING_KEYS:
                assert math.isfinite(setting[key]) and setting[key] > 0, (key, setting)
        # A least-squares fit of a tiny run may put the whole cost on one
        # term; a cost is never negative.
        fit = report["fit"]
        assert set(fit) == {"us_per_step", "us_per_result", "ms_per_request"}
        assert all(math.isfinite(v) and v >= 0 for v in fit.values()), fit
        assert any(v > 0 for v in fit.values()), fit
    out = capsys.readouterr().out
    assert "cartpole, results on data: 29 bytes of step data per step" in out
    assert "fit:" in out and "us per result" in out


def test_a_nonnegative_fit_never_makes_a_cost_negative() -> None:
    import numpy as np

    design = np.array([[1.0, 10.0, 1.0], [1.0, 20.0, 1.0], [1.0, 30.0, 9.0]])
    coef = capacity.nonnegative_fit(design, np.array([1.0, 2.0, 2.9]))
    assert np.all(coef >= 0)
    exact = capacity.nonnegative_fit(design, design @ np.array([0.5, 0.1, 0.2]))
    np.testing.assert_allclose(exact, [0.5, 0.1, 0.2], atol=1e-9)
