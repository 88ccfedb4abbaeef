"""Trainer.restore checks the whole snapshot before it changes anything.

A real run (VPG on CartPole through a LocalSampler) saves epoch 0; the
snapshot is then tampered with as a hand edit, a truncated copy or another
build would; a freshly set-up trainer must refuse it with a SnapshotError
(a ConfigError) naming the file and the key, with its algorithm's
parameters, its counters and its sampler's position unchanged.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rlfleet import LocalSampler
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, SnapshotError
from rlfleet.learners import VPG
from rlfleet.trainer import SnapshotConfig, Trainer

ENV = EnvConfig("CartPole-v1")
JSON = "snapshot.json"
TENSORS = "tensors.safetensors"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A snapshot directory holding epoch 0 of a real run."""
    directory = tmp_path_factory.mktemp("saved")
    trainer = Trainer(SnapshotConfig(directory, "all"), print_table=False)
    trainer.setup(VPG(ENV.env_spec(), hidden_sizes=(8,), seed=1), ENV, LocalSampler, seed=5)
    trainer.train(n_epochs=1, batch_size=200)
    trainer.close()
    return directory


def edit_json(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def edit(epoch: Path) -> None:
        data = json.loads((epoch / JSON).read_text())
        result = change(data)
        (epoch / JSON).write_text(json.dumps(data if result is None else result))

    return edit


def edit_tensors(change: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path], None]:
    def edit(epoch: Path) -> None:
        tensors = dict(load_file(str(epoch / TENSORS)))
        change(tensors)
        save_file(tensors, str(epoch / TENSORS))

    return edit


def write(name: str, text: bytes) -> Callable[[Path], None]:
    def edit(epoch: Path) -> None:
        (epoch / name).write_bytes(text)

    return edit


def first_policy_tensor(tensors: dict[str, np.ndarray]) -> str:
    return sorted(name for name in tensors if name.startswith("algo/policy/"))[0]


def drop_tensor(tensors: dict[str, np.ndarray]) -> None:
    del tensors[first_policy_tensor(tensors)]


def nan_tensor(tensors: dict[str, np.ndarray]) -> None:
    name = first_policy_tensor(tensors)
    tensors[name] = np.full_like(tensors[name], np.nan)


def other_dtype_tensor(tensors: dict[str, np.ndarray]) -> None:
    name = first_policy_tensor(tensors)
    assert tensors[name].dtype == np.float64  # the built-in MLPs' parameters
    tensors[name] = tensors[name].astype(np.float32)


def set_in(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            data = data[key]
        data[last] = value

    return change


CASES: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "seed 'abc'": (edit_json(set_in("seed", "abc")), JSON, "key 'seed' must be an int >= 0"),
    "an unknown stats key": (
        edit_json(set_in("stats.bogus", 1)),
        JSON,
        "key 'stats' must hold exactly",
    ),
    "next_request -5": (
        edit_json(set_in("stats.next_request", -5)),
        JSON,
        "key 'stats.next_request' must be an int >= 0, got -5",
    ),
    "n_epochs -1": (
        edit_json(set_in("train_args.n_epochs", -1)),
        JSON,
        "key 'train_args.n_epochs' must be an int >= 0, got -1",
    ),
    "stats missing": (edit_json(lambda d: d.pop("stats") and None), JSON, "key 'stats' is missing"),
    "a JSON list": (edit_json(lambda d: [d]), JSON, "holds a JSON list, not an object"),
    "truncated JSON": (write(JSON, b'{"format": 1, "ep'), JSON, "cannot be read as JSON"),
    "a missing tensor": (edit_tensors(drop_tensor), TENSORS, "tensor 'algo/policy/"),
    "an all-NaN tensor": (edit_tensors(nan_tensor), TENSORS, "NaN or inf values"),
    "a float32 tensor": (edit_tensors(other_dtype_tensor), TENSORS, "is float32 of shape"),
    "garbage tensors": (write(TENSORS, b"\x00garbage"), TENSORS, "cannot be read as safetensors"),
    "an rng state restore_state refuses": (
        edit_json(set_in("algo.rng", {"bit_generator": "nope"})),
        "",
        "VPG.restore_state refused the snapshot",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_snapshot_is_refused_naming_the_file_and_key_and_changes_nothing(
    saved: Path, tmp_path: Path, case: str
) -> None:
    tamper, file, phrase = CASES[case]
    directory = tmp_path / "snap"
    shutil.copytree(saved, directory)
    tamper(directory / "itr_0")

    trainer = Trainer(SnapshotConfig(tmp_path / "other", "none"), print_table=False)
    algo = VPG(ENV.env_spec(), hidden_sizes=(8,), seed=1)
    trainer.setup(algo, ENV, LocalSampler, seed=5)
    before_tensors, before_meta = algo.snapshot_state()
    before_tensors = {name: value.copy() for name, value in before_tensors.items()}
    try:
        with pytest.raises(SnapshotError) as caught:
            trainer.restore(directory)
        assert isinstance(caught.value, ConfigError)
        message = str(caught.value)
        assert str(directory / "itr_0" / file) in message, message
        assert phrase in message, message
        # Nothing changed: parameters, optimizer moments, counters, seed.
        after_tensors, after_meta = algo.snapshot_state()
        assert sorted(after_tensors) == sorted(before_tensors)
        for name, value in before_tensors.items():
            np.testing.assert_array_equal(after_tensors[name], value, err_msg=name)
        assert after_meta == before_meta
        assert trainer.total_env_steps == 0
        # The untouched snapshot still restores into the same trainer.
        trainer.restore(saved)
        assert trainer.total_env_steps > 0
    finally:
        trainer.close()
