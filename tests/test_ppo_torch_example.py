"""examples/ppo_torch.py: PPO in torch trains CartPole through Trainer + Fleet.local.

The workers run the example's Agent module (a TorchPolicy built from its
import path); the run must reach the demo's target average return (475)
within a budget of 150,000 env steps. Sampling and training are
deterministic for the seed, so on the test machine this takes about 63,000
steps (31 epochs, about 90 s on a loaded 2-core machine).
"""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from examples.ppo_torch import main

BUDGET_STEPS = 150_000
TARGET_RETURN = 475.0  # rlfleet demo's target (rlfleet/cli/demo.py)


def test_ppo_reaches_the_demos_return_within_the_budget(tmp_path: Path) -> None:
    last_return = main(
        [
            "--total-timesteps",
            str(BUDGET_STEPS),
            "--target-return",
            str(TARGET_RETURN),
            "--log-dir",
            str(tmp_path),
        ]
    )
    assert last_return >= TARGET_RETURN
    with (tmp_path / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert float(rows[-1]["TotalEnvSteps"]) <= BUDGET_STEPS
    assert float(rows[0]["Evaluation/AverageReturn"]) < 50  # it started from scratch
    for key in ("losses/policy_loss", "losses/approx_kl", "charts/learning_rate"):
        assert key in rows[0]
    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert (tmp_path / f"itr_{len(rows) - 1}" / "tensors.safetensors").exists()


def test_ppo_snapshot_resumes_exactly(tmp_path: Path) -> None:
    """The example's torch state (module, Adam, minibatch order) round-trips exactly."""
    from examples.ppo_torch import PPO, Args
    from rlfleet import EnvConfig, LocalSampler, SnapshotConfig, Trainer

    env = EnvConfig("CartPole-v1")
    args = Args(batch_size=256, total_timesteps=4 * 256)

    def trainer_and_algo(directory: Path) -> tuple[Trainer, PPO]:
        trainer, algo = Trainer(SnapshotConfig(directory, "all"), print_table=False), PPO(env, args)
        trainer.setup(algo, env, sampler_cls=LocalSampler, n_workers=1, seed=args.seed)
        return trainer, algo

    trainer, straight = trainer_and_algo(tmp_path)
    trainer.train(n_epochs=4, batch_size=args.batch_size)
    trainer, resumed = trainer_and_algo(tmp_path)
    trainer.restore(tmp_path, from_epoch=1)
    trainer.resume()
    for name, value in straight.agent.state_dict().items():
        assert torch.equal(resumed.agent.state_dict()[name], value), name
