"""Train two independent VPG policies on mpe2's cooperative simple_spread, through the fleet.

    python examples/multiagent.py [iterations] [--local]

``policy_mapping_fn="per-agent"`` binds agent_0 and agent_1 each to its own
policy. By default a ``RolloutWorkerGroup`` samples on ``Fleet.local`` (two
worker processes, two envs each): the workers run the env as registered by
``rlfleet.rllib.pettingzoo_envs`` (their ``--import``), the group pushes
both policies' weights after each update, and ``learn_on_batch`` on the
group's local worker updates both from one MultiAgentEpisodeBatch. With
``--local`` a single RolloutWorker with four envs samples instead; with the
same seeds both give the same batches (tests/test_rllib_multi_agent_fleet.py).
"""

from __future__ import annotations

import sys
from typing import Any

from rlfleet import EnvConfig, EnvSpec, MultiAgentEpisodeBatch, RolloutWorker
from rlfleet.learners import VPG
from rlfleet.rllib.multi_agent import make_agent_env
from rlfleet.rllib.pettingzoo_envs import SIMPLE_SPREAD
from rlfleet.rllib.worker_group import RolloutWorkerGroup

AGENTS = ("agent_0", "agent_1")
ENV = EnvConfig(
    SIMPLE_SPREAD, {"N": 2, "max_cycles": 25}, imports=("rlfleet.rllib.pettingzoo_envs",)
)
#: Env slots in all: 2 workers x 2 envs on the fleet, 4 envs locally.
SLOTS = 4


def sampling_args() -> dict[str, Any]:
    probe = make_agent_env(ENV.id, ENV.kwargs)
    spec = EnvSpec(probe.observation_space(AGENTS[0]), probe.action_space(AGENTS[0]))
    probe.close()
    learners = {
        agent: VPG(spec, hidden_sizes=(32,), lr=0.01, seed=i) for i, agent in enumerate(AGENTS)
    }
    return {
        "policy_spec": learners,
        "policy_mapping_fn": "per-agent",
        "batch_mode": "complete_episodes",
        "rollout_fragment_length": 500 // SLOTS,
        "seed": 0,
    }


def main(iterations: int = 30, *, local: bool = False) -> int:
    group: RolloutWorkerGroup | None = None
    if local:
        worker = RolloutWorker(
            env_creator=lambda ctx: make_agent_env(ENV.id, ENV.kwargs),
            num_envs=SLOTS,
            **sampling_args(),
        )
    else:
        group = RolloutWorkerGroup.local(
            2, env=ENV, envs_per_worker=SLOTS // 2, fleet_seed=0, **sampling_args()
        )
        worker = group.local_worker()
    first = last = None
    try:
        for itr in range(iterations):
            batch = worker.sample() if group is None else group.sample()
            assert isinstance(batch, MultiAgentEpisodeBatch)
            worker.learn_on_batch(batch)
            if group is not None:
                group.sync_weights()
            metrics = worker.get_metrics() if group is None else group.get_metrics()
            team_return = sum(m.episode_reward for m in metrics) / len(metrics)
            first = team_return if first is None else first
            last = team_return
            print(
                f"itr {itr:3d}  team return {team_return:8.2f}  episodes {len(metrics):3d}  "
                + "  ".join(f"{pid} {batch[pid].total_steps} steps" for pid in batch)
            )
    finally:
        (worker if group is None else group).stop()
    print(f"team return {first:.2f} -> {last:.2f} ({'local' if local else 'fleet'})")
    return 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--local"]
    sys.exit(main(int(args[0]) if args else 30, local="--local" in sys.argv[1:]))
