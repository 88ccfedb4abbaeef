"""``rlfleet demo`` and ``rlfleet bench`` end to end (in-process CLI, real samplers)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from rlfleet.bench import BenchConfig, BenchReport, Measurement
from rlfleet.cli import main
from rlfleet.errors import ConfigError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# "   3        24.1        81       8,123     25,000      v4     1.2s"
_ROW = re.compile(
    r"^\s*(?P<itr>\d+)\s+(?P<ret>[\d.]+)\s+(?P<eps>\d+)\s+(?P<steps>[\d,]+)\s+"
    r"(?P<sps>[\d,]+|inf)\s+(?P<ver>v\d+|-)\s+[\d.]+s$"
)


def _rows(stdout: str) -> list[dict[str, str]]:
    return [m.groupdict() for line in stdout.splitlines() if (m := _ROW.match(line))]


def _demo(
    capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str, str, list[dict[str, str]]]:
    code = main(["demo", "--seed", "0", *args])
    out, err = capsys.readouterr()
    return code, out, err, _rows(out)


def test_demo_local_out_of_budget_exits_1_and_plots(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "curves" / "curve.png"
    code, out, err, rows = _demo(
        capsys,
        "--local",
        "--workers", "1",
        "--envs-per-worker", "2",
        "--steps-per-iteration", "500",
        "--max-steps", "1500",
        "--plot", str(plot),
    )  # fmt: skip
    assert code == 1
    assert "VPG on CartPole-v1 in this process (LocalSampler), 1 workers x 2 envs" in out
    # Each iteration samples a little over 500 steps (whole ~22-step
    # episodes), so the 1,500-step budget ends the loop after the third.
    assert [row["itr"] for row in rows] == ["0", "1", "2"]
    totals = [int(row["steps"].replace(",", "")) for row in rows]
    assert totals[0] >= 500 and totals[1] >= 1000 and 1500 <= totals[2] < 1500 + 500
    # A near-uniform initial policy balances the pole ~22 steps on average.
    assert 10 < float(rows[0]["ret"]) < 40
    assert "target average return 475 not reached within --max-steps 1,500" in err
    assert "best average return" in err
    assert f"learning curve written to {plot.resolve()}" in out
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_demo_local_reaches_a_low_target_and_exits_0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where the default run folder would go
    code, out, err, rows = _demo(
        capsys,
        "--local",
        "--workers", "2",
        "--envs-per-worker", "2",
        "--steps-per-iteration", "1000",
        "--target-return", "45",
        "--max-steps", "60000",
        "--no-plot",
    )  # fmt: skip
    assert code == 0, err
    returns = [float(row["ret"]) for row in rows]
    assert returns[-1] >= 45 and all(r < 45 for r in returns[:-1])
    assert re.search(rf"reached average return [\d.]+ >= 45 at iteration {len(rows) - 1}\b", out)
    assert "learning curve" not in out
    assert not list(tmp_path.iterdir())


def test_demo_without_matplotlib_skips_the_plot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # matplotlib is installed here; a None entry in sys.modules makes its
    # import fail exactly as it does where it is missing.
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    plot = tmp_path / "curve.png"
    code, out, _, rows = _demo(
        capsys, "--local", "--max-iterations", "1", "--steps-per-iteration", "200",
        "--plot", str(plot),
    )  # fmt: skip
    assert code == 1
    assert len(rows) == 1
    assert "matplotlib is not installed" in out and "rlfleet[plot]" in out
    assert not plot.exists()


def test_demo_writes_into_a_run_folder_and_says_where_without_stray_logs(
    tmp_path: Path,
) -> None:
    """The default plot goes to rlfleet-runs/demo-<time>/, on a first matplotlib run too."""
    import os
    import subprocess

    fresh_cache = tmp_path / "mplconfig"  # matplotlib builds its font cache: an INFO line
    result = subprocess.run(
        [sys.executable, "-m", "rlfleet", "demo", "--local", "--workers", "1",
         "--envs-per-worker", "1", "--steps-per-iteration", "200", "--max-iterations", "1"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
        env={**os.environ, "MPLCONFIGDIR": str(fresh_cache),
             "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    (plot,) = (tmp_path / "rlfleet-runs").glob("demo-*/learning_curve.png")
    assert f"learning curve written to {plot.resolve()}" in result.stdout
    assert plot.read_bytes()[:8] == PNG_MAGIC
    assert " INFO " not in result.stdout + result.stderr
    assert not (tmp_path / "learning_curve.png").exists()


def test_demo_rejects_a_non_positive_budget(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--max-steps", "0"])
    assert exc.value.code == 2
    assert "must be >= 1, got 0" in capsys.readouterr().err


def test_demo_on_the_fleet_matches_the_local_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--workers", "2", "--envs-per-worker", "2", "--steps-per-iteration", "1000",
            "--max-iterations", "3", "--no-plot")  # fmt: skip
    code, out, err, fleet_rows = _demo(capsys, *args)
    assert code == 1, err
    assert "on an embedded local fleet, 2 workers x 2 envs" in out
    assert "not reached within --max-steps 1,000,000 / --max-iterations 3" in err
    assert len(fleet_rows) == 3
    # Every iteration pushes new parameters: one new agent version each.
    versions = [int(row["ver"][1:]) for row in fleet_rows]
    assert versions == list(range(versions[0], versions[0] + 3))
    # The fleet returns LocalSampler's batches for the same seed, so the
    # learner sees the same data and the runs agree line by line.
    _, _, _, local_rows = _demo(capsys, "--local", *args)
    for key in ("ret", "eps", "steps"):
        assert [r[key] for r in fleet_rows] == [r[key] for r in local_rows]


def test_bench_prints_the_table_with_all_three_samplers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["bench", "--workers", "2", "--envs-per-worker", "1", "--steps", "3000",
         "--request-steps", "1500", "--repeats", "1"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    table = out[out.index("sampler") :].splitlines()
    rates = {}
    for line in table:
        m = re.match(r"^(fleet: 2 workers x 1 envs|single process: VecWorker, 1 envs|"
                     r"gymnasium AsyncVectorEnv, 2 envs)\s+([\d,]+)\s+([\d,]+)$", line)  # fmt: skip
        if m:
            rates[m.group(1)] = int(m.group(2).replace(",", ""))
            assert m.group(2) == m.group(3)  # one run: the median is that run
    assert len(rates) == 3 and all(rate > 0 for rate in rates.values())
    vs_single = re.search(
        r"fleet / \(2 x single process\)\s+([\d.]+)\s+goal >= 0.8: (ok|MISSED)", out
    )
    vs_async = re.search(r"fleet / AsyncVectorEnv\s+([\d.]+)\s+goal >= 4: (ok|MISSED)", out)
    assert vs_single and vs_async
    fleet = rates["fleet: 2 workers x 1 envs"]
    # The ratios are those of the printed rates (which are rounded to 1 step/s).
    expected_single = fleet / (2 * rates["single process: VecWorker, 1 envs"])
    expected_async = fleet / rates["gymnasium AsyncVectorEnv, 2 envs"]
    assert float(vs_single.group(1)) == pytest.approx(expected_single, abs=0.006)
    assert float(vs_async.group(1)) == pytest.approx(expected_async, abs=0.006)


def test_bench_report_ratios_and_verdicts() -> None:
    config = BenchConfig(workers=2, envs_per_worker=8, repeats=3)
    report = BenchReport(
        config,
        fleet=Measurement("fleet", (70.0, 80.0, 95.0)),
        single=Measurement("single", (50.0, 10.0, 60.0)),
        async_vector_env=Measurement("async", (20.0, 20.0, 21.0)),
    )
    assert report.fleet_vs_single == pytest.approx(80 / (2 * 50))
    assert report.fleet_vs_async == pytest.approx(4.0)
    assert report.goals_met
    text = report.format()
    assert "fleet / (2 x single process)                      0.80   goal >= 0.8: ok" in text
    assert "70 / 80 / 95" in text
    slower = BenchReport(
        config, Measurement("fleet", (79.0,)), report.single, report.async_vector_env
    )
    assert not slower.goals_met
    assert "MISSED" in slower.format()


def test_bench_config_rejects_bad_counts() -> None:
    with pytest.raises(ConfigError, match="envs-per-worker must be an int >= 1, got 0"):
        BenchConfig(envs_per_worker=0)
