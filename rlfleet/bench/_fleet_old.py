"""The fleet benchmark: end-to-end sampling throughput against two baselines.

Three samplers step the same env with the same ``mlp-categorical`` policy
(32x32, its parameters pushed to the fleet as an agent update with every
request, as a learner does):

* **fleet** — ``Fleet.local``: an embedded coordinator and W worker
  processes of K envs; throughput of ``obtain_samples`` as the learner sees
  it (agent update, scheduling, workers, streaming, batch assembly).
* **single process** — one :class:`~rlfleet.worker.vec.VecWorker` of K
  envs stepped in this process: exactly one worker's load with no network.
  W such processes on W free cores is the ceiling the fleet is measured
  against (goal: fleet >= 0.8 x W x single).
* **AsyncVectorEnv** — gymnasium's subprocess vector env with W x K envs,
  the policy computing actions in the parent, nothing stored: the usual
  way to parallelise envs in one learner process (goal: fleet >= 4x).

All three are started and warmed up, then each repeat times them one after
the other over at least ``steps`` env steps (never two at once, so they do
not compete for cores); the report gives the median per sampler. ``rlfleet bench`` and
``benchmarks/fleet.py`` both run :func:`run_benchmark`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.policies.mlp import MLPCategoricalPolicy
from rlfleet.policies.spec import PolicySpec

#: Goal of fleet / (workers x single process), with one core per worker.
FLEET_VS_SINGLE_GOAL = 0.8
#: Goal of fleet / AsyncVectorEnv with the same total number of envs.
FLEET_VS_ASYNC_GOAL = 4.0


@dataclass(frozen=True)
class BenchConfig:
    """What to measure.

    Args:
        workers: Fleet worker processes W.
        envs_per_worker: Envs per worker K (and in the single process).
        steps: Env steps per timed run of each sampler (at least).
        request_steps: ``num_samples`` of each fleet request; large requests
            amortise the per-request round trip as a real learner's do.
        repeats: Timed runs per sampler; the median is reported.
        seed: Seeds the policy weights and the episodes.
        env_id: The gymnasium env (Discrete actions).
        hidden_sizes: Hidden widths of the policy.
        prefetch_factor: The coordinator's ``prefetch_factor`` (units a
            worker holds per env slot beyond the one running); None keeps
            the coordinator's default.

    Raises:
        ConfigError: If a count is < 1.
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

    def __post_init__(self) -> None:
        for name in ("workers", "envs_per_worker", "steps", "request_steps", "repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"bench {name.replace('_', '-')} must be an int >= 1, got {value!r}"
                )
        if self.seed < 0:
            raise ConfigError(f"bench seed must be >= 0, got {self.seed}")
        if self.prefetch_factor is not None and self.prefetch_factor < 0:
            raise ConfigError(f"bench prefetch-factor must be >= 0, got {self.prefetch_factor}")

    @property
    def total_envs(self) -> int:
        """W x K: the fleet's envs, and the AsyncVectorEnv's."""
        return self.workers * self.envs_per_worker

    @property
    def policy_spec(self) -> PolicySpec:
        """The policy every sampler runs."""
        return PolicySpec("mlp-categorical", {"hidden_sizes": list(self.hidden_sizes)})


@dataclass(frozen=True)
class Measurement:
    """Timed runs of one sampler.

    Attributes:
        name: What was measured, for the table.
        rates: Env steps per second of each timed run.
    """

    name: str
    rates: tuple[float, ...]

    @property
    def median(self) -> float:
        """Median steps/s over the runs."""
        return statistics.median(self.rates)


