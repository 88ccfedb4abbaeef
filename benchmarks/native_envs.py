"""How fast native vector envs step, alone and with rlfleet's batched policy.

Run: ``python benchmarks/native_envs.py [--envs 64] [--steps 200000]``.

The fleet's moonshot (docs/performance.md) is >= 1M env steps/s to the
learner on 2 cores, which needs envs that are not the cost: a native vector
env steps all its envs in one call. This measures, in one process and in
steps per CPU-second (robust on a loaded machine):

* CartPole's gymnasium vector entry point
  (``gym.make_vec(..., vectorization_mode="vector_entry_point")``) and
  envpool's CartPole-v1 (if envpool is installed), with random actions;
* the same envs with actions from ``mlp-categorical`` 32x32 over all rows
  in one batched call, with one generator per row as a worker passes
  (the policy's cost per step at this batch size);
* the plain per-env loop of the benchmark (``gym.make`` envs), for scale.

Nothing is stored: these are ceilings for the env plus policy part of a
worker's step, not sampler figures. The fleet itself on native workers,
against the same env in plain loops and the moonshot, is measured by
``rlfleet bench --native vector_entry_point --envs-per-worker 64``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rlfleet.bench.plain_loop import plain_loop
from rlfleet.envs.config import EnvConfig
from rlfleet.policies.mlp import MLPCategoricalPolicy


def _rate(
    vector_env: Any, n_envs: int, steps: int, act: Callable[[Any], np.ndarray], seeded: bool
) -> float:
    # envpool takes its seed at creation and warns about reset(seed=...).
    observations, _ = vector_env.reset(seed=0) if seeded else vector_env.reset()
    vector_steps = -(-steps // n_envs)
    cpu = time.process_time()
    for _ in range(vector_steps):
        observations, *_ = vector_env.step(act(observations))
    return vector_steps * n_envs / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()
    n, steps = args.envs, args.steps
    policy = MLPCategoricalPolicy(EnvConfig("CartPole-v1").env_spec(), seed=0)
    rngs = [np.random.default_rng(i) for i in range(n)]
    action_rng = np.random.default_rng(0)

    def random_actions(observations: Any) -> np.ndarray:
        return action_rng.integers(0, 2, n)

    def policy_actions(observations: Any) -> np.ndarray:
        return policy.get_actions(observations, rngs)[0]

    envs: dict[str, tuple[Callable[[], Any], bool]] = {
        "gymnasium vector entry point": (
            lambda: gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point"),
            True,
        ),
    }
    try:
        import envpool

        envs["envpool"] = (
            lambda: envpool.make_gymnasium("CartPole-v1", num_envs=n, seed=0),
            False,
        )
    except ImportError:
        print("envpool is not installed: skipped (pip install envpool)")
    print(f"CartPole-v1, {n} envs, steps per CPU-second of one process")
    for name, (make, seeded) in envs.items():
        for label, act in (("random actions", random_actions), ("mlp-categorical", policy_actions)):
            vector_env = make()
            rate = _rate(vector_env, n, steps, act, seeded)
            vector_env.close()
            print(f"  {name + ', ' + label:<52}{rate:>12,.0f}")
    run = plain_loop("CartPole-v1", 8, steps // 4)
    print(f"  {'plain loop (gym.make envs x 8, stores steps)':<52}{run.steps / run.cpu:>12,.0f}")


if __name__ == "__main__":
    main()
