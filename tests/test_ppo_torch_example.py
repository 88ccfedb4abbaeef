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
