"""What ``rlfleet bench`` measures, and the report it prints."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from rlfleet._util.cpus import can_pin, cpu_list_text, one_cpu_each
from rlfleet._util.values import check_int
from rlfleet.errors import ConfigError
from rlfleet.policies.spec import PolicySpec

#: Goal of fleet / (W plain-loop processes run at the same time).
FLEET_VS_PLAIN_GOAL = 0.9
#: Goal of VecWorker / plain loop, in steps per CPU-second of one process.
WORKER_VS_PLAIN_GOAL = 0.9


@dataclass(frozen=True)
class BenchConfig:
    """What to measure.

    Args:
        workers: Fleet worker processes W (and plain-loop processes).
        envs_per_worker: Envs per worker K (and per plain loop, and in the
            in-process VecWorker).
        steps: Env steps per timed run of each sampler (at least).
        request_steps: ``num_samples`` of each fleet request; large requests
            amortise the per-request round trip as a real learner's do.
        repeats: Timed runs per sampler. Each goal's ratio is the median over
            the repeats of the two sides' runs of that repeat, which are timed
            back to back.
        seed: Seeds the policy weights and the episodes.
        env_id: The gymnasium env (Discrete actions, flat Box observations).
        hidden_sizes: Hidden widths of the policy.
        prefetch_factor: The coordinator's ``prefetch_factor``; None keeps
            the coordinator's default.
        coordinators: The fleet's coordinators (``Fleet.local(coordinators=N)``):
            1 runs it in the learner's process, N > 1 as N processes with
            the workers dealt among them.
        pinned: Fleet worker ``i`` and plain loop ``i`` pinned to the
            same CPU (``Fleet.local(cpu_affinity="auto")``'s placement,
            dealt alike to both sides so the ratio stays fair); False (as
            ``Fleet.local`` by default): nothing pinned, the OS places
            every process.

    Raises:
        ConfigError: If a count is < 1, or there are fewer workers than
            coordinators.
    """

    workers: int = 2
    envs_per_worker: int = 8
    steps: int = 200_000
    request_steps: int = 50_000
    repeats: int = 3
    seed: int = 0
    env_id: str = "CartPole-v1"
    hidden_sizes: tuple[int, ...] = (32, 32)
    prefetch_factor: int | None = None
    coordinators: int = 1
    pinned: bool = False

    def __post_init__(self) -> None:
        names = ("workers", "envs_per_worker", "steps", "request_steps", "repeats", "coordinators")
        for name in names:
            value = getattr(self, name)
            check_int(f"bench {name.replace('_', '-')}", value)
        if self.seed < 0:
            raise ConfigError(f"bench seed must be >= 0, got {self.seed}")
        if self.prefetch_factor is not None and self.prefetch_factor < 0:
            raise ConfigError(f"bench prefetch-factor must be >= 0, got {self.prefetch_factor}")
        if self.coordinators > self.workers:
            raise ConfigError(
                f"bench coordinators ({self.coordinators}) must not exceed workers "
                f"({self.workers}): each coordinator needs a worker of its own"
            )

    @property
    def total_envs(self) -> int:
        """W x K: the fleet's envs, and the vector envs'."""
        return self.workers * self.envs_per_worker

    def describe(self, env_label: str) -> str:
        """The header line of a report: what was measured, and how.

        Args:
            env_label: The env as the report names it (with its backend, if native).
        """
        return (
            f"{env_label}, mlp-categorical {'x'.join(map(str, self.hidden_sizes))}, "
            f"{self.workers} workers x {self.envs_per_worker} envs, >= {self.steps:,} steps "
            f"per run, fleet requests of {min(self.request_steps, self.steps):,} steps, "
            f"{self.repeats} run(s) after warm-up, each ratio the median of its "
            "pairs timed back to back"
            + ("" if self.prefetch_factor is None else f", prefetch_factor {self.prefetch_factor}")
            + ("" if self.coordinators == 1 else f", {self.coordinators} coordinator processes")
            + "\n"
            + self.placement
        )

    @property
    def worker_cpus(self) -> list[frozenset[int]] | None:
        """The CPUs of fleet worker ``i`` and of plain loop ``i``, or None: nothing pinned."""
        if not self.pinned or not can_pin():
            return None
        return one_cpu_each(self.workers)

    @property
    def placement(self) -> str:
        """How the report's processes were placed on CPUs, for its header."""
        placed = self.worker_cpus
        if placed is None:
            return "placement: nothing pinned (the OS places every process)"
        cpus = ", ".join(cpu_list_text(cpus) for cpus in placed)
        return (
            f"placement: fleet worker i and plain loop i pinned to the same CPU ({cpus}); "
            "this process, coordinators and vector envs' processes not pinned"
        )

    @property
    def fleet_suffix(self) -> str:
        """What the fleet's line in a report adds for several coordinators ("" for one)."""
        return "" if self.coordinators == 1 else f", {self.coordinators} coordinators"

    @property
    def policy_spec(self) -> PolicySpec:
        """The policy the fleet runs."""
        return PolicySpec("mlp-categorical", {"hidden_sizes": list(self.hidden_sizes)})


