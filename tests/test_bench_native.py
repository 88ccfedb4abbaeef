"""``rlfleet bench --native``: the fleet on native vector envs against the
same env in plain loops, and the moonshot verdict (a tiny run, for
correctness only: figures are never checked against a speed)."""

from __future__ import annotations

import re

import pytest

from rlfleet.bench import BenchConfig, Measurement
from rlfleet.bench.native import NativeBenchReport
from rlfleet.cli import main

_SAMPLERS = (
    "one native loop: 16 envs in 1 process",
    "native loops: 2 processes x 16 envs at once",
    "VecWorker: 16 native envs in this process",
    "fleet: 2 workers x 16 native envs",
)


@pytest.mark.parametrize("backend", ["vector_entry_point", "envpool"])
def test_native_bench_prints_every_sampler_its_cpu_and_the_moonshot(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["bench", "--native", backend, "--workers", "2", "--envs-per-worker", "16",
         "--steps", "3000", "--request-steps", "1500", "--repeats", "1", "--check"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == (1 if "MISSED" in out else 0)
    assert f"CartPole-v1 ({backend})" in out
    rates = {}
    for line in out[out.index("sampler") :].splitlines():
        m = re.match(r"^(" + "|".join(map(re.escape, _SAMPLERS)) + r")\s+([\d,]+)\s+", line)
        if m:
            rates[m.group(1)] = int(m.group(2).replace(",", ""))
    assert set(rates) == set(_SAMPLERS) and all(rate > 0 for rate in rates.values())
    cpu = dict(re.findall(r"^(.+?)\s+([\d.]+)$", out[out.index("CPU us per env step") :], re.M))
    for role in (
        "one native loop: each plain process",
        "native loops: each plain process",
        "VecWorker: this process",
        "fleet: workers (each, per step it takes)",
        "fleet: coordinator (learner's other threads)",
        "fleet: learner (main thread)",
    ):
        assert float(cpu[role]) > 0, role
    moonshot = re.search(
        r"fleet / 1M steps/s \(the moonshot\)\s+([\d.]+)\s+goal >= 1: (ok|MISSED)", out
    )
    assert moonshot
    assert float(moonshot.group(1)) == pytest.approx(rates[_SAMPLERS[3]] / 1e6, abs=0.006)


def test_native_report_verdict_follows_the_fleet_rate() -> None:
    def report(fleet: float) -> NativeBenchReport:
        measured = {
            "one_loop": Measurement("one", (500_000.0,)),
            "loops": Measurement("two", (1_000_000.0,)),
            "vec_worker": Measurement("vec", (1.0,)),
            "fleet": Measurement("fleet", (fleet,)),
        }
        return NativeBenchReport(BenchConfig(), "envpool", measured)

    assert report(1_000_000.0).goals_met
    slow = report(250_000.0)
    assert not slow.goals_met
    ratios = {ratio.label: ratio.value for ratio in slow.ratios}
    assert ratios["fleet / (2 native loops at once)"] == pytest.approx(0.25)
    assert ratios["fleet / (1 native loop)"] == pytest.approx(0.5)
    assert "goal >= 1: MISSED" in slow.format()
    assert "goal >= 0.8: MISSED" in slow.format()
    # The moonshot missed alone fails too; the machine's share alone as well.
    assert not report(900_000.0).goals_met
    assert not NativeBenchReport(
        BenchConfig(),
        "envpool",
        {
            "one_loop": Measurement("one", (1_000_000.0,)),
            "loops": Measurement("two", (2_000_000.0,)),
            "vec_worker": Measurement("vec", (1.0,)),
            "fleet": Measurement("fleet", (1_500_000.0,)),
        },
    ).goals_met
