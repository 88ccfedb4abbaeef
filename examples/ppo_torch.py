"""PPO in PyTorch, CleanRL-style, training CartPole through rlfleet's Trainer on a local fleet.

    python examples/ppo_torch.py                    # until average return 475 (the demo's)
    python examples/ppo_torch.py --total-timesteps 50000 --log-dir runs/ppo

The learner owns the ``Agent`` (an actor-critic ``nn.Module``); the workers
build the same module from its import path (``PolicySpec("torch", ...)``)
and act with it under ``torch.inference_mode``. Every epoch the Trainer
pushes the learner's ``state_dict`` with the sampling request, so each
batch is exactly on-policy; the workers return each step's ``log_prob``
and ``value``, and PPO's clipped objective trains on them. Diagnostics go
to ``progress.csv`` and TensorBoard in the log directory, with garage's keys
(``Evaluation/AverageReturn``, ``TotalEnvSteps``) and CleanRL's
(``losses/*``, ``charts/*``); snapshots (safetensors + JSON) make the run
resumable exactly (``--resume``).

The loss and hyperparameters follow CleanRL's ``ppo.py``; the batch is
whole episodes of at least ``--batch-size`` steps instead of fixed
fragments, and a time-limit cut (TIMEOUT) is bootstrapped with the critic.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet import EnvConfig, EpisodeBatch, SnapshotConfig, StepType, Trainer
from rlfleet.client import Fleet
from rlfleet.policies.torch import TorchPolicy
from rlfleet.sampling import performance_stats

#: The module workers import to build the Agent (this file, from the checkout root).
MODULE = "examples.ppo_torch"


@dataclass
class Args:
    """CleanRL's PPO arguments (and the fleet's)."""

    seed: int = 1
    env_id: str = "CartPole-v1"
    total_timesteps: int = 300_000
    target_return: float = 475.0
    batch_size: int = 2048
    n_workers: int = 2
    envs_per_worker: int = 2
    learning_rate: float = 2.5e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    log_dir: str = "runs/ppo_torch"
    resume: bool = False


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    """CleanRL's orthogonal initialisation."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """CleanRL's actor-critic: ``forward`` gives the actor's logits, ``get_value`` the critic's."""

    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.actor(x)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)


class PPO:
    """PPO as a garage algorithm: ``train(trainer)`` loops over ``trainer.step_epochs()``."""

    def __init__(self, env: EnvConfig, args: Args) -> None:
        spec = env.env_spec()
        self.args = args
        self.max_episode_length = spec.max_episode_length
        self.policy = TorchPolicy(
            spec,
            module=f"{MODULE}:Agent",
            module_kwargs={
                "obs_dim": int(np.prod(spec.observation_space.shape or ())),
                "n_actions": int(spec.action_space.n),  # type: ignore[attr-defined]
            },
            distribution="categorical",
            threads=1,
            seed=args.seed,
        )
        self.agent: nn.Module = self.policy.module
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=args.learning_rate, eps=1e-5)
        self.rng = np.random.default_rng(args.seed)
        self.epochs = max(1, args.total_timesteps // args.batch_size)

    def train(self, trainer: Trainer) -> float:
        last_return = float("nan")
        for epoch in trainer.step_epochs():
            if self.args.anneal_lr:
                fraction = 1.0 - epoch / self.epochs
                self.optimizer.param_groups[0]["lr"] = fraction * self.args.learning_rate
            batch = trainer.obtain_episodes(trainer.step_itr)
            trainer.step_episode = batch
            losses = self.train_once(batch)
            stats = performance_stats(batch, self.args.gamma, trainer.step_itr)
            trainer.tabular.record_many(stats, prefix="Evaluation")
            trainer.tabular.record_many(losses, prefix="losses")
            trainer.tabular.record("charts/learning_rate", self.optimizer.param_groups[0]["lr"])
            last_return = stats["AverageReturn"]
            trainer.step_itr += 1
            if last_return >= self.args.target_return:
                break
        return last_return

    def train_once(self, batch: EpisodeBatch) -> dict[str, float]:
        """CleanRL's PPO update on one batch of whole episodes."""
        args = self.args
        obs = torch.as_tensor(batch.observations, dtype=torch.float32)
        actions = torch.as_tensor(batch.actions, dtype=torch.int64)
        old_log_probs = torch.as_tensor(batch.agent_infos["log_prob"], dtype=torch.float32)
        values = np.asarray(batch.agent_infos["value"], dtype=np.float64)
        with torch.no_grad():
            last_values = self.agent.get_value(  # type: ignore[operator]
                torch.as_tensor(batch.last_observations, dtype=torch.float32)
            )[:, 0].numpy()
        advantages = self._gae(batch, values, last_values)
        returns = torch.as_tensor(advantages + values, dtype=torch.float32)
        advantages_t = torch.as_tensor(advantages, dtype=torch.float32)
        values_t = torch.as_tensor(values, dtype=torch.float32)

        clip_fractions: list[float] = []
        for _ in range(args.update_epochs):
            # Whole episodes make n vary: split it into equal-ish minibatches
            # (a leftover of one row would have no advantage std).
            order = torch.as_tensor(self.rng.permutation(len(obs)))
            for rows in torch.tensor_split(order, args.num_minibatches):
                logits = self.agent(obs[rows])
                distribution = torch.distributions.Categorical(logits=logits)
                log_probs = distribution.log_prob(actions[rows])
                entropy = distribution.entropy()
                log_ratio = log_probs - old_log_probs[rows]
                ratio = log_ratio.exp()
                with torch.no_grad():
                    approx_kl = ((ratio - 1) - log_ratio).mean()
                    clip_fractions.append(
                        ((ratio - 1.0).abs() > args.clip_coef).float().mean().item()
                    )
                mb_advantages = advantages_t[rows]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )
                pg_loss = torch.max(
                    -mb_advantages * ratio,
                    -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef),
                ).mean()
                new_values = self.agent.get_value(obs[rows])[:, 0]  # type: ignore[operator]
                clipped = values_t[rows] + torch.clamp(
                    new_values - values_t[rows], -args.clip_coef, args.clip_coef
                )
                v_loss = (
                    0.5
                    * torch.max(
                        (new_values - returns[rows]) ** 2, (clipped - returns[rows]) ** 2
                    ).mean()
                )
                loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(self.agent.parameters(), args.max_grad_norm)
                self.optimizer.step()
        return {
            "policy_loss": pg_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": entropy.mean().item(),
            "approx_kl": approx_kl.item(),
            "clipfrac": float(np.mean(clip_fractions)),
        }

    def _gae(self, batch: EpisodeBatch, values: np.ndarray, last_values: np.ndarray) -> np.ndarray:
        """GAE(lambda) per episode; only a TERMINAL end has no future value."""
        args = self.args
        advantages = np.zeros(len(values))
        end = 0
        for episode, length in enumerate(batch.lengths):
            start, end = end, end + int(length)
            terminal = int(batch.step_types[end - 1]) == StepType.TERMINAL
            next_value = 0.0 if terminal else float(last_values[episode])
            running = 0.0
            for t in range(end - 1, start - 1, -1):
                delta = float(batch.rewards[t]) + args.gamma * next_value - values[t]
                running = delta + args.gamma * args.gae_lambda * running
                advantages[t] = running
                next_value = values[t]
        return advantages

    # Snapshots: named tensors and JSON, no pickle.
    def snapshot_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        tensors = {f"agent/{k}": v.numpy().copy() for k, v in self.agent.state_dict().items()}
        optimizer = self.optimizer.state_dict()
        for index, state in optimizer["state"].items():
            for key, value in state.items():
                tensors[f"optimizer/{index}/{key}"] = torch.as_tensor(value).numpy().copy()
        metadata = {"param_groups": optimizer["param_groups"], "rng": self.rng.bit_generator.state}
        return tensors, metadata

    def restore_state(self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any]) -> None:
        agent = {
            k[len("agent/") :]: torch.from_numpy(v)
            for k, v in tensors.items()
            if k.startswith("agent/")
        }
        self.agent.load_state_dict(agent)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in tensors.items():
            if name.startswith("optimizer/"):
                _, index, key = name.split("/")
                state.setdefault(int(index), {})[key] = torch.from_numpy(value.copy())
        self.optimizer.load_state_dict({"state": state, "param_groups": metadata["param_groups"]})
        self.rng.bit_generator.state = dict(metadata["rng"])


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        if field.type in (bool, "bool"):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            kind = {"int": int, "float": float, "str": str}[str(field.type)]
            parser.add_argument(flag, type=kind, default=field.default)
    return Args(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> float:
    """Trains; returns the last epoch's average return."""
    args = parse_args(argv)
    env = EnvConfig(args.env_id)
    algo = PPO(env, args)
    trainer = Trainer(SnapshotConfig(Path(args.log_dir), "last"))
    trainer.setup(
        algo,
        env,
        sampler_cls=Fleet.local,
        n_workers=args.n_workers,
        worker_args={"n_envs": args.envs_per_worker},
        sampler_args={"imports": (MODULE,)},
        seed=args.seed,
    )
    if args.resume:
        trainer.restore(args.log_dir)
        return trainer.resume()
    return trainer.train(n_epochs=algo.epochs, batch_size=args.batch_size)


if __name__ == "__main__":
    average_return = main()
    print(f"last average return {average_return:.1f}")
    sys.exit(0 if average_return >= parse_args().target_return else 1)
