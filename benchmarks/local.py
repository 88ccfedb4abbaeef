"""Throughput of VecWorker against a bare gymnasium vector-env loop.

Run: ``python benchmarks/local.py [--steps N] [--envs K] [--repeats R]``.

Both sides step K CartPole-v1 envs with the same MLPCategoricalPolicy
(32x32) computing every action, and pass the policy one generator per row
(the worker must, for determinism; the bare loop does the same so that only
the worker's own overhead is measured). The bare loop is a
``gymnasium.vector.SyncVectorEnv`` with same-step autoreset that stores
nothing; the worker collects complete episodes (storage, step types, infos,
checks, per-episode seeding). A third loop is the bare one plus the
per-episode seeding determinism requires (``reset(seed=...)`` and a fresh
``default_rng`` per episode), to tell that cost from the worker's own.

A fourth loop is the plain loop
(:func:`rlfleet.bench.plain_loop.plain_loop`: ``gym.make`` envs, a plain
``@`` MLP, every step stored), the baseline of ``rlfleet bench``'s goal
(VecWorker >= 0.9 x plain loop per CPU-second).

Runs are interleaved; the median and the best of the repeats are reported,
in env steps (transitions) per second of CPU time (``time.process_time``):
on a shared machine wall-clock rates swing with the other processes' load,
CPU time much less. The wall-clock median is shown too.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from rlfleet.bench.plain_loop import plain_loop
from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs.config import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.worker import VecWorker, make_units

ENV_ID = "CartPole-v1"


@dataclass(frozen=True)
class Rate:
    """Env steps per second of one run."""

    cpu: float
    wall: float


class Stopwatch:
    """Measures CPU and wall time of a code block."""

    def __enter__(self) -> Stopwatch:
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = time.process_time() - self._cpu
        self.wall = time.perf_counter() - self._wall

    def rate(self, steps: int) -> Rate:
        return Rate(cpu=steps / self.cpu, wall=steps / self.wall)


def make_policy() -> MLPCategoricalPolicy:
    env = gym.make(ENV_ID)
    spec = EnvSpec.from_env(env)
    env.close()
    return MLPCategoricalPolicy(spec, hidden_sizes=(32, 32), seed=0)


def bare_loop(policy: MLPCategoricalPolicy, n_envs: int, steps: int) -> Rate:
    """Steps/s of SyncVectorEnv + the policy, storing nothing."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID) for _ in range(n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    rngs = [np.random.default_rng(i) for i in range(n_envs)]
    observations, _ = envs.reset(seed=0)
    vector_steps = steps // n_envs
    with Stopwatch() as watch:
        for _ in range(vector_steps):
            actions, _ = policy.get_actions(observations, rngs)
            observations, _, _, _, _ = envs.step(actions)
    envs.close()
    return watch.rate(vector_steps * n_envs)


def seeded_bare_loop(policy: MLPCategoricalPolicy, n_envs: int, steps: int) -> Rate:
    """The bare loop plus the per-episode seeding the worker owes determinism.

    Each new episode resets its env with ``seed=`` and gets its own
    ``default_rng``, as in the worker; still no storage and no checks. The
    gap between this loop and the worker is the worker's bookkeeping.
    """
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make(ENV_ID) for _ in range(n_envs)],
        autoreset_mode=gym.vector.AutoresetMode.DISABLED,
    )
    units = make_units(0, 0, range(steps // 8 + n_envs))  # outside the clock, as for the worker
    observations, _ = envs.reset(seed=[u.env_seed for u in units[:n_envs]])
    rngs = [np.random.default_rng(u.policy_seed) for u in units[:n_envs]]
    next_unit = n_envs
    vector_steps = steps // n_envs
    with Stopwatch() as watch:
        for _ in range(vector_steps):
            actions, _ = policy.get_actions(observations, rngs)
            observations, _, terminated, truncated, _ = envs.step(actions)
            done = terminated | truncated
            if done.any():
                seeds: list[int | None] = [None] * n_envs
                for index in np.flatnonzero(done).tolist():
                    unit = units[next_unit]
                    next_unit += 1
                    seeds[index] = unit.env_seed
                    rngs[index] = np.random.default_rng(unit.policy_seed)
                observations, _ = envs.reset(seed=seeds, options={"reset_mask": done})
    envs.close()
    return watch.rate(vector_steps * n_envs)


def worker_loop(policy: MLPCategoricalPolicy, n_envs: int, steps: int) -> Rate:
    """Steps/s of VecWorker collecting complete episodes."""
    worker = VecWorker(n_envs=n_envs, env=EnvConfig(ENV_ID), policy=policy)
    # More units than can finish: the worker never runs dry during the run.
    worker.submit(make_units(0, 0, range(steps // 8 + n_envs)))
    taken = 0
    with Stopwatch() as watch:
        while taken < steps:
            taken += worker.step()
    batch = worker.take_finished()
    if batch is None or batch.total_steps == 0:
        raise RuntimeError("the worker finished no episode; the benchmark is broken")
    worker.shutdown()
    return watch.rate(taken)


def issue_plain_loop(policy: MLPCategoricalPolicy, n_envs: int, steps: int) -> Rate:
    """Steps/s of the plain loop (its own MLP of the same sizes; ``policy`` unused)."""
    del policy
    run = plain_loop(ENV_ID, n_envs, steps)
    return Rate(cpu=run.steps / run.cpu, wall=run.steps / run.wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200_000, help="env steps per run")
    parser.add_argument("--envs", type=int, default=8, help="envs per loop")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs per loop")
    args = parser.parse_args()
    policy = make_policy()
    loops: dict[str, Callable[[MLPCategoricalPolicy, int, int], Rate]] = {
        "SyncVectorEnv + policy (bare)": bare_loop,
        "  + per-episode seeding": seeded_bare_loop,
        "VecWorker (complete episodes)": worker_loop,
        "plain loop (the issue's baseline)": issue_plain_loop,
    }
    runs: dict[str, list[Rate]] = {label: [] for label in loops}
    for _ in range(args.repeats):
        for label, loop in loops.items():  # interleaved: load drifts hit both alike
            runs[label].append(loop(policy, args.envs, args.steps))
    print(f"{ENV_ID}, {args.envs} envs, MLPCategoricalPolicy 32x32, {args.steps:,} steps per run")
    print(f"{'steps per CPU-second':<34}{'median':>10}{'best':>10}{'wall median':>13}   runs")
    medians, bests = [], []
    for label, rates in runs.items():
        cpu = [rate.cpu for rate in rates]
        medians.append(statistics.median(cpu))
        bests.append(max(cpu))
        wall = statistics.median(rate.wall for rate in rates)
        each = " ".join(f"{rate:,.0f}" for rate in cpu)
        print(f"{label:<34}{medians[-1]:>10,.0f}{bests[-1]:>10,.0f}{wall:>13,.0f}   {each}")
    for label, index in (
        ("worker / bare", 0),
        ("worker / bare + seeding", 1),
        ("worker / plain loop", 3),
    ):
        ratio_median, ratio_best = medians[2] / medians[index], bests[2] / bests[index]
        print(f"{'ratio ' + label:<34}{ratio_median:>10.3f}{ratio_best:>10.3f}")


if __name__ == "__main__":
    main()
