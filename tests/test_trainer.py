"""rlfleet.Trainer in one process: garage's API, snapshots, diagnostics, resume.

The samplers are real LocalSamplers running CartPole; the fleet-level
kill-and-resume proof is tests/test_trainer_resume.py.
"""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from rlfleet import LocalSampler
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, NotSetupError
from rlfleet.learners import VPG
from rlfleet.trainer import (
    ExperimentContext,
    SnapshotConfig,
    Snapshotter,
    Trainer,
    wrap_experiment,
)

ENV = EnvConfig("CartPole-v1")
BATCH = 300


def _vpg() -> VPG:
    return VPG(ENV.env_spec(), hidden_sizes=(8,), seed=1)


def _trainer(directory: Path, mode: str = "all", gap: int = 1) -> Trainer:
    return Trainer(SnapshotConfig(directory, mode, gap), print_table=False)


def _set_up(directory: Path, mode: str = "all", gap: int = 1) -> tuple[Trainer, VPG]:
    trainer, algo = _trainer(directory, mode, gap), _vpg()
    trainer.setup(algo, ENV, sampler_cls=LocalSampler, n_workers=1, seed=5)
    return trainer, algo


def _epochs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("itr_*"))


@pytest.mark.parametrize(
    ("mode", "gap", "expected"),
    [
        ("all", 1, ["itr_0", "itr_1", "itr_2", "itr_3"]),
        ("last", 1, ["itr_3"]),
        ("gap", 2, ["itr_0", "itr_2"]),
        ("none", 1, []),
    ],
)
def test_snapshot_modes_keep_garages_epochs(
    tmp_path: Path, mode: str, gap: int, expected: list[str]
) -> None:
    trainer, _ = _set_up(tmp_path, mode, gap)
    trainer.train(n_epochs=4, batch_size=BATCH)
    assert _epochs(tmp_path) == expected


def test_snapshot_config_rejects_garages_invalid_mode() -> None:
    with pytest.raises(ValueError, match="Invalid snapshot mode bogus"):
        SnapshotConfig("x", "bogus")
    with pytest.raises(ConfigError, match="snapshot_gap must be an int >= 1"):
        SnapshotConfig("x", "gap", 0)


def test_restored_run_ends_with_the_uninterrupted_parameters(tmp_path: Path) -> None:
    trainer, straight = _set_up(tmp_path / "a")
    returned = trainer.train(n_epochs=4, batch_size=BATCH)
    trainer, resumed = _set_up(tmp_path / "a")  # fresh algo: the snapshot restores it
    args = trainer.restore(tmp_path / "a", from_epoch=1)
    assert (args.start_epoch, args.n_epochs, args.batch_size) == (2, 4, BATCH)
    assert trainer.resume() == returned
    for name, value in straight.get_params().items():
        np.testing.assert_array_equal(resumed.get_params()[name], value)
    assert trainer.total_env_steps > 0


def test_resume_extends_a_finished_run_like_a_longer_one(tmp_path: Path) -> None:
    trainer, short = _set_up(tmp_path / "short")
    trainer.train(n_epochs=2, batch_size=BATCH)
    trainer.restore(tmp_path / "short")
    trainer.resume(n_epochs=3)  # the sampler was shut down by train(): remade
    trainer, long = _set_up(tmp_path / "long")
    trainer.train(n_epochs=3, batch_size=BATCH)
    for name, value in long.get_params().items():
        np.testing.assert_array_equal(short.get_params()[name], value)


def test_snapshot_holds_named_tensors_and_json_only(tmp_path: Path) -> None:
    trainer, algo = _set_up(tmp_path)
    trainer.train(n_epochs=1, batch_size=BATCH, store_episodes=True)
    files = sorted(p.name for p in (tmp_path / "itr_0").iterdir())
    assert files == ["snapshot.json", "tensors.safetensors"]
    snapshot = Snapshotter.load(tmp_path)
    assert snapshot.epoch == 0
    np.testing.assert_array_equal(
        snapshot.tensors["algo/policy/layers.0.weight"].astype(np.float32),
        algo.get_params()["layers.0.weight"],
    )
    assert snapshot.tensors["algo/policy/layers.0.weight"].dtype == np.float64  # exact state
    assert snapshot.tensors["episodes/lengths"].sum() >= BATCH
    assert snapshot.metadata["seed"] == 5
    assert snapshot.metadata["stats"]["next_request"] == 1
    assert snapshot.metadata["env"] == ENV.to_dict()


