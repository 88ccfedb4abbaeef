"""Train two independent VPG policies on mpe2's cooperative simple_spread.

    python examples/multiagent.py [iterations]

A RolloutWorker runs the PettingZoo Parallel env; ``policy_mapping_fn="per-agent"``
binds agent_0 and agent_1 each to its own policy, and ``learn_on_batch``
updates both from one MultiAgentEpisodeBatch. The fleet's protocol carries
single-agent batches only for now (docs/rllib.md), so this runs on a local
worker with ``num_envs`` envs stepped together.
"""

from __future__ import annotations

import sys

from mpe2 import simple_spread_v3

from rlfleet import EnvSpec, MultiAgentEpisodeBatch, RolloutWorker
from rlfleet.learners import VPG

AGENTS = ("agent_0", "agent_1")


def make_env(ctx: dict) -> object:
    return simple_spread_v3.parallel_env(N=2, max_cycles=25)


def main(iterations: int = 30) -> int:
    probe = make_env({})
    spec = EnvSpec(probe.observation_space(AGENTS[0]), probe.action_space(AGENTS[0]))
    learners = {
        agent: VPG(spec, hidden_sizes=(32,), lr=0.01, seed=i) for i, agent in enumerate(AGENTS)
    }
    worker = RolloutWorker(
        env_creator=make_env,
        policy_spec=learners,
        policy_mapping_fn="per-agent",
        batch_mode="complete_episodes",
        rollout_fragment_length=500,
        num_envs=4,
        seed=0,
    )
    first = last = None
    for itr in range(iterations):
        batch = worker.sample()
        assert isinstance(batch, MultiAgentEpisodeBatch)
        worker.learn_on_batch(batch)
        metrics = worker.get_metrics()
        team_return = sum(m.episode_reward for m in metrics) / len(metrics)
        first = team_return if first is None else first
        last = team_return
        print(
            f"itr {itr:3d}  team return {team_return:8.2f}  episodes {len(metrics):3d}  "
            + "  ".join(f"{pid} {batch[pid].total_steps} steps" for pid in batch)
        )
    worker.stop()
    print(f"team return {first:.2f} -> {last:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 30))
