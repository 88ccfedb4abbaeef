"""``rlfleet bench --native BACKEND``: the fleet on native vector envs, and the moonshot.

In one run, with the same native vector env (``vector_entry_point`` or
``envpool``, K envs per process) and the same kind of policy (an MLP with a
categorical sample):

* **native loop x 1** and **x W at once** — the plain loop
  (:mod:`rlfleet.bench.plain_loop`) on one native vector env per process,
  every step stored: the strongest plain alternative, and W of them the
  machine's real ceiling;
* **VecWorker** — one worker's engine on the native env in this process;
* **fleet** — ``Fleet.local(W, K)`` ``obtain_samples`` with native workers.

The moonshot (docs/performance.md) is >= 1M env steps/s end to end to the
learner on a 2-core machine, and the goal against the machine is >= 0.8 of
W plain loops at once; the report sets the fleet against both and gives
each process's CPU microseconds per step, which say where the time goes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rlfleet.bench.report import BenchConfig, Measurement, Ratio, format_table
from rlfleet.bench.samplers import (
    fleet_sampler,
    measure_interleaved,
    plain_processes,
    vec_worker_sampler,
)
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy

#: The moonshot: env steps per second delivered to the learner.
MOONSHOT_STEPS_PER_SECOND = 1_000_000
#: The goal against the machine's ceiling: the fleet delivers at least this
#: share of what W plain native loops run at once do.
LOOPS_GOAL = 0.8
#: The report's rows, whatever order the samplers were timed in.
_TABLE_ORDER = ("one_loop", "loops", "vec_worker", "fleet")


@dataclasses.dataclass(frozen=True)
class NativeBenchReport:
    """The measurements of one native run and their ratios.

    Attributes:
        config: What was measured.
        vectorization: The native backend.
        measurements: By sampler key: ``one_loop``, ``loops``, ``vec_worker``, ``fleet``.
    """

    config: BenchConfig
    vectorization: str
    measurements: dict[str, Measurement]

    @property
    def ratios(self) -> list[Ratio]:
        """The moonshot, then the fleet against the plain alternatives (W loops: a goal too)."""
        m, w = self.measurements, self.config.workers
        fleet = m["fleet"].median
        return [
            Ratio("fleet / 1M steps/s (the moonshot)", fleet / MOONSHOT_STEPS_PER_SECOND, 1.0),
            Ratio.paired(
                f"fleet / ({w} native loops at once)",
                m["fleet"].rates,
                m["loops"].rates,
                LOOPS_GOAL,
            ),
            Ratio("fleet / (1 native loop)", fleet / m["one_loop"].median, None),
        ]

    @property
    def goals_met(self) -> bool:
        """Whether the moonshot and the share of W plain loops were reached."""
        return all(ratio.met for ratio in self.ratios)

    def format(self) -> str:
        """The report as a text table."""
        header = self.config.describe(f"{self.config.env_id} ({self.vectorization})")
        measurements = [self.measurements[key] for key in _TABLE_ORDER]
        return format_table(header, measurements, self.ratios, width=52)


def run_native_benchmark(
    config: BenchConfig, vectorization: str, progress: Callable[[str], None] | None = None
) -> NativeBenchReport:
    """Measures the four samplers on a native backend, interleaved.

    Args:
        config: What to measure (``envs_per_worker`` is each native env's size).
        vectorization: ``"vector_entry_point"`` or ``"envpool"``.
        progress: Called with a short line as each phase starts.

    Returns:
        The report.
    """
    say = progress or (lambda _: None)
    env = EnvConfig(config.env_id, vectorization=vectorization)
    policy = MLPCategoricalPolicy(
        env.env_spec(), hidden_sizes=config.hidden_sizes, seed=config.seed
    )
    w, k = config.workers, config.envs_per_worker
    names = {
        "one_loop": f"one native loop: {k} envs in 1 process",
        "loops": f"native loops: {w} processes x {k} envs at once",
        "vec_worker": f"VecWorker: {k} native envs in this process",
        "fleet": f"fleet: {w} workers x {k} native envs{config.fleet_suffix}",
    }
    one = dataclasses.replace(config, workers=1, coordinators=1)
    measured = measure_interleaved(
        config,
        names,
        # The W loops and the fleet, the goal's two sides, are timed back to back.
        {
            "one_loop": plain_processes(one, vectorization),
            "vec_worker": vec_worker_sampler(config, env, policy),
            "loops": plain_processes(config, vectorization),
            "fleet": fleet_sampler(config, env, policy.get_param_values()),
        },
        say,
    )
    return NativeBenchReport(config, vectorization, measured)


__all__ = ["MOONSHOT_STEPS_PER_SECOND", "NativeBenchReport", "run_native_benchmark"]
