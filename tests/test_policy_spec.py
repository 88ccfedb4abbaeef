"""PolicySpec, make_policy and default_policy_spec."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError
from rlfleet.policies import (
    BUILTIN_POLICIES,
    MLPCategoricalPolicy,
    MLPGaussianPolicy,
    Policy,
    PolicySpec,
    RandomPolicy,
    default_policy_spec,
    make_policy,
)

CARTPOLE = EnvSpec(Box(-np.inf, np.inf, (4,), np.float32), Discrete(2))
PENDULUM = EnvSpec(Box(-8, 8, (3,), np.float32), Box(-2, 2, (1,), np.float32))

CUSTOM_MODULE = """
import numpy as np
from rlfleet.policies import Policy


class ConstantPolicy(Policy):
    def __init__(self, env_spec, action=0, seed=None):
        super().__init__(env_spec, seed=seed)
        self.action = action

    def get_actions(self, observations, rngs=None):
        return np.full(len(observations), self.action), {}


class Holder:
    Inner = ConstantPolicy


def not_a_class():
    return None
"""


@pytest.fixture
def custom_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Writes a real module with a Policy subclass; returns its unique name."""
    name = f"rlfleet_test_policies_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(CUSTOM_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


# --------------------------------------------------------------- PolicySpec


def test_builtins_are_the_three_documented_policies() -> None:
    assert dict(BUILTIN_POLICIES) == {
        "random": RandomPolicy,
        "mlp-categorical": MLPCategoricalPolicy,
        "mlp-gaussian": MLPGaussianPolicy,
    }
    with pytest.raises(TypeError):
        BUILTIN_POLICIES["mine"] = RandomPolicy  # type: ignore[index]


def test_to_json_is_compact_and_round_trips() -> None:
    spec = PolicySpec("mlp-categorical", {"hidden_sizes": (64, 64), "activation": "relu"})
    text = spec.to_json()
    assert (
        text == '{"name":"mlp-categorical","kwargs":{"hidden_sizes":[64,64],"activation":"relu"}}'
    )
    assert PolicySpec.from_json(text) == spec
    assert PolicySpec.from_json(text.encode()) == spec
    assert hash(PolicySpec.from_json(text)) == hash(spec)


def test_kwargs_are_a_normalised_copy() -> None:
    mine = {"hidden_sizes": (8,), "nested": {"a": [1, (2, 3)]}}
    spec = PolicySpec("mlp-categorical", mine)
    mine["hidden_sizes"] = (99,)
    assert spec.kwargs == {"hidden_sizes": [8], "nested": {"a": [1, [2, 3]]}}
    assert PolicySpec("random").kwargs == {}


def test_integers_stay_integers_through_json() -> None:
    spec = PolicySpec.from_json(PolicySpec("pkg.mod:Cls", {"width": 500, "scale": 0.5}).to_json())
    assert spec.kwargs == {"width": 500, "scale": 0.5}
    assert type(spec.kwargs["width"]) is int


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_sizes": [np.int64(3)]}, r"kwargs\['hidden_sizes'\]\[0\] is a int64 .*int\(x\)"),
        ({"scale": float("nan")}, r"kwargs\['scale'\] is nan; JSON carries finite numbers only"),
        ({"scale": float("inf")}, "finite numbers only"),
        ({"sizes": {1, 2}}, r"kwargs\['sizes'\] is a set"),
        ({1: "a"}, "has key 1; JSON object keys must be str"),
        ({"outer": {2: "a"}}, r"kwargs\['outer'\] has key 2"),
        (["hidden_sizes"], "kwargs must be a mapping, got list"),
    ],
)
def test_kwargs_that_json_cannot_carry_are_config_errors(kwargs: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PolicySpec("mlp-categorical", kwargs)


def test_unknown_builtin_lists_the_builtins() -> None:
    with pytest.raises(
        ConfigError,
        match=r"'mlp' is neither a built-in policy .*random, mlp-categorical, mlp-gaussian",
    ):
        PolicySpec("mlp")


@pytest.mark.parametrize(
    "name", ["pkg.mod", "pkg.mod:", ":Cls", "pkg..mod:Cls", "1pkg:Cls", "pkg:Cls:X", "pkg:Cls.", ""]
)
def test_malformed_import_paths_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError, match=r"import path 'package\.module:Class'"):
        PolicySpec(name)