def test_a_half_written_snapshot_is_ignored(tmp_path: Path) -> None:
    trainer, _ = _set_up(tmp_path)
    trainer.train(n_epochs=1, batch_size=BATCH)
    (tmp_path / ".itr_1.999.tmp").mkdir()  # what a kill while saving leaves
    assert Snapshotter.load(tmp_path).epoch == 0
    with pytest.raises(ConfigError, match=r"no snapshot of epoch 1 .* epochs there are \[0\]"):
        Snapshotter.load(tmp_path, 1)


def test_restore_refuses_a_snapshot_of_another_env(tmp_path: Path) -> None:
    trainer, _ = _set_up(tmp_path)
    trainer.train(n_epochs=1, batch_size=BATCH)
    other = _trainer(tmp_path)
    other.setup(_vpg(), EnvConfig("CartPole-v1", max_episode_length=50), LocalSampler, n_workers=1)
    with pytest.raises(ConfigError, match="was taken of env"):
        other.restore(tmp_path)


def test_not_set_up_errors_say_what_garage_says(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    with pytest.raises(NotSetupError, match=r"Use setup\(\) to setup trainer before training"):
        trainer.train(1, 10)
    with pytest.raises(NotSetupError, match=r"before saving"):
        trainer.save(0)
    with pytest.raises(NotSetupError, match=r"You must call restore\(\) before resume\(\)"):
        trainer.resume()
    with pytest.raises(NotSetupError, match=r"snapshots hold no code"):
        trainer.restore(tmp_path)


def test_sampling_errors_say_what_garage_says(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    trainer.setup(_vpg(), ENV)  # no sampler_cls
    with pytest.raises(ValueError, match="trainer was not initialized with `sampler_cls`"):
        trainer.obtain_episodes(0, 10)
    trainer, _ = _set_up(tmp_path)
    with pytest.raises(ValueError, match="trainer was not initialized with `batch_size`"):
        trainer.obtain_episodes(0)
    assert trainer.obtain_episodes(0, 50).total_steps >= 50
    assert isinstance(trainer.obtain_samples(1, 50)[0]["observations"], np.ndarray)

    class NoPolicy:
        max_episode_length = 10

    trainer.setup(NoPolicy(), ENV)
    with pytest.raises(ValueError, match="the algorithm must have a `policy` field"):
        trainer.make_sampler(LocalSampler)

    class NoLength:
        policy = "random"

    trainer.setup(NoLength(), ENV)
    with pytest.raises(ValueError, match="must have a `max_episode_length` field"):
        trainer.make_sampler(LocalSampler)
    with pytest.raises(ConfigError, match="plot=True is not supported"):
        _set_up(tmp_path)[0].train(1, 10, plot=True)


def test_an_algorithm_without_state_cannot_be_snapshotted(tmp_path: Path) -> None:
    class Stateless:
        policy = "random"
        max_episode_length = 20

        def train(self, trainer: Trainer) -> float:
            for _ in trainer.step_epochs():
                trainer.step_episode = trainer.obtain_episodes(trainer.step_itr)
                trainer.step_itr += 1
            return 0.0

    trainer = _trainer(tmp_path)
    trainer.setup(Stateless(), ENV, LocalSampler, n_workers=1)
    with pytest.raises(ConfigError, match="snapshot_state"):
        trainer.train(1, 10)
    none = Trainer(SnapshotConfig(tmp_path / "n", "none"), print_table=False)
    none.setup(Stateless(), ENV, LocalSampler, n_workers=1)
    assert none.train(2, 10) == 0.0


def _tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Reads TFRecord event files (length, crc, data, crc) without TensorBoard."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_diagnostics_go_to_csv_tensorboard_and_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = Trainer(SnapshotConfig(tmp_path, "last"))
    trainer.setup(_vpg(), ENV, LocalSampler, n_workers=1)
    last = trainer.train(n_epochs=2, batch_size=BATCH)
    with (tmp_path / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [row["Epoch"] for row in rows] == ["0.0", "1.0"]
    for key in ("Evaluation/AverageReturn", "Evaluation/NumEpisodes", "TotalEnvSteps", "ItrTime"):
        assert key in rows[0]
    assert float(rows[1]["Evaluation/AverageReturn"]) == last
    assert float(rows[1]["TotalEnvSteps"]) == trainer.total_env_steps
    scalars = _tensorboard_scalars(tmp_path)
    returns = scalars["Evaluation/AverageReturn"]
    assert [step for step, _ in returns] == [0, 1]
    assert returns[1][1] == pytest.approx(last, rel=1e-6)
    out = capsys.readouterr().out
    assert "Evaluation/AverageReturn" in out and "TotalEnvSteps" in out


def test_wrap_experiment_makes_garages_log_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    seen: list[ExperimentContext] = []

    @wrap_experiment(snapshot_mode="gap", snapshot_gap=3, name_parameters="all")
    def my_experiment(ctxt: ExperimentContext, seed: int, lr: float = 0.5) -> int:
        seen.append(ctxt)
        Path(ctxt.snapshot_dir, "data.txt").write_text("x")
        return seed

    assert my_experiment(seed=2) == 2
    assert my_experiment(seed=2) == 2
    base = tmp_path / "data" / "local" / "experiment"
    assert [Path(c.snapshot_dir) for c in seen] == [
        base / "my_experiment_seed=2_lr=0.5",
        base / "my_experiment_seed=2_lr=0.5_1",
    ]
    assert (seen[0].snapshot_mode, seen[0].snapshot_gap) == ("gap", 3)
    assert json.loads((base / "my_experiment_seed=2_lr=0.5" / "variant.json").read_text()) == {
        "seed": 2
    }
    with pytest.raises(ValueError, match="only supports keyword arguments"):
        my_experiment(3)

    @wrap_experiment(prefix="p", use_existing_dir=True)
    def reuse(ctxt: ExperimentContext) -> Any:
        return Trainer(ctxt, print_table=False)

    reuse()
    trainer = reuse()
    assert not (tmp_path / "data" / "local" / "p" / "reuse_1").exists()
    assert trainer.get_env_copy() is None


def test_remote_sampler_trains_on_a_running_coordinator(tmp_path: Path) -> None:
    from rlfleet.client import Fleet, RemoteSampler

    with Fleet.local(workers=1, env=ENV, seed=0) as running:
        trainer, algo = _trainer(tmp_path), _vpg()
        trainer.setup(
            algo, ENV, sampler_cls=RemoteSampler, sampler_args={"address": running.address}, seed=5
        )
        assert trainer.train(n_epochs=2, batch_size=BATCH) > 0
        # The same seed and requests on a LocalSampler give the same parameters.
        local_trainer, local_algo = _set_up(tmp_path / "local")
        local_trainer.train(n_epochs=2, batch_size=BATCH)
        for name, value in local_algo.get_params().items():
            np.testing.assert_array_equal(algo.get_params()[name], value)
        assert running.status().ready_workers == 1  # the trainer closed only its channel


def test_a_garage_algorithm_calling_log_performance_fills_the_diagnostics(tmp_path: Path) -> None:
    from rlfleet import log_performance

    class GarageStyle:
        policy = "random"
        max_episode_length = 30

        def train(self, trainer: Trainer) -> float:
            returns = np.zeros(0)
            for _ in trainer.step_epochs():
                trainer.step_episode = trainer.obtain_episodes(trainer.step_itr)
                returns = log_performance(trainer.step_itr, trainer.step_episode, discount=0.99)
                trainer.step_itr += 1
            return float(np.mean(returns))

    trainer = Trainer(SnapshotConfig(tmp_path, "none"), print_table=False)
    trainer.setup(GarageStyle(), ENV, LocalSampler, n_workers=1)
    last = trainer.train(n_epochs=2, batch_size=100)
    with (tmp_path / "progress.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [float(row["Evaluation/Iteration"]) for row in rows] == [0.0, 1.0]
    assert float(rows[-1]["Evaluation/AverageReturn"]) == last
    # Outside an epoch, log_performance records nothing in the trainer.
    log_performance(9, trainer.obtain_episodes(0, 10), 0.99)
    assert trainer.tabular.as_dict()["Evaluation/Iteration"] == 1.0  # the last epoch's
