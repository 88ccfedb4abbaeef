"""EnvConfig and make_env: JSON form, safety of ids, errors, env specs."""

from __future__ import annotations

import pickle
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the rlfleet/* test envs)
from rlfleet.core.env_spec import EnvSpec
from rlfleet.envs import EnvConfig, env_spec_of, make_env
from rlfleet.errors import ConfigError, EnvNotFoundError

CUSTOM_ID = "rlfleet_test/Custom-v0"


@pytest.fixture
def env_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module on sys.path that registers CUSTOM_ID when imported."""
    name = "rlfleet_test_custom_envs"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            f"""
            import gymnasium as gym
            gym.register(id={CUSTOM_ID!r}, entry_point="rlfleet.envs.testing:CounterEnv")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    gym.registry.pop(CUSTOM_ID, None)


def test_make_builds_registered_env_with_kwargs() -> None:
    env = EnvConfig("rlfleet/Counter-v0", {"length": 2}).make()
    env.reset(seed=0)
    assert env.step(0)[2] is False
    assert env.step(0)[2] is True
    env.close()


def test_config_is_a_picklable_env_factory() -> None:
    config = EnvConfig("CartPole-v1", {"render_mode": "rgb_array"}, max_episode_length=9)
    clone = pickle.loads(pickle.dumps(config))
    assert clone == config
    env = clone()
    assert env.spec is not None and env.spec.id == "CartPole-v1"
    env.close()


def test_render_mode_passes_through() -> None:
    env = make_env(EnvConfig("rlfleet/Counter-v0", {"render_mode": "rgb_array"}))
    env.reset()
    env.step(0)
    assert env.render_mode == "rgb_array"
    frame = env.render()
    assert isinstance(frame, np.ndarray)
    assert np.array_equal(frame, np.ones((4, 4, 3), dtype=np.uint8))
    env.close()


def test_max_episode_length_truncates() -> None:
    env = EnvConfig("rlfleet/Counter-v0", {"length": 5}, max_episode_length=2).make()
    env.reset()
    assert env.step(0)[2:4] == (False, False)
    assert env.step(0)[2:4] == (False, True)
    env.close()


def test_unknown_id_suggests_close_matches() -> None:
    with pytest.raises(EnvNotFoundError, match=r"'CartPol-v1'.*Did you mean 'CartPole-v1'"):
        make_env(EnvConfig("CartPol-v1"))


def test_unknown_id_is_a_config_error() -> None:
    assert issubclass(EnvNotFoundError, ConfigError)
    with pytest.raises(ConfigError, match="imported first"):
        make_env(EnvConfig("NoSuchThingAtAll-v7"))


def test_bad_kwargs_name_the_id_and_kwargs() -> None:
    with pytest.raises(ConfigError, match=r"'CartPole-v1' rejected kwargs \{'colour': 'red'\}"):
        make_env(EnvConfig("CartPole-v1", {"colour": "red"}))


def test_module_id_is_rejected_without_importing(env_module: str) -> None:
    with pytest.raises(ConfigError, match=rf"--import.*imports=\('{env_module}',\)"):
        make_env(EnvConfig(f"{env_module}:{CUSTOM_ID}"))
    assert env_module not in sys.modules
    assert CUSTOM_ID not in gym.registry


def test_module_id_allowed_when_asked(env_module: str) -> None:
    env = make_env(EnvConfig(f"{env_module}:{CUSTOM_ID}"), allow_module_ids=True)
    assert env_module in sys.modules
    env.close()


@pytest.mark.parametrize("where", ["config", "extra"])
def test_imports_register_custom_envs(env_module: str, where: str) -> None:
    if where == "config":
        env = EnvConfig(CUSTOM_ID, imports=(env_module,)).make()
    else:
        env = EnvConfig(CUSTOM_ID).make(extra_imports=[env_module])
    obs, _ = env.reset()
    assert obs.tolist() == [0.0]
    env.close()


def test_missing_import_names_the_module() -> None:
    config = EnvConfig("CartPole-v1", imports=("rlfleet_no_such_module",))
    with pytest.raises(ConfigError, match="could not import module 'rlfleet_no_such_module'"):
        config.make()


def test_module_raising_at_import_names_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "rlfleet_test_broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"'rlfleet_test_broken'.*RuntimeError: boom"):
        EnvConfig("CartPole-v1", imports=("rlfleet_test_broken",)).make()
    sys.modules.pop("rlfleet_test_broken", None)


def test_json_is_compact_and_sorted() -> None:
    config = EnvConfig("CartPole-v1", {"render_mode": "rgb_array"}, 50, ("a.b",))
    assert config.to_json() == (
        '{"id":"CartPole-v1","imports":["a.b"],'
        '"kwargs":{"render_mode":"rgb_array"},"max_episode_length":50}'
    )


def test_json_round_trip_keeps_types() -> None:
    config = EnvConfig("X-v0", {"n": 500, "x": 0.5, "shape": (2, 3), "sub": {"flag": True}})
    clone = EnvConfig.from_json(config.to_json())
    assert clone == config
    assert hash(clone) == hash(config)
    assert type(clone.kwargs["n"]) is int
    # Stored in JSON form up front, so a local config equals its wire copy.
    assert config.kwargs["shape"] == [2, 3]


def test_kwargs_are_copied() -> None:
    kwargs = {"length": 3}
    config = EnvConfig("rlfleet/Counter-v0", kwargs)
    kwargs["length"] = 4
    assert config.kwargs == {"length": 3}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"f": object()}, "JSON-serialisable"),
        ({"x": float("nan")}, "JSON-serialisable"),
        ({1: "a"}, "string keys"),
        ([("a", 1)], "must be a dict"),
    ],
)
def test_non_json_kwargs_are_rejected(kwargs: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EnvConfig("CartPole-v1", kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [0, -1, True, 2.0, "3"])
def test_bad_max_episode_length(length: object) -> None:
    with pytest.raises(ConfigError, match="max_episode_length"):
        EnvConfig("CartPole-v1", max_episode_length=length)  # type: ignore[arg-type]


def test_episode_limit_given_twice() -> None:
    with pytest.raises(ConfigError, match="given twice"):
        EnvConfig("CartPole-v1", {"max_episode_steps": 3}, max_episode_length=4)


@pytest.mark.parametrize("imports", ["mypkg.envs", ("not a module",), ("a..b",), (3,)])
def test_bad_imports(imports: object) -> None:
    with pytest.raises(ConfigError, match="imports"):
        EnvConfig("CartPole-v1", imports=imports)  # type: ignore[arg-type]


def test_bad_id() -> None:
    with pytest.raises(ConfigError, match="non-empty string"):
        EnvConfig("")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"kwargs": {}}', "needs an 'id'"),
        ('{"id": "CartPole-v1", "seed": 3}', r"unknown env config field\(s\) \['seed'\]"),
        ('{"id": "CartPole-v1", "max_episode_length": 5.0}', "max_episode_length"),
    ],
)
def test_from_json_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EnvConfig.from_json(text)


def test_env_spec_reads_spaces_and_limit() -> None:
    spec = EnvConfig("CartPole-v1").env_spec()
    assert spec == EnvSpec(
        gym.spaces.Box(
            np.array([-4.8, -np.inf, -0.41887903, -np.inf], dtype=np.float32),
            np.array([4.8, np.inf, 0.41887903, np.inf], dtype=np.float32),
        ),
        gym.spaces.Discrete(2),
        500,
    )
    assert EnvConfig("CartPole-v1", max_episode_length=50).env_spec().max_episode_length == 50


def test_env_spec_of_built_env() -> None:
    env = EnvConfig("rlfleet/Counter-v0", {"length": 3}).make()
    spec = env_spec_of(env, 7)
    assert spec.observation_space == gym.spaces.Box(0.0, 3.0, (1,), np.float32)
    assert spec.action_space == gym.spaces.Discrete(2)
    assert spec.max_episode_length == 7
    assert env_spec_of(env).max_episode_length is None
    env.close()