@dataclass(frozen=True)
class BenchReport:
    """The three measurements and their ratios."""

    config: BenchConfig
    fleet: Measurement
    single: Measurement
    async_vector_env: Measurement

    @property
    def fleet_vs_single(self) -> float:
        """fleet / (workers x single process)."""
        return self.fleet.median / (self.config.workers * self.single.median)

    @property
    def fleet_vs_async(self) -> float:
        """fleet / AsyncVectorEnv."""
        return self.fleet.median / self.async_vector_env.median

    @property
    def goals_met(self) -> bool:
        """Whether both ratios reach their goals."""
        return (
            self.fleet_vs_single >= FLEET_VS_SINGLE_GOAL
            and self.fleet_vs_async >= FLEET_VS_ASYNC_GOAL
        )

    def format(self) -> str:
        """The report as a text table."""
        c = self.config
        lines = [
            f"{c.env_id}, mlp-categorical {'x'.join(map(str, c.hidden_sizes))}, "
            f"{c.workers} workers x {c.envs_per_worker} envs, >= {c.steps:,} steps per run, "
            f"fleet requests of {min(c.request_steps, c.steps):,} steps, median of "
            f"{c.repeats} run(s) after warm-up"
            + ("" if c.prefetch_factor is None else f", prefetch_factor {c.prefetch_factor}"),
            "",
            f"{'sampler':<44}{'steps/s':>10}   runs",
        ]
        for m in (self.fleet, self.single, self.async_vector_env):
            runs = " / ".join(f"{rate:,.0f}" for rate in m.rates)
            lines.append(f"{m.name:<44}{m.median:>10,.0f}   {runs}")
        lines.append("")
        for label, ratio, goal in (
            (f"fleet / ({c.workers} x single process)", self.fleet_vs_single, FLEET_VS_SINGLE_GOAL),
            ("fleet / AsyncVectorEnv", self.fleet_vs_async, FLEET_VS_ASYNC_GOAL),
        ):
            verdict = "ok" if ratio >= goal else "MISSED"
            lines.append(f"{label:<44}{ratio:>10.2f}   goal >= {goal:g}: {verdict}")
        return "\n".join(lines)


#: A running sampler: ``sample(min_steps)`` steps at least that many env
#: steps and returns how many it took.
SampleFn = Callable[[int], int]


def run_benchmark(
    config: BenchConfig, progress: Callable[[str], None] | None = None
) -> BenchReport:
    """Measures the three samplers.

    All three are started first and warmed up; then each repeat times the
    three one after the other. Interleaving keeps the ratios fair on a
    machine whose load drifts, and a sampler that is not being timed sits
    idle (blocked on its pipes or its gRPC stream), so it does not compete
    for cores.

    Args:
        config: What to measure.
        progress: Called with a short line as each phase starts.

    Returns:
        The report.
    """
    say = progress or (lambda _: None)
    env = EnvConfig(config.env_id)
    policy = MLPCategoricalPolicy(
        env.env_spec(), hidden_sizes=config.hidden_sizes, seed=config.seed
    )
    names = {
        "fleet": f"fleet: {config.workers} workers x {config.envs_per_worker} envs",
        "single": f"single process: VecWorker, {config.envs_per_worker} envs",
        "async": f"gymnasium AsyncVectorEnv, {config.total_envs} envs",
    }
    with contextlib.ExitStack() as stack:
        say("starting: " + "; ".join(names.values()))
        samplers: dict[str, SampleFn] = {
            "fleet": stack.enter_context(fleet_sampler(config, env, policy.get_param_values())),
            "single": stack.enter_context(single_process_sampler(config, env, policy)),
            "async": stack.enter_context(async_vector_env_sampler(config, env, policy)),
        }
        say("warming up")
        for sample in samplers.values():
            sample(min(config.request_steps, config.steps))
        rates: dict[str, list[float]] = {key: [] for key in samplers}
        for repeat in range(config.repeats):
            say(f"run {repeat + 1} of {config.repeats}")
            for key, sample in samplers.items():
                start = time.perf_counter()
                steps = sample(config.steps)
                rates[key].append(steps / (time.perf_counter() - start))
    measured = {key: Measurement(names[key], tuple(rates[key])) for key in samplers}
    return BenchReport(config, measured["fleet"], measured["single"], measured["async"])


@contextlib.contextmanager
def fleet_sampler(
    config: BenchConfig, env: EnvConfig, params: dict[str, np.ndarray]
) -> Iterator[SampleFn]:
    """``obtain_samples`` through an embedded local fleet, pushing ``params`` each time."""
    from rlfleet.client import Fleet  # gRPC is only needed here

    request_steps = min(config.request_steps, config.steps)
    options = {} if config.prefetch_factor is None else {"prefetch_factor": config.prefetch_factor}
    with Fleet.local(
        workers=config.workers,
        envs_per_worker=config.envs_per_worker,
        env=env,
        policy=config.policy_spec,
        seed=config.seed,
        coordinator_options=options,
    ) as sampler:
        itr = 0

        def sample(min_steps: int) -> int:
            nonlocal itr
            steps = 0
            while steps < min_steps:
                batch = sampler.obtain_samples(itr, request_steps, agent_update=params)
                itr += 1
                steps += batch.total_steps
            return steps

        yield sample