def test_well_formed_import_paths_are_accepted() -> None:
    for name in ("pkg:Cls", "pkg.sub.mod:Cls", "pkg.mod:Outer.Inner", "_p:_C"):
        assert not PolicySpec(name).is_builtin
    assert PolicySpec("random").is_builtin


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be an object"),
        ('{"kwargs": {}}', "must be an object"),
        ('{"name": 3}', "must be an object"),
        ('{"name": "random", "kwarg": {}}', r"unknown keys \['kwarg'\]"),
        ('{"name": "random", "kwargs": [1]}', "kwargs must be a mapping, got list"),
        ('{"name": "random", "kwargs": {"x": NaN}}', "finite numbers only"),
    ],
)
def test_bad_json_is_a_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PolicySpec.from_json(text)


def test_from_json_without_kwargs_means_no_kwargs() -> None:
    assert PolicySpec.from_json('{"name":"random"}') == PolicySpec("random")


def test_proto_fields_round_trip() -> None:
    spec = PolicySpec("mlp-gaussian", {"init_log_std": -1, "hidden_sizes": [8]})
    assert spec.kwargs_json() == '{"init_log_std":-1,"hidden_sizes":[8]}'
    assert PolicySpec.from_kwargs_json(spec.name, spec.kwargs_json()) == spec
    assert PolicySpec.from_kwargs_json("random", "") == PolicySpec("random")
    with pytest.raises(ConfigError, match="'random': kwargs_json is not valid JSON"):
        PolicySpec.from_kwargs_json("random", "{oops")
    with pytest.raises(ConfigError, match="kwargs must be a mapping, got list"):
        PolicySpec.from_kwargs_json("random", "[]")


# -------------------------------------------------------------- make_policy


def test_make_policy_accepts_a_spec_a_name_or_json_text() -> None:
    assert type(make_policy(PolicySpec("random"), CARTPOLE)) is RandomPolicy
    assert type(make_policy("mlp-gaussian", PENDULUM)) is MLPGaussianPolicy
    policy = make_policy(' {"name":"mlp-categorical","kwargs":{"hidden_sizes":[3]}}', CARTPOLE)
    assert type(policy) is MLPCategoricalPolicy
    assert policy.get_param_values()["layers.0.weight"].shape == (4, 3)
    with pytest.raises(ConfigError, match="must be a PolicySpec, a name or JSON text, got int"):
        make_policy(3, CARTPOLE)  # type: ignore[arg-type]


def test_builtin_kwargs_reach_the_constructor() -> None:
    policy = make_policy(
        PolicySpec("mlp-gaussian", {"hidden_sizes": [], "init_log_std": -2, "deterministic": True}),
        PENDULUM,
    )
    assert policy.deterministic
    np.testing.assert_array_equal(policy.get_param_values()["log_std"], [-2.0])


def test_seed_argument_seeds_builtins_and_overrides_the_kwargs_seed() -> None:
    from_spec = make_policy(PolicySpec("mlp-categorical", {"seed": 1}), CARTPOLE, seed=2)
    direct = MLPCategoricalPolicy(CARTPOLE, seed=2)
    spec_seed = make_policy(PolicySpec("mlp-categorical", {"seed": 1}), CARTPOLE)
    direct_1 = MLPCategoricalPolicy(CARTPOLE, seed=1)
    for a, b in ((from_spec, direct), (spec_seed, direct_1)):
        pa, pb = a.get_param_values(), b.get_param_values()
        assert all(np.array_equal(pa[k], pb[k]) for k in pa)
        assert a.rng.random() == b.rng.random()


def test_builtin_rejecting_kwargs_names_the_spec_and_the_type_error() -> None:
    with pytest.raises(ConfigError) as info:
        make_policy(PolicySpec("random", {"hidden_sizes": [3]}), CARTPOLE)
    text = str(info.value)
    assert '{"name":"random","kwargs":{"hidden_sizes":[3]}}' in text
    assert "RandomPolicy rejected its kwargs" in text
    assert "unexpected keyword argument 'hidden_sizes'" in text


def test_builtin_config_errors_pass_through() -> None:
    with pytest.raises(ConfigError, match="needs a float Box action space"):
        make_policy("mlp-gaussian", CARTPOLE)


def test_import_path_builds_the_class_with_env_spec_and_kwargs(custom_module: str) -> None:
    policy = make_policy(PolicySpec(f"{custom_module}:ConstantPolicy", {"action": 1}), CARTPOLE)
    assert type(policy).__name__ == "ConstantPolicy"
    assert policy.env_spec is CARTPOLE
    actions, _ = policy.get_actions(np.zeros((3, 4)))
    assert actions.tolist() == [1, 1, 1]
    nested = make_policy(f"{custom_module}:Holder.Inner", CARTPOLE)
    assert type(nested).__name__ == "ConstantPolicy"


