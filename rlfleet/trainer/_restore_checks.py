"""What :meth:`Trainer.restore` checks before it changes anything, and its undo.

A snapshot is input: a file edited by hand, truncated, or taken of another
build of the algorithm. ``restore`` first checks the whole of it (the
trainer's keys and their types and ranges, then every tensor and metadata
key the algorithm's own state has, with its dtype and shape, finite), and
only then applies it. If the algorithm's ``restore_state`` still refuses,
its state from before is put back. Every refusal is a
:class:`~rlfleet.errors.SnapshotError` naming the file and the key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlfleet.errors import SnapshotError

#: The trainer's tensors' prefix in the snapshot (the rest are episodes).
ALGO_PREFIX = "algo/"
_JSON = "snapshot.json"
_TENSORS = "tensors.safetensors"


class StatefulAlgorithm(Protocol):
    """An algorithm with a snapshot state (the trainer's ``SnapshotAlgorithm``)."""

    def snapshot_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    def restore_state(
        self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, Any]
    ) -> None: ...


def check_trainer_metadata(
    metadata: Mapping[str, Any],
    directory: Path,
    *,
    stats_keys: tuple[str, ...],
    train_args_keys: tuple[str, ...],
) -> None:
    """Checks the trainer's keys of ``snapshot.json``: presence, types and ranges.

    Args:
        metadata: The file's object (``format`` and ``epoch`` already taken out).
        directory: The snapshot's directory, for messages.
        stats_keys: The fields of ``TrainerStats`` (each an int >= 0).
        train_args_keys: The fields of ``TrainArgs``.

    Raises:
        SnapshotError: Naming the file and the first key at fault.
    """
    where = directory / _JSON
    for key in ("seed", "algorithm", "env", "stats", "train_args", "algo"):
        if key not in metadata:
            raise SnapshotError(f"{where}: key {key!r} is missing")
    _int(where, "seed", metadata["seed"], minimum=0)
    if not isinstance(metadata["algorithm"], str):
        raise SnapshotError(f"{where}: key 'algorithm' must be a str")
    _exact_object(where, "stats", metadata["stats"], stats_keys)
    for key in stats_keys:
        _int(where, f"stats.{key}", metadata["stats"][key], minimum=0)
    if not isinstance(metadata["algo"], dict):
        raise SnapshotError(f"{where}: key 'algo' must be an object")
    args = metadata["train_args"]
    if args is None:
        raise SnapshotError(
            f"{where}: key 'train_args' is null: the snapshot was saved outside train() and "
            "has no training arguments to resume with"
        )
    _exact_object(where, "train_args", args, train_args_keys)
    _int(where, "train_args.n_epochs", args["n_epochs"], minimum=0)
    _int(where, "train_args.start_epoch", args["start_epoch"], minimum=0)
    if args["batch_size"] is not None:
        _int(where, "train_args.batch_size", args["batch_size"], minimum=1)
    for flag in ("plot", "store_episodes", "pause_for_plot"):
        if not isinstance(args[flag], bool):
            raise SnapshotError(
                f"{where}: key 'train_args.{flag}' must be true or false, got {args[flag]!r}"
            )


def check_algo_state(
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, Any],
    expected: tuple[Mapping[str, np.ndarray], Mapping[str, Any]],
    directory: Path,
) -> None:
    """Checks the algorithm's part of a snapshot against the algorithm's own state.

    Every tensor of the algorithm's current state must be there with its
    dtype and shape, and every floating tensor must be finite; every key of
    its current metadata must be there. Tensors or keys the algorithm does
    not have now are its own business (state created later, e.g. by a step).

    Args:
        tensors: The snapshot's algorithm tensors (prefix removed).
        metadata: The snapshot's ``algo`` object.
        expected: The algorithm's ``snapshot_state()`` now.
        directory: The snapshot's directory, for messages.

    Raises:
        SnapshotError: Naming the file and the first tensor or key at fault.
    """
    expected_tensors, expected_metadata = expected
    where = directory / _TENSORS
    for name, now in expected_tensors.items():
        saved = tensors.get(name)
        key = ALGO_PREFIX + name
        if saved is None:
            raise SnapshotError(
                f"{where}: tensor {key!r} is missing (the algorithm has it, of shape "
                f"{np.shape(now)} and dtype {np.asarray(now).dtype})"
            )
        now_array = np.asarray(now)
        if saved.dtype != now_array.dtype or saved.shape != now_array.shape:
            raise SnapshotError(
                f"{where}: tensor {key!r} is {saved.dtype} of shape {saved.shape}; the algorithm "
                f"holds {now_array.dtype} of shape {now_array.shape}: was the snapshot taken of "
                "an algorithm built with other arguments?"
            )
    for name, saved in tensors.items():
        if saved.dtype.kind in "fc" and not np.isfinite(saved).all():
            bad = int(np.size(saved) - np.count_nonzero(np.isfinite(saved)))
            raise SnapshotError(
                f"{where}: tensor {ALGO_PREFIX + name!r} holds {bad} NaN or inf values of "
                f"{np.size(saved)}"
            )
    for key in expected_metadata:
        if key not in metadata:
            raise SnapshotError(f"{directory / _JSON}: key 'algo.{key}' is missing")


def restore_or_undo(
    algorithm: StatefulAlgorithm,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, Any],
    directory: Path,
) -> None:
    """Calls ``algorithm.restore_state``; if it raises, puts the state from before back.

    Raises:
        SnapshotError: If ``restore_state`` raised (the cause is chained).
    """
    now_tensors, now_metadata = algorithm.snapshot_state()
    before = (
        {name: np.array(value, copy=True) for name, value in now_tensors.items()},
        copy.deepcopy(now_metadata),
    )
    try:
        algorithm.restore_state(tensors, metadata)
    except Exception as exc:
        algorithm.restore_state(*before)
        raise SnapshotError(
            f"{directory}: {type(algorithm).__name__}.restore_state refused the snapshot "
            f"({type(exc).__name__}: {exc}); the algorithm keeps its state from before"
        ) from exc


def _int(where: Path, key: str, value: Any, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SnapshotError(f"{where}: key {key!r} must be an int >= {minimum}, got {value!r}")


def _exact_object(where: Path, key: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where}: key {key!r} must be an object, got {value!r}")
    missing = [k for k in keys if k not in value]
    unknown = sorted(set(value) - set(keys))
    if missing or unknown:
        raise SnapshotError(
            f"{where}: key {key!r} must hold exactly {list(keys)}; "
            + "; ".join(
                part
                for part in (
                    f"missing {missing}" if missing else "",
                    f"unknown {unknown}" if unknown else "",
                )
                if part
            )
        )
