"""Throughput of a PyTorch policy on the fleet against one process stepping SyncVectorEnv.

Run: ``python benchmarks/torch_policy.py [--steps N] [--workers W] [--envs K]``.

Both sides act with the same ``TorchPolicy`` (examples/ppo_torch.py's
64x64 actor-critic ``Agent``, one torch thread) on CartPole-v1:

* **baseline**: one process steps a ``gymnasium.vector.SyncVectorEnv`` of
  W*K envs, one ``get_actions`` call per step with a generator per row;
* **fleet**: ``Fleet.local(workers=W, envs_per_worker=K)`` with the policy
  built on the workers from its spec; the learner times
  ``obtain_samples(itr, N)`` (complete episodes, assembled and decoded).

Both use the policy's default batch-invariant mode (one forward pass per
row, for determinism) and, for reference, the baseline is also run with
one batched forward pass per step (``batch_invariant=False``). Rates are
env steps per second of wall time, the best of the repeats; on a shared
machine they swing with other processes' load.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

from rlfleet import EnvConfig, PolicySpec, make_policy
from rlfleet.client import Fleet

ENV = EnvConfig("CartPole-v1")


def spec(batch_invariant: bool = True) -> PolicySpec:
    """The example Agent as a worker policy."""
    return PolicySpec(
        "torch",
        {
            "module": "examples.ppo_torch:Agent",
            "module_kwargs": {"obs_dim": 4, "n_actions": 2},
            "distribution": "categorical",
            "threads": 1,
            "batch_invariant": batch_invariant,
        },
    )


def baseline(n_envs: int, steps: int, batch_invariant: bool) -> float:
    """Steps per second of the policy stepping SyncVectorEnv in this process."""
    policy = make_policy(spec(batch_invariant), ENV.env_spec(), seed=0)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(ENV.id) for _ in range(n_envs)])
    rngs = [np.random.default_rng(i) for i in range(n_envs)]
    observations, _ = envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps // n_envs):
        actions, _ = policy.get_actions(observations, rngs)
        observations, *_ = envs.step(actions)
    elapsed = time.perf_counter() - start
    envs.close()
    return (steps // n_envs) * n_envs / elapsed


def fleet(workers: int, envs: int, steps: int, repeats: int) -> float:
    """Best steps per second of obtain_samples on a local fleet."""
    best = 0.0
    with Fleet.local(
        workers=workers,
        envs_per_worker=envs,
        env=ENV,
        policy=spec(),
        seed=0,
        imports=("examples.ppo_torch",),
    ) as sampler:
        sampler.obtain_samples(0, min(steps, 2000))  # warm-up: workers import torch
        for itr in range(repeats):
            start = time.perf_counter()
            batch = sampler.obtain_samples(itr + 1, steps)
            best = max(best, batch.total_steps / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50_000, help="env steps per run")
    parser.add_argument("--workers", type=int, default=2, help="fleet workers (W)")
    parser.add_argument("--envs", type=int, default=4, help="envs per worker (K)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side")
    args = parser.parse_args()
    total_envs = args.workers * args.envs
    rows = [
        (
            f"baseline: SyncVectorEnv x{total_envs}, 1 process",
            max(baseline(total_envs, args.steps, True) for _ in range(args.repeats)),
        ),
        (
            "baseline, batched forward (not batch-invariant)",
            max(baseline(total_envs, args.steps, False) for _ in range(args.repeats)),
        ),
        (
            f"fleet: Fleet.local {args.workers} workers x {args.envs} envs",
            fleet(args.workers, args.envs, args.steps, args.repeats),
        ),
    ]
    for name, rate in rows:
        print(f"{name:<52} {rate:>10,.0f} steps/s")


if __name__ == "__main__":
    main()
