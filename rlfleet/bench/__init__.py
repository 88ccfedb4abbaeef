"""``rlfleet bench``: end-to-end sampling throughput against the plain loop.

In one run, five samplers step the same env with the same kind of policy
(an MLP 32x32 with a categorical sample):

* **plain** — W processes each running the plain single-process loop
  (:mod:`rlfleet.bench.plain_loop`) at the same time: the hardware's real
  ceiling for W cores.
* **VecWorker** — one :class:`~rlfleet.worker.vec.VecWorker` of K envs in
  this process: one worker's load without the network.
* **SyncVectorEnv** / **AsyncVectorEnv** — gymnasium's vector envs with
  W x K envs, actions from ``mlp-categorical`` in this process, nothing
  stored: what a user would otherwise write.
* **fleet** — ``Fleet.local(W, K)`` ``obtain_samples``, the learner pushing
  the policy's parameters with every request.

All are started and warmed up, then each repeat times them one after the
other (never two at once, so they do not compete for cores), the two sides
of each goal's ratio back to back, and every other repeat in the reverse
order; the report gives the median per sampler, each process's CPU
microseconds per step, and the ratios with their goals, each the median of
its repeats' pairs (:mod:`rlfleet.bench.report`). ``--check``
makes a missed goal exit 1. ``rlfleet bench`` and ``benchmarks/fleet.py``
both run :func:`run_benchmark`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rlfleet.bench.native import NativeBenchReport, run_native_benchmark
from rlfleet.bench.report import (
    FLEET_VS_PLAIN_GOAL,
    WORKER_VS_PLAIN_GOAL,
    BenchConfig,
    BenchReport,
    Measurement,
    Ratio,
)
from rlfleet.bench.samplers import (
    async_vector_env_sampler,
    fleet_sampler,
    measure_interleaved,
    plain_processes,
    sync_vector_env_sampler,
    vec_worker_sampler,
)
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy


def run_benchmark(
    config: BenchConfig, progress: Callable[[str], None] | None = None
) -> BenchReport:
    """Measures the five samplers, interleaved.

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
    w, k = config.workers, config.envs_per_worker
    names = {
        "plain": f"plain loop: {w} processes x {k} envs at once",
        "vec_worker": f"VecWorker: {k} envs in this process",
        "sync": f"SyncVectorEnv: {w * k} envs in this process",
        "async": f"AsyncVectorEnv: {w * k} env processes",
        "fleet": f"fleet: {w} workers x {k} envs{config.fleet_suffix}",
    }
    measured = measure_interleaved(
        config,
        names,
        # The plain loops sit between the two samplers set against them.
        {
            "sync": sync_vector_env_sampler(config, env, policy),
            "async": async_vector_env_sampler(config, env, policy),
            "vec_worker": vec_worker_sampler(config, env, policy),
            "plain": plain_processes(config),
            "fleet": fleet_sampler(config, env, policy.get_param_values()),
        },
        say,
    )
    return BenchReport(
        config,
        plain=measured["plain"],
        vec_worker=measured["vec_worker"],
        sync_vector_env=measured["sync"],
        async_vector_env=measured["async"],
        fleet=measured["fleet"],
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
        coordinators=args.coordinators,
        pinned=args.pin,
    )
    say = lambda line: print(line, flush=True)  # noqa: E731
    report: BenchReport | NativeBenchReport = (
        run_native_benchmark(config, args.native, progress=say)
        if args.native
        else run_benchmark(config, progress=say)
    )
    print()
    print(report.format(), flush=True)
    return 1 if args.check and not report.goals_met else 0


__all__ = [
    "FLEET_VS_PLAIN_GOAL",
    "WORKER_VS_PLAIN_GOAL",
    "BenchConfig",
    "BenchReport",
    "Measurement",
    "Ratio",
    "run_benchmark",
    "run_from_args",
]