@contextlib.contextmanager
def single_process_sampler(
    config: BenchConfig, env: EnvConfig, policy: MLPCategoricalPolicy
) -> Iterator[SampleFn]:
    """One VecWorker of K envs stepped in this process: one worker's load, no network."""
    from rlfleet.worker.units import EpisodeUnit
    from rlfleet.worker.vec import VecWorker

    n_envs = config.envs_per_worker
    worker = VecWorker(n_envs=n_envs, seed=config.seed, env=env, policy=policy)
    next_episode = 0

    def sample(min_steps: int) -> int:
        nonlocal next_episode
        steps = 0
        while steps < min_steps:
            # Keep one spare unit per slot queued, and take finished episodes
            # in groups, as the remote worker does.
            if worker.queued_count < n_envs:
                first, next_episode = next_episode, next_episode + n_envs
                worker.submit(
                    EpisodeUnit.seeded(config.seed, 0, i) for i in range(first, next_episode)
                )
            worker.step()
            if worker.finished_count >= n_envs:
                batch = worker.take_finished()
                steps += 0 if batch is None else batch.total_steps
        return steps

    try:
        yield sample
    finally:
        worker.shutdown()


@contextlib.contextmanager
def async_vector_env_sampler(
    config: BenchConfig, env: EnvConfig, policy: MLPCategoricalPolicy
) -> Iterator[SampleFn]:
    """gymnasium's AsyncVectorEnv with W x K envs, actions from ``policy``, nothing stored."""
    n_envs = config.total_envs
    # spawn: forking a process that holds gRPC state is unsafe, and
    # EnvConfig is a picklable env factory.
    vector_env = gym.vector.AsyncVectorEnv(
        [env] * n_envs,
        context="spawn",
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    try:
        observations, _ = vector_env.reset(seed=config.seed)

        def sample(min_steps: int) -> int:
            nonlocal observations
            steps = 0
            while steps < min_steps:
                actions, _ = policy.get_actions(observations)
                # SAME_STEP autoreset: every step() is n_envs real transitions.
                observations, *_ = vector_env.step(actions)
                steps += n_envs
            return steps

        yield sample
    finally:
        vector_env.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options (shared by ``rlfleet bench`` and benchmarks/fleet.py)."""
    defaults = BenchConfig()
    parser.add_argument(
        "--workers", type=int, default=defaults.workers, help="fleet worker processes (2)"
    )
    parser.add_argument(
        "--envs-per-worker", type=int, default=defaults.envs_per_worker, help="envs per worker (8)"
    )
    parser.add_argument(
        "--steps", type=int, default=defaults.steps, help="env steps per timed run (200000)"
    )
    parser.add_argument(
        "--request-steps",
        type=int,
        default=defaults.request_steps,
        help="num_samples of each fleet request (50000)",
    )
    parser.add_argument(
        "--repeats", type=int, default=defaults.repeats, help="timed runs per sampler (3)"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed (0)")
    parser.add_argument(
        "--prefetch-factor",
        type=int,
        default=None,
        help="the coordinator's prefetch_factor (default: the coordinator's own)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a ratio misses its goal (for CI on a quiet machine)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Runs the benchmark the parsed options describe and prints the report.

    Returns:
        0, or 1 with ``--check`` when a goal was missed.

    Raises:
        ConfigError: If an option is out of range.
    """
    config = BenchConfig(
        workers=args.workers,
        envs_per_worker=args.envs_per_worker,
        steps=args.steps,
        request_steps=args.request_steps,
        repeats=args.repeats,
        seed=args.seed,
        prefetch_factor=args.prefetch_factor,
    )
    report = run_benchmark(config, progress=lambda line: print(line, flush=True))
    print()
    print(report.format(), flush=True)
    return 1 if args.check and not report.goals_met else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python benchmarks/fleet.py``."""
    parser = argparse.ArgumentParser(
        prog="benchmarks/fleet.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
