"""agent_update / env_update arguments -> AgentUpdate / EnvUpdate protos (no processes)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlfleet.client._restore import merged_agent
from rlfleet.client._updates import (
    agent_update_proto,
    env_config_of,
    env_update_proto,
    policy_spec_of,
)
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, PolicySpec, RandomPolicy
from rlfleet.v1 import updates_pb2
from rlfleet.wire import decode_tensor_map

CARTPOLE = EnvConfig("CartPole-v1").env_spec()
PENDULUM = EnvConfig("Pendulum-v1").env_spec()


def test_params_dict_becomes_params_only() -> None:
    params = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(2, np.float32)}
    proto = agent_update_proto(params)
    assert not proto.HasField("policy")
    decoded = decode_tensor_map(proto.params)
    assert decoded.keys() == params.keys()
    a = decoded["a"]
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    assert np.array_equal(a, params["a"])


@pytest.mark.parametrize(
    "update",
    [
        PolicySpec("mlp-categorical", {"hidden_sizes": [8]}),
        '{"name":"mlp-categorical","kwargs":{"hidden_sizes":[8]}}',
    ],
)
def test_spec_or_its_json_becomes_a_policy_spec(update: PolicySpec | str) -> None:
    proto = agent_update_proto(update)
    assert proto.policy.name == "mlp-categorical"
    assert json.loads(proto.policy.kwargs_json) == {"hidden_sizes": [8]}
    assert not proto.params.entries


def test_builtin_name_becomes_a_spec_with_no_kwargs() -> None:
    proto = agent_update_proto("random")
    assert (proto.policy.name, json.loads(proto.policy.kwargs_json)) == ("random", {})


def test_spec_and_params_tuple_carries_both() -> None:
    proto = agent_update_proto(("mlp-gaussian", {"log_std": np.zeros(1, np.float32)}))
    assert proto.policy.name == "mlp-gaussian"
    assert list(decode_tensor_map(proto.params)) == ["log_std"]


def test_builtin_policy_instance_carries_its_spec_and_params() -> None:
    policy = MLPGaussianPolicy(PENDULUM, hidden_sizes=(4,), activation="relu", seed=3)
    proto = agent_update_proto(policy)
    spec = PolicySpec(proto.policy.name, json.loads(proto.policy.kwargs_json))
    assert spec == PolicySpec("mlp-gaussian", {"hidden_sizes": [4], "activation": "relu"})
    params = decode_tensor_map(proto.params)
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
        agent_update_proto(Mine(CARTPOLE))


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
        agent_update_proto(update)  # type: ignore[arg-type]


def test_protos_pass_through_unchanged() -> None:
    agent = updates_pb2.AgentUpdate(policy=updates_pb2.PolicySpec(name="random"))
    env = updates_pb2.EnvUpdate(env_id="CartPole-v1")
    assert agent_update_proto(agent) is agent
    assert env_update_proto(env) is env


def test_env_update_round_trips_through_the_proto() -> None:
    config = EnvConfig("Pendulum-v1", {"g": 9.81}, max_episode_length=50)
    proto = env_update_proto(config)
    assert (proto.env_id, json.loads(proto.kwargs_json), proto.max_episode_length) == (
        "Pendulum-v1",
        {"g": 9.81},
        50,
    )
    assert env_config_of(proto) == config


def test_env_id_string_has_no_episode_limit_and_no_imports_travel() -> None:
    proto = env_update_proto("CartPole-v1")
    assert not proto.HasField("max_episode_length") and json.loads(proto.kwargs_json) == {}
    custom = env_update_proto(EnvConfig("rlfleet/Counter-v0", imports=("rlfleet.envs.testing",)))
    assert custom.env_id == "rlfleet/Counter-v0"  # the workers' --import brings the module


def test_bad_env_updates_are_refused() -> None:
    with pytest.raises(ConfigError, match="env_update must be an EnvConfig or a gymnasium id"):
        env_update_proto(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be a JSON object"):
        env_config_of(updates_pb2.EnvUpdate(env_id="CartPole-v1", kwargs_json="[1]"))


def test_pushed_state_merges_updates_as_the_coordinator_does() -> None:
    spec = agent_update_proto(("mlp-categorical", {"a": np.zeros(2, np.float32)}))
    state = merged_agent(None, spec)
    state = merged_agent(state, agent_update_proto({"b": np.ones(1, np.float32)}))
    state = merged_agent(state, agent_update_proto({"a": np.full(2, 7, np.float32)}))
    assert state.policy.name == "mlp-categorical"
    params = decode_tensor_map(state.params)
    assert list(params) == ["a", "b"]  # replaced in place, new names appended
    np.testing.assert_array_equal(params["a"], [7, 7])
    # A new spec starts over from the parameters that come with it.
    fresh = merged_agent(state, agent_update_proto("random"))
    assert fresh.policy.name == "random" and not fresh.params.entries
