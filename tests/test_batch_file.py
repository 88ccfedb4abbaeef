"""rlfleet.save_batch / load_batch and the env_spec JSON of every space kind."""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from rlfleet import EnvConfig, LocalSampler, load_batch, save_batch
from rlfleet.core.batch_file import space_from_json, space_to_json
from rlfleet.errors import ConfigError

SPACES = [
    gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32),
    gym.spaces.Box(np.array([0, -1]), np.array([1, np.inf]), dtype=np.float64),
    gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
    gym.spaces.Discrete(5, start=-2),
    gym.spaces.MultiDiscrete([3, 4]),
    gym.spaces.MultiBinary(6),
    gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(0, 1, (2,))}),
    gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.MultiBinary(3)]),
]


@pytest.mark.parametrize("space", SPACES, ids=lambda s: type(s).__name__)
def test_every_space_kind_survives_standard_json(space: gym.Space) -> None:
    text = json.dumps(space_to_json(space), allow_nan=False)  # strict JSON: no Infinity
    assert space_from_json(json.loads(text)) == space


def test_a_sampled_batch_round_trips(tmp_path: Path) -> None:
    with LocalSampler(EnvConfig("CartPole-v1"), n_workers=1, envs_per_worker=2, seed=1) as s:
        batch = s.obtain_episodes(3)
    path = tmp_path / "batch.npz"
    save_batch(path, batch)
    again = load_batch(path)
    assert again.env_spec == batch.env_spec
    for name in ("observations", "actions", "rewards", "step_types", "lengths"):
        np.testing.assert_array_equal(getattr(again, name), getattr(batch, name))
    assert set(again.episode_infos) == set(batch.episode_infos)


def test_another_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, x=np.zeros(2))
    with pytest.raises(ConfigError, match=r"not a rlfleet\.episode_batch\.npz/2 file"):
        load_batch(path)


def test_a_space_without_a_json_form_is_refused() -> None:
    with pytest.raises(ConfigError, match="Text spaces"):
        space_to_json(gym.spaces.Text(5))