def test_import_path_policy_is_reseeded_with_the_seed(custom_module: str) -> None:
    policy = make_policy(f"{custom_module}:ConstantPolicy", CARTPOLE, seed=7)
    assert policy.rng.random() == np.random.default_rng(7).random()


def test_import_path_can_name_a_builtin_class() -> None:
    policy = make_policy("rlfleet.policies.random:RandomPolicy", CARTPOLE, seed=0)
    assert type(policy) is RandomPolicy


@pytest.mark.parametrize(
    ("attribute", "message"),
    [
        ("Missing", "has no attribute 'Missing'"),
        ("not_a_class", "not a subclass of rlfleet.policies.Policy"),
        ("np", "not a subclass of rlfleet.policies.Policy"),
        ("Policy", r"is abstract \(it lacks \['get_actions'\]\)"),
    ],
)
def test_import_path_errors_name_the_path(custom_module: str, attribute: str, message: str) -> None:
    name = f"{custom_module}:{attribute}"
    with pytest.raises(ConfigError, match=f"policy '{name}'.*{message}"):
        make_policy(name, CARTPOLE)


def test_missing_module_and_failing_import_are_config_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(
        ConfigError, match=r"cannot import module 'no_such_pkg_xyz.mod' \(No module.*install"
    ):
        make_policy("no_such_pkg_xyz.mod:Cls", CARTPOLE)
    name = f"rlfleet_broken_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="raised RuntimeError: boom at import"):
        make_policy(f"{name}:Cls", CARTPOLE)


def test_class_rejecting_kwargs_names_the_spec(custom_module: str) -> None:
    spec = PolicySpec(f"{custom_module}:ConstantPolicy", {"bogus": 1})
    with pytest.raises(ConfigError, match=r"ConstantPolicy rejected its kwargs: .*'bogus'"):
        make_policy(spec, CARTPOLE)


def test_allowed_modules_are_checked_before_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, custom_module: str
) -> None:
    name = f"rlfleet_broken_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text("raise RuntimeError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=f"module '{name}' is not allowed here"):
        make_policy(f"{name}:Cls", CARTPOLE, allowed_modules=["mypkg"])
    assert name not in sys.modules
    # A package allows its submodules, not other names sharing its prefix.
    with pytest.raises(ConfigError, match="not allowed"):
        make_policy("mypkgx.mod:Cls", CARTPOLE, allowed_modules=["mypkg"])
    with pytest.raises(ConfigError, match=r"cannot import module 'mypkg\.mod'"):
        make_policy("mypkg.mod:Cls", CARTPOLE, allowed_modules=["mypkg"])
    policy = make_policy(
        f"{custom_module}:ConstantPolicy", CARTPOLE, allowed_modules=[custom_module]
    )
    assert isinstance(policy, Policy)
    # Built-ins are not imported, so they need no allowance.
    assert type(make_policy("random", CARTPOLE, allowed_modules=[])) is RandomPolicy


# ------------------------------------------------------- default_policy_spec


@pytest.mark.parametrize(
    ("env_id", "name"),
    [
        ("CartPole-v1", "mlp-categorical"),
        ("FrozenLake-v1", "mlp-categorical"),
        ("Pendulum-v1", "mlp-gaussian"),
    ],
)
def test_default_spec_fits_real_envs(env_id: str, name: str) -> None:
    env = gym.make(env_id)
    spec = EnvSpec.from_env(env)
    env.close()
    assert default_policy_spec(spec) == PolicySpec(name)
    make_policy(default_policy_spec(spec), spec, seed=0).get_actions(
        np.stack([spec.observation_space.sample() for _ in range(2)])
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            EnvSpec(Box(0, 1, (2,)), gym.spaces.MultiDiscrete([2, 2])),
            "no built-in MLP policy acts in",
        ),
        (EnvSpec(Box(0, 1, (2,)), Box(0, 3, (1,), np.int64)), "no built-in MLP policy acts in"),
        (EnvSpec(gym.spaces.Dict(a=Discrete(2)), Discrete(2)), "FlattenObservation"),
    ],
)
def test_default_spec_explains_when_no_builtin_fits(spec: EnvSpec, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        default_policy_spec(spec)
