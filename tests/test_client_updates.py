"""agent_update / env_update arguments -> AgentChange / EnvChange (no processes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlfleet.client._learner_messages import agent_change_of, env_change_of
from rlfleet.client._restore import merged_agent
from rlfleet.client._updates import env_config_of, policy_spec_of
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, WireFormatError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, PolicySpec, RandomPolicy
from rlfleet.protocol.updates import EnvChange, PolicyChoice
from rlfleet.v1 import updates_pb2
from rlfleet.wire import encode_tensor_map

CARTPOLE = EnvConfig("CartPole-v1").env_spec()
PENDULUM = EnvConfig("Pendulum-v1").env_spec()


def test_params_dict_becomes_params_only() -> None:
    params = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.float32)}
    change = agent_change_of(params)
    assert change.policy is None
    assert change.params.keys() == params.keys()
    a = change.params["a"]
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    assert np.array_equal(a, params["a"])


def test_params_are_copied_when_given_and_checked_at_once() -> None:
    params = {"a": np.zeros(3, np.float32)}
    change = agent_change_of(params)
    params["a"][:] = 5  # the learner trains on
    np.testing.assert_array_equal(change.params["a"], [0, 0, 0])
    with pytest.raises(WireFormatError, match="cannot travel"):
        agent_change_of({"a": np.array([object()])})


@pytest.mark.parametrize(
    "update",
    [
        PolicySpec("mlp-categorical", {"hidden_sizes": [8]}),
        '{"name":"mlp-categorical","kwargs":{"hidden_sizes":[8]}}',
    ],
)
def test_spec_or_its_json_becomes_a_policy_spec(update: PolicySpec | str) -> None:
    change = agent_change_of(update)
    assert change.policy is not None and change.policy.name == "mlp-categorical"
    assert json.loads(change.policy.kwargs_json) == {"hidden_sizes": [8]}
    assert not change.params


def test_builtin_name_becomes_a_spec_with_no_kwargs() -> None:
    policy = agent_change_of("random").policy
    assert policy is not None and (policy.name, json.loads(policy.kwargs_json)) == ("random", {})


def test_spec_and_params_tuple_carries_both() -> None:
    change = agent_change_of(("mlp-gaussian", {"log_std": np.zeros(1, np.float32)}))
    assert change.policy is not None and change.policy.name == "mlp-gaussian"
    assert list(change.params) == ["log_std"]


def test_builtin_policy_instance_carries_its_spec_and_params() -> None:
    policy = MLPGaussianPolicy(PENDULUM, hidden_sizes=(4,), activation="relu", seed=3)
    change = agent_change_of(policy)
    assert change.policy is not None
    spec = PolicySpec(change.policy.name, json.loads(change.policy.kwargs_json))
    assert spec == PolicySpec("mlp-gaussian", {"hidden_sizes": [4], "activation": "relu"})
    params = change.params
    expected = policy.get_param_values()
    assert params.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(params[name], value)


def test_policy_spec_of_rebuilds_the_same_network() -> None:
    policy = MLPCategoricalPolicy(CARTPOLE, hidden_sizes=(5, 3), deterministic=True, seed=1)
    spec = policy_spec_of(policy)
    assert spec.kwargs == {"hidden_sizes": [5, 3], "activation": "tanh", "deterministic": True}
    assert policy_spec_of(RandomPolicy(CARTPOLE)) == PolicySpec("random")


def test_custom_policy_instances_cannot_be_named() -> None:
    class Mine(RandomPolicy):
        pass

    with pytest.raises(ConfigError, match=r"cannot name the class of a .*Mine.*PolicySpec\("):
        agent_change_of(Mine(CARTPOLE))


@pytest.mark.parametrize(
    ("update", "message"),
    [
        (3.5, "agent_update must be a params dict, .* got float"),
        (("random",), r"tuple must be \(policy spec, params dict\), got a tuple of 1 items"),
        ({1: np.zeros(1)}, "parameter names must be str"),
        ("not a policy", "neither a built-in policy"),
    ],
)
def test_bad_agent_updates_are_refused(update: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        agent_change_of(update)  # type: ignore[arg-type]


def test_messages_are_read_as_they_are() -> None:
    agent = updates_pb2.AgentUpdate(
        version=4,
        policy=updates_pb2.PolicySpec(name="random"),
        params=encode_tensor_map({"w": np.ones(2, np.float32)}),
        pickled_policy=b"pickle",
    )
    change = agent_change_of(agent)
    assert (change.version, change.policy, change.pickled_policy) == (
        0,  # the coordinator numbers versions
        PolicyChoice("random"),
        b"pickle",
    )
    np.testing.assert_array_equal(change.params["w"], [1, 1])
    env = updates_pb2.EnvUpdate(generation=3, env_id="CartPole-v1", pickled_env_factory=b"f")
    assert env_change_of(env) == EnvChange(env_id="CartPole-v1", pickled_env_factory=b"f")


def test_env_update_round_trips_through_the_change() -> None:
    config = EnvConfig("Pendulum-v1", {"g": 9.81}, max_episode_length=50)
    change = env_change_of(config)
    assert (change.env_id, json.loads(change.kwargs_json), change.max_episode_length) == (
        "Pendulum-v1",
        {"g": 9.81},
        50,
    )
    assert env_config_of(change) == config


def test_env_id_string_has_no_episode_limit_and_no_imports_travel() -> None:
    change = env_change_of("CartPole-v1")
    assert change.max_episode_length is None and json.loads(change.kwargs_json) == {}
    custom = env_change_of(EnvConfig("rlfleet/Counter-v0", imports=("rlfleet.envs.testing",)))
    assert custom.env_id == "rlfleet/Counter-v0"  # the workers' --import brings the module


def test_bad_env_updates_are_refused() -> None:
    with pytest.raises(ConfigError, match="env_update must be an EnvConfig or a gymnasium id"):
        env_change_of(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a JSON object"):
        env_config_of(EnvChange(env_id="CartPole-v1", kwargs_json="[1]"))


def test_pushed_state_merges_updates_as_the_coordinator_does() -> None:
    spec = agent_change_of(("mlp-categorical", {"a": np.zeros(2, np.float32)}))
    state = merged_agent(None, spec)
    state = merged_agent(state, agent_change_of({"b": np.ones(1, np.float32)}))
    state = merged_agent(state, agent_change_of({"a": np.full(2, 7, np.float32)}))
    assert state.policy == PolicyChoice("mlp-categorical", "{}")
    assert list(state.params) == ["a", "b"]  # replaced in place, new names appended
    np.testing.assert_array_equal(state.params["a"], [7, 7])
    # A new spec starts over from the parameters that come with it.
    fresh = merged_agent(state, agent_change_of("random"))
    assert fresh.policy == PolicyChoice("random", "{}") and not fresh.params
    # So does a pickled policy, which the coordinator runs instead of the spec.
    pickled = merged_agent(state, agent_change_of(updates_pb2.AgentUpdate(pickled_policy=b"p")))
    assert (pickled.policy, pickled.pickled_policy, pickled.params) == (None, b"p", {})
