"""Exact resume on the fleet: a training process killed between epochs and resumed.

Three real processes each run ``tests/fixtures/train_resumable.py`` (Trainer
+ VPG + ``Fleet.local`` with two worker processes): one uninterrupted, one
SIGKILLed (with its workers) after epoch 1's snapshot while epoch 2 is
under way, and one that restores the last snapshot and resumes. The resumed
run must draw exactly the uninterrupted run's batches and end with exactly
its parameters.
"""

from __future__ import annotations

import csv
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil

from tests._coordinator_fakes import ROOT

SCRIPT = str(Path(ROOT) / "tests" / "fixtures" / "train_resumable.py")
EPOCHS = 4
PAUSE_AFTER = 1
#: Seconds for the training process to start its fleet and reach the pause.
PAUSE_TIMEOUT = 240.0


def _start(*args: str | Path | int, stdout: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, SCRIPT, *map(str, args)],
        stdout=stdout,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def _finish(process: subprocess.Popen[str], timeout: float = 240.0) -> None:
    """Waits for a training process to exit 0; kills its tree if it does not exit."""
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            _kill_tree(process)
    assert process.returncode == 0, f"the training process exited with {process.returncode}"


def _kill_tree(process: subprocess.Popen[str]) -> None:
    """SIGKILLs the training process and every worker it started."""
    parent = psutil.Process(process.pid)
    tree = [parent, *parent.children(recursive=True)]
    for member in tree:
        member.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=10)


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


def _assert_same(left: dict[str, np.ndarray], right: dict[str, np.ndarray], what: str) -> None:
    assert sorted(left) == sorted(right), what
    for key, value in left.items():
        np.testing.assert_array_equal(value, right[key], err_msg=f"{what}: {key}")


def _kill_and_resume(broken: Path) -> None:
    """A run SIGKILLed once epoch PAUSE_AFTER's snapshot is saved, then resumed."""
    process = _start(
        "--snapshots", broken / "snap", "--record", broken / "rec", "--epochs", EPOCHS,
        "--pause-after", PAUSE_AFTER, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            assert selector.select(timeout=PAUSE_TIMEOUT), (
                f"the training process did not pause within {PAUSE_TIMEOUT} seconds"
            )
        assert process.stdout.readline().strip() == "PAUSED"
    finally:
        _kill_tree(process)
    assert sorted(p.name for p in (broken / "snap").glob("itr_*")) == [f"itr_{PAUSE_AFTER}"]
    assert not (broken / "rec" / "final.npz").exists()

    _finish(_start("--snapshots", broken / "snap", "--record", broken / "rec", "--resume"))


def test_killed_run_resumes_to_the_same_batches_and_parameters(tmp_path: Path) -> None:
    full, broken = tmp_path / "full", tmp_path / "broken"
    # The uninterrupted run shares nothing with the other two: it runs
    # alongside them (each process is mostly start-up and waiting).
    uninterrupted = _start(
        "--snapshots", full / "snap", "--record", full / "rec", "--epochs", EPOCHS
    )
    try:
        _kill_and_resume(broken)
        _finish(uninterrupted)
    finally:
        if uninterrupted.poll() is None:
            _kill_tree(uninterrupted)

    for epoch in range(EPOCHS):
        _assert_same(
            _load(broken / "rec" / f"batch_{epoch}.npz"),
            _load(full / "rec" / f"batch_{epoch}.npz"),
            f"batch of epoch {epoch}",
        )
    _assert_same(_load(broken / "rec" / "final.npz"), _load(full / "rec" / "final.npz"), "params")
    # Each epoch logged once, in order, though epoch 2 ran twice.
    for run in (full, broken):
        with (run / "snap" / "progress.csv").open() as handle:
            epochs = [int(float(row["Epoch"])) for row in csv.DictReader(handle)]
        assert epochs == list(range(EPOCHS))
    full_rows = list(csv.DictReader((full / "snap" / "progress.csv").open()))
    broken_rows = list(csv.DictReader((broken / "snap" / "progress.csv").open()))
    for key in ("Evaluation/AverageReturn", "TotalEnvSteps", "policy/KL"):
        assert [r[key] for r in full_rows] == [r[key] for r in broken_rows], key
