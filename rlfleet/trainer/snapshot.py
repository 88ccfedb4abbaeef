"""Snapshots without code or pickle: named tensors (safetensors) plus JSON.

A snapshot of epoch k is the directory ``itr_{k}`` under the snapshot
directory, holding ``tensors.safetensors`` (parameters, optimizer moments,
any array) and ``snapshot.json`` (counters, settings, seeds: plain JSON).
Loading one runs no code from it. A snapshot is written into a hidden
temporary directory and renamed into place, so a process killed while
saving leaves the previous snapshots intact and no half-written one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError, SnapshotError

#: The snapshot modes garage documents.
SNAPSHOT_MODES = ("last", "all", "gap", "none")
#: Version of the snapshot layout, checked on load.
SNAPSHOT_FORMAT = 1
_TENSORS = "tensors.safetensors"
_METADATA = "snapshot.json"
_EPOCH_DIR = re.compile(r"^itr_(\d+)$")


@dataclass(frozen=True)
class SnapshotConfig:
    """Where and how often a Trainer snapshots (garage's ``SnapshotConfig``).

    Args:
        snapshot_dir: Directory of the snapshots.
        snapshot_mode: ``"last"`` keeps only the newest epoch, ``"all"``
            every epoch, ``"gap"`` every ``snapshot_gap``-th epoch (epochs
            0, gap, 2*gap, ...), ``"none"`` saves nothing.
        snapshot_gap: The gap of ``"gap"`` mode (>= 1).

    Raises:
        ConfigError: If the mode is unknown or the gap is < 1.
    """

    snapshot_dir: str | os.PathLike[str]
    snapshot_mode: str = "last"
    snapshot_gap: int = 1

    def __post_init__(self) -> None:
        if self.snapshot_mode not in SNAPSHOT_MODES:
            raise ConfigError(
                f"Invalid snapshot mode {self.snapshot_mode}: "
                f"SnapshotConfig.snapshot_mode must be one of {SNAPSHOT_MODES}"
            )
        gap = self.snapshot_gap
        if isinstance(gap, bool) or not isinstance(gap, int) or gap < 1:
            raise ConfigError(f"SnapshotConfig.snapshot_gap must be an int >= 1, got {gap!r}")


@dataclass
class Snapshot:
    """One saved epoch.

    Attributes:
        epoch: The epoch it was taken after.
        tensors: Named arrays.
        metadata: JSON data (str keys).
        path: The directory it was loaded from (None: not loaded).
    """

    epoch: int
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None


class Snapshotter:
    """Saves and loads :class:`Snapshot` s by the rules of a :class:`SnapshotConfig`."""

    def __init__(self, config: SnapshotConfig) -> None:
        self.config = config

    @property
    def snapshot_dir(self) -> Path:
        """The directory snapshots go to."""
        return Path(self.config.snapshot_dir)

    def wants(self, epoch: int) -> bool:
        """Whether the mode keeps a snapshot of ``epoch``."""
        mode = self.config.snapshot_mode
        if mode == "none":
            return False
        return mode != "gap" or epoch % self.config.snapshot_gap == 0

    def save(self, snapshot: Snapshot) -> Path | None:
        """Writes a snapshot if the mode keeps it; returns its directory or None.

        Raises:
            ConfigError: If the metadata is not JSON or a tensor name is not a str.
        """
        if not self.wants(snapshot.epoch):
            return None
        root = self.snapshot_dir
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"itr_{snapshot.epoch}"
        staging = root / f".itr_{snapshot.epoch}.{os.getpid()}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            text = json.dumps(
                {"format": SNAPSHOT_FORMAT, "epoch": snapshot.epoch, **snapshot.metadata},
                indent=1,
                sort_keys=True,
                allow_nan=True,
            )
        except (TypeError, ValueError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise ConfigError(
                f"snapshot metadata of epoch {snapshot.epoch} is not JSON: {exc}"
            ) from exc
        from safetensors.numpy import save_file  # the `trainer` extra

        save_file(_contiguous(snapshot.tensors), str(staging / _TENSORS))
        (staging / _METADATA).write_text(text)
        if final.exists():
            # rename() cannot replace a non-empty directory: move the old one
            # aside first; a crash in between leaves the new one staged.
            old = root / f".itr_{snapshot.epoch}.{os.getpid()}.old"
            final.rename(old)
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(final)
        if self.config.snapshot_mode == "last":
            for epoch, path in _epochs(root).items():
                if epoch != snapshot.epoch:
                    shutil.rmtree(path, ignore_errors=True)
        return final

    @staticmethod
    def load(from_dir: str | os.PathLike[str], itr: int | str = "last") -> Snapshot:
        """Reads a snapshot (garage's ``Snapshotter.load``).

        Args:
            from_dir: A snapshot directory.
            itr: An epoch number, or ``"last"`` for the newest one there.

        Returns:
            The snapshot.

        Raises:
            ConfigError: If there is no such snapshot.
            SnapshotError: If a file of it is unreadable, its JSON is not an
                object, or it is of another format (naming the file and key).
        """
        root = Path(from_dir)
        found = _epochs(root)
        if itr == "last":
            if not found:
                raise ConfigError(
                    f"no snapshot in {str(root)!r} (looked for itr_<epoch> directories): "
                    "train with a SnapshotConfig whose snapshot_mode is not 'none' first"
                )
            path = found[max(found)]
        elif isinstance(itr, int) and not isinstance(itr, bool) and itr in found:
            path = found[itr]
        else:
            raise ConfigError(
                f"no snapshot of epoch {itr!r} in {str(root)!r}; the epochs there are "
                f"{sorted(found)} (pass one of them, or 'last')"
            )
        json_path, tensors_path = path / _METADATA, path / _TENSORS
        try:
            metadata = json.loads(json_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SnapshotError(f"{json_path}: cannot be read as JSON: {exc}") from exc
        if not isinstance(metadata, dict):
            raise SnapshotError(
                f"{json_path}: holds a JSON {type(metadata).__name__}, not an object"
            )
        if metadata.get("format") != SNAPSHOT_FORMAT:
            raise SnapshotError(
                f"{json_path}: key 'format' is {metadata.get('format')!r}; this rlfleet reads "
                f"snapshot format {SNAPSHOT_FORMAT}"
            )
        epoch = metadata.pop("epoch", None)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise SnapshotError(f"{json_path}: key 'epoch' must be an int >= 0, got {epoch!r}")
        from safetensors.numpy import load_file  # the `trainer` extra

        try:
            tensors = dict(load_file(str(tensors_path)))
        except Exception as exc:  # SafetensorError, OSError...: the file is input, not code
            raise SnapshotError(
                f"{tensors_path}: cannot be read as safetensors: {type(exc).__name__}: {exc}"
            ) from exc
        metadata.pop("format")
        return Snapshot(epoch, tensors, metadata, path)


def _epochs(root: Path) -> dict[int, Path]:
    """Complete snapshots under ``root`` by epoch (hidden staging dirs excluded)."""
    if not root.is_dir():
        return {}
    found = {}
    for entry in root.iterdir():
        match = _EPOCH_DIR.match(entry.name)
        if match and (entry / _METADATA).is_file():
            found[int(match.group(1))] = entry
    return found


def _contiguous(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    for name in tensors:
        if not isinstance(name, str):
            raise ConfigError(f"snapshot tensor names must be str, got {name!r}")
    return {name: np.ascontiguousarray(value) for name, value in tensors.items()}


def episode_tensors(batch: EpisodeBatch | None) -> dict[str, np.ndarray]:
    """An epoch's batch as snapshot tensors (``store_episodes``), under ``episodes/``.

    Raises:
        ConfigError: If a field is not an array (an object array included).
    """
    if batch is None:
        return {}
    tensors: dict[str, np.ndarray] = {}
    for name in ("observations", "last_observations", "actions", "rewards", "lengths"):
        value = getattr(batch, name)
        if not isinstance(value, np.ndarray):
            raise ConfigError(
                f"store_episodes keeps array fields only; this batch's {name} is a "
                f"{type(value).__name__}"
            )
        tensors[f"episodes/{name}"] = value
    tensors["episodes/step_types"] = np.asarray(batch.step_types, dtype=np.int8)
    for group in ("env_infos", "agent_infos", "episode_infos"):
        for key, value in getattr(batch, group).items():
            if not isinstance(value, np.ndarray) or value.dtype == object:
                raise ConfigError(
                    f"store_episodes keeps array fields only; {group}[{key!r}] is a "
                    f"{type(value).__name__}: train with store_episodes=False"
                )
            tensors[f"episodes/{group}/{key}"] = value
    return tensors
