"""garage's Trainer on rlfleet's samplers: epochs, diagnostics, snapshots, exact resume.

See docs/trainer.md.
"""

from rlfleet.trainer.diagnostics import DiagnosticsLog, Tabular
from rlfleet.trainer.experiment import ExperimentContext, wrap_experiment
from rlfleet.trainer.snapshot import Snapshot, SnapshotConfig, Snapshotter
from rlfleet.trainer.trainer import SnapshotAlgorithm, TrainArgs, Trainer, TrainerStats

__all__ = [
    "DiagnosticsLog",
    "ExperimentContext",
    "Snapshot",
    "SnapshotAlgorithm",
    "SnapshotConfig",
    "Snapshotter",
    "Tabular",
    "TrainArgs",
    "Trainer",
    "TrainerStats",
    "wrap_experiment",
]
