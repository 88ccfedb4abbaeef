"""Train a policy on CartPole-v1 with a local fleet: the loop ``rlfleet demo`` runs.

    python examples/train_cartpole.py     # with rlfleet installed (pip install -e .)

``Fleet.local`` starts an embedded coordinator and two worker processes on
loopback. Each iteration sends the learner's current parameters with the
sampling request, so every episode of the batch comes from exactly those
parameters (the batch records the agent version that produced it), then
takes one VPG step on the batch. CartPole-v1 counts as solved at an average
return of 475; this takes about 20 iterations of 4000 steps.
"""

from __future__ import annotations

import sys
import time

from rlfleet.client import Fleet
from rlfleet.envs.config import EnvConfig
from rlfleet.learners import VPG

STEPS_PER_ITERATION = 4000
TARGET_RETURN = 475.0
MAX_ITERATIONS = 150


def main() -> int:
    env = EnvConfig("CartPole-v1")
    vpg = VPG(env.env_spec(), hidden_sizes=(32, 32), seed=0)
    with Fleet.local(
        workers=2, envs_per_worker=4, env=env, policy=vpg.policy_spec, seed=0
    ) as sampler:
        for itr in range(MAX_ITERATIONS):
            start = time.perf_counter()
            batch = sampler.obtain_samples(itr, STEPS_PER_ITERATION, agent_update=vpg.get_params())
            steps_per_second = batch.total_steps / (time.perf_counter() - start)
            stats = vpg.train_step(batch)  # stats describe the batch, sampled before this step
            version = int(batch.episode_infos["agent_version"].max())
            print(
                f"itr {itr:3d}  average return {stats['AverageReturn']:6.1f}  "
                f"episodes {batch.n_episodes:4d}  {steps_per_second:8,.0f} steps/s  "
                f"agent v{version}"
            )
            if stats["AverageReturn"] >= TARGET_RETURN:
                print(f"solved: average return {stats['AverageReturn']:.1f} at iteration {itr}")
                return 0
    print(f"not solved in {MAX_ITERATIONS} iterations", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