@dataclass(frozen=True)
class Measurement:
    """Timed runs of one sampler.

    Attributes:
        name: What was measured, for the table.
        rates: Env steps per wall-clock second of each timed run, in the
            order of the repeats.
        cpu_us_runs: CPU microseconds per env step of each process taking
            part, by process role (e.g. ``{"worker 0": 12.1}``), of each
            timed run, in the order of the repeats; empty if not measured.
    """

    name: str
    rates: tuple[float, ...]
    cpu_us_runs: tuple[dict[str, float], ...] = ()

    @property
    def median(self) -> float:
        """Median steps/s over the runs."""
        return statistics.median(self.rates)

    @property
    def cpu_us(self) -> dict[str, float]:
        """CPU microseconds per env step by process role, the median over the
        runs (the upper one of an even number)."""
        runs = self.cpu_us_runs
        if not runs:
            return {}
        return {role: sorted(run[role] for run in runs)[len(runs) // 2] for role in runs[0]}


@dataclass(frozen=True)
class Ratio:
    """One ratio of the report, with its goal (None: shown for information).

    Attributes:
        label: What is set against what, for the table.
        value: The ratio (for a paired one, the median of ``runs``).
        goal: The least value that meets the goal, or None.
        runs: A paired ratio's value in each repeat; empty for others.
    """

    label: str
    value: float
    goal: float | None
    runs: tuple[float, ...] = ()

    @classmethod
    def paired(
        cls,
        label: str,
        numerator: Sequence[float],
        denominator: Sequence[float],
        goal: float | None,
    ) -> Ratio:
        """The median over the repeats of one repeat's numerator over its denominator.

        The two sides of a repeat are timed back to back
        (:func:`rlfleet.bench.samplers.measure_interleaved`), so a drift of the
        machine's speed between repeats (on a shared VM a process's CPU per
        step can move by half within minutes) moves both sides of a pair, not
        one side of the ratio.

        Args:
            label: What is set against what.
            numerator: One figure per repeat, in the order of the repeats.
            denominator: As ``numerator``, of the other side.
            goal: The least value that meets the goal, or None.
        """
        runs = tuple(a / b for a, b in zip(numerator, denominator, strict=True))
        return cls(label, statistics.median(runs), goal, runs)

    @property
    def met(self) -> bool:
        """Whether the ratio reaches its goal (always True without a goal)."""
        return self.goal is None or self.value >= self.goal


@dataclass(frozen=True)
class BenchReport:
    """The measurements of one run and their ratios.

    Attributes:
        config: What was measured.
        plain: W plain-loop processes at the same time (the hardware's ceiling).
        vec_worker: One VecWorker of K envs in this process.
        sync_vector_env: gymnasium SyncVectorEnv(W x K) in this process.
        async_vector_env: gymnasium AsyncVectorEnv(W x K).
        fleet: ``Fleet.local(W, K)`` ``obtain_samples``.
    """

    config: BenchConfig
    plain: Measurement
    vec_worker: Measurement
    sync_vector_env: Measurement
    async_vector_env: Measurement
    fleet: Measurement

    @property
    def ratios(self) -> list[Ratio]:
        """The ratios with goals (docs/performance.md), then informative ones."""
        c = self.config
        plain_cpu = [run["each plain process"] for run in self.plain.cpu_us_runs]
        worker_cpu = [run["this process"] for run in self.vec_worker.cpu_us_runs]
        return [
            Ratio.paired(
                f"fleet / ({c.workers} plain processes at once)",
                self.fleet.rates,
                self.plain.rates,
                FLEET_VS_PLAIN_GOAL,
            ),
            Ratio.paired(
                "VecWorker / plain loop (steps per CPU-second)",
                plain_cpu,
                worker_cpu,
                WORKER_VS_PLAIN_GOAL,
            ),
            Ratio("fleet / SyncVectorEnv", self.fleet.median / self.sync_vector_env.median, None),
            Ratio("fleet / AsyncVectorEnv", self.fleet.median / self.async_vector_env.median, None),
        ]

    @property
    def goals_met(self) -> bool:
        """Whether every ratio with a goal reaches it."""
        return all(ratio.met for ratio in self.ratios)

    def format(self) -> str:
        """The report as a text table."""
        header = self.config.describe(self.config.env_id)
        measurements = (
            self.plain,
            self.vec_worker,
            self.sync_vector_env,
            self.async_vector_env,
            self.fleet,
        )
        return format_table(header, measurements, self.ratios, width=48)


def format_table(
    header: str, measurements: Sequence[Measurement], ratios: Sequence[Ratio], *, width: int
) -> str:
    """A bench report as text: steps/s per sampler, CPU us per step per process, ratios.

    Args:
        header: The first line (what was measured).
        measurements: The samplers, in table order.
        ratios: The ratios, with their verdicts.
        width: Width of the label column.
    """
    lines = [header, "", f"{'sampler':<{width}}{'steps/s':>10}   runs"]
    for m in measurements:
        runs = " / ".join(f"{rate:,.0f}" for rate in m.rates)
        lines.append(f"{m.name:<{width}}{m.median:>10,.0f}   {runs}")
    lines += ["", f"{'CPU us per env step':<{width}}{'us':>10}"]
    for m in measurements:
        for role, us in m.cpu_us.items():
            lines.append(f"{m.name.split(':')[0] + ': ' + role:<{width}}{us:>10.2f}")
    lines.append("")
    for ratio in ratios:
        verdict = (
            "(no goal)"
            if ratio.goal is None
            else f"goal >= {ratio.goal:g}: {'ok' if ratio.met else 'MISSED'}"
        )
        pairs = " / ".join(f"{run:.2f}" for run in ratio.runs)
        each = f"   pairs: {pairs}" if len(ratio.runs) > 1 else ""
        lines.append(f"{ratio.label:<{width}}{ratio.value:>10.2f}   {verdict}{each}")
    return "\n".join(lines)
