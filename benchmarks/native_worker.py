"""A native worker's CPU per step against the plain native loop's, in short interleaved pairs.

Run: ``python -m benchmarks.native_worker [--pairs 15] [--steps 64000] [--envs 64]``.

``rlfleet bench --native`` times each sampler for a whole round in turn, so
on a machine other processes load, the plain loop and the ``VecWorker``
each see a different load, and their ratio swings with it (0.97 to 2.0 in
rounds of one afternoon). This times them in short pairs, one right after
the other in one process (the plain loop of :mod:`rlfleet.bench.plain_loop`
on CartPole's vector entry point, then the bench's ``VecWorker`` sampler,
both with an MLP 32x32 and a categorical sample), and prints the median of
the pairs' ratios of CPU microseconds per step with its quartiles: the
figure behind the goal "a worker's CPU per step within 15% of the plain
loop" (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics

from rlfleet.bench.plain_loop import plain_loop
from rlfleet.bench.report import BenchConfig
from rlfleet.bench.samplers import vec_worker_sampler
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy

ENV_ID = "CartPole-v1"
VECTORIZATION = "vector_entry_point"


def measure(pairs: int, steps: int, n_envs: int) -> tuple[list[float], list[float]]:
    """CPU us per step of the plain loop and of the VecWorker, pair by pair.

    Args:
        pairs: Pairs of timed runs.
        steps: Env steps per run (at least).
        n_envs: Envs of the native vector env.

    Returns:
        The plain loop's and the VecWorker's CPU us per step, one entry per pair.
    """
    config = BenchConfig(workers=1, envs_per_worker=n_envs, steps=steps)
    env = EnvConfig(ENV_ID, vectorization=VECTORIZATION)
    policy = MLPCategoricalPolicy(env.env_spec(), hidden_sizes=config.hidden_sizes, seed=0)
    plain: list[float] = []
    worker: list[float] = []
    with vec_worker_sampler(config, env, policy) as sample:
        sample(steps)  # warm-up: the ring grows to its size
        for pair in range(pairs):
            run = plain_loop(ENV_ID, n_envs, steps, seed=pair, vectorization=VECTORIZATION)
            plain.append(run.cpu * 1e6 / run.steps)
            worker.append(sample(steps).cpu_us["this process"])
    return plain, worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--steps", type=int, default=64_000)
    parser.add_argument("--envs", type=int, default=64)
    args = parser.parse_args()
    plain, worker = measure(args.pairs, args.steps, args.envs)
    ratios = [w / p for p, w in zip(plain, worker, strict=True)]
    low, _, high = statistics.quantiles(ratios, n=4)
    median = statistics.median
    print(
        f"{args.pairs} pairs of >= {args.steps:,} steps, {args.envs} envs: VecWorker / plain loop, "
        f"CPU per step: median {median(ratios):.3f} (quartiles {low:.3f}-{high:.3f}); "
        f"plain loop {median(plain):.2f} us, VecWorker {median(worker):.2f} us"
    )


if __name__ == "__main__":
    main()
