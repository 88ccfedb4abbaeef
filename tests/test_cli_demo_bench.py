"""``rlfleet demo`` and ``rlfleet bench`` end to end (in-process CLI, real samplers)."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlfleet.bench import BenchConfig, BenchReport, Measurement
from rlfleet.bench.samplers import SampleFn, Timed, measure_interleaved
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


_SAMPLERS = (
    "plain loop: 2 processes x 1 envs at once",
    "VecWorker: 1 envs in this process",
    "SyncVectorEnv: 2 envs in this process",
    "AsyncVectorEnv: 2 env processes",
    "fleet: 2 workers x 1 envs",
)


def _bench(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(
        ["bench", "--workers", "2", "--envs-per-worker", "1", "--steps", "2000",
         "--request-steps", "1000", "--repeats", "1", *extra]
    )  # fmt: skip
    return code, capsys.readouterr().out


def test_bench_prints_every_sampler_its_cpu_per_step_and_the_goals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _bench(capsys, "--check")
    # --check: exit 1 exactly when a goal was missed (the verdicts are checked below).
    assert code == (1 if "MISSED" in out else 0)
    table = out[out.index("sampler") :].splitlines()
    rates = {}
    for line in table:
        m = re.match(
            r"^(" + "|".join(map(re.escape, _SAMPLERS)) + r")\s+([\d,]+)\s+([\d,]+)$", line
        )
        if m:
            rates[m.group(1)] = int(m.group(2).replace(",", ""))
            assert m.group(2) == m.group(3)  # one run: the median is that run
    assert set(rates) == set(_SAMPLERS) and all(rate > 0 for rate in rates.values())
    cpu = dict(re.findall(r"^(.+?)\s+([\d.]+)$", out[out.index("CPU us per env step") :], re.M))
    for role in (
        "plain loop: each plain process",
        "VecWorker: this process",
        "fleet: workers (each, per step it takes)",
        "fleet: coordinator (learner's other threads)",
        "fleet: learner (main thread)",
        "AsyncVectorEnv: all env processes",
    ):
        assert float(cpu[role]) > 0, role
    vs_plain = re.search(
        r"fleet / \(2 plain processes at once\)\s+([\d.]+)\s+goal >= 0.9: (ok|MISSED)", out
    )
    vs_cpu = re.search(
        r"VecWorker / plain loop \(steps per CPU-second\)\s+([\d.]+)\s+goal >= 0.9: (ok|MISSED)",
        out,
    )
    assert vs_plain and vs_cpu
    # The ratios are those of the printed figures (rounded in print).
    expected = rates[_SAMPLERS[4]] / rates[_SAMPLERS[0]]
    assert float(vs_plain.group(1)) == pytest.approx(expected, abs=0.006)
    expected_cpu = float(cpu["plain loop: each plain process"]) / float(
        cpu["VecWorker: this process"]
    )
    assert float(vs_cpu.group(1)) == pytest.approx(expected_cpu, abs=0.01)


def _report(fleet: float, worker_cpu: float) -> BenchReport:
    config = BenchConfig(workers=2, envs_per_worker=8, repeats=3)
    plain_cpu = ({"each plain process": 10.0},) * 3
    worker = ({"this process": worker_cpu},) * 3
    return BenchReport(
        config,
        plain=Measurement("plain", (100.0, 90.0, 120.0), plain_cpu),
        vec_worker=Measurement("VecWorker", (1.0, 1.0, 1.0), worker),
        sync_vector_env=Measurement("sync", (50.0, 50.0, 50.0)),
        async_vector_env=Measurement("async", (20.0, 20.0, 21.0)),
        fleet=Measurement("fleet", (fleet, fleet * 0.9, fleet * 1.2)),
    )


def test_bench_report_ratios_and_verdicts() -> None:
    report = _report(fleet=90.0, worker_cpu=10.0 / 0.9)
    ratios = {ratio.label: ratio for ratio in report.ratios}
    assert ratios["fleet / (2 plain processes at once)"].value == pytest.approx(0.9)
    assert ratios["VecWorker / plain loop (steps per CPU-second)"].value == pytest.approx(0.9)
    assert ratios["fleet / AsyncVectorEnv"].value == pytest.approx(4.5)
    assert ratios["fleet / AsyncVectorEnv"].goal is None
    assert report.goals_met
    text = report.format()
    assert "goal >= 0.9: ok" in text and "MISSED" not in text
    assert "100 / 90 / 120" in text
    assert "pairs: 0.90 / 0.90 / 0.90" in text
    assert not _report(fleet=89.0, worker_cpu=10.0).goals_met
    slow_worker = _report(fleet=95.0, worker_cpu=12.0)
    assert not slow_worker.goals_met
    verdict = r"VecWorker / plain loop \(steps per CPU-second\)\s+0\.83\s+goal >= 0\.9: MISSED"
    assert re.search(verdict, slow_worker.format())


def test_a_goals_ratio_is_the_median_of_its_repeats_pairs_not_of_their_medians() -> None:
    # The machine ran at half speed in the second repeat: both sides of that
    # pair slowed alike. Medians of each side (100 against 50) would say 0.5.
    plain = Measurement("plain", (200.0, 100.0, 210.0), ({"each plain process": 5.0},) * 3)
    cpu = ({"this process": 5.0},) * 3
    report = BenchReport(
        BenchConfig(workers=2, envs_per_worker=8, repeats=3),
        plain=plain,
        vec_worker=Measurement("VecWorker", (1.0, 1.0, 1.0), cpu),
        sync_vector_env=Measurement("sync", (1.0, 1.0, 1.0)),
        async_vector_env=Measurement("async", (1.0, 1.0, 1.0)),
        fleet=Measurement("fleet", (190.0, 95.0, 50.0)),
    )
    ratio = report.ratios[0]
    assert ratio.runs == pytest.approx((0.95, 0.95, 50.0 / 210.0))
    assert ratio.value == pytest.approx(0.95) and ratio.met


def test_each_repeat_times_the_samplers_back_to_back_every_other_one_reversed() -> None:
    timed: list[str] = []

    @contextlib.contextmanager
    def sampler(key: str) -> Iterator[SampleFn]:
        def sample(min_steps: int) -> Timed:
            timed.append(key)
            return Timed(min_steps, 1.0, {"this process": 1.0})

        yield sample

    keys = ("sync", "vec_worker", "plain", "fleet")
    config = BenchConfig(steps=10, request_steps=5, repeats=3)
    measured = measure_interleaved(
        config, {key: key for key in keys}, {key: sampler(key) for key in keys}, lambda _: None
    )
    assert timed[:4] == list(keys)  # the warm-up
    forward, backward = list(keys), list(reversed(keys))
    assert timed[4:] == forward + backward + forward
    assert list(measured) == list(keys)
    assert measured["fleet"].cpu_us_runs == ({"this process": 1.0},) * 3


def test_bench_config_rejects_bad_counts() -> None:
    with pytest.raises(ConfigError, match="envs-per-worker must be an int >= 1, got 0"):
        BenchConfig(envs_per_worker=0)
