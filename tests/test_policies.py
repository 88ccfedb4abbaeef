"""Built-in policies: math against hand computation, per-row determinism,
parameters, errors, and real gymnasium envs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies import (
    MLPCategoricalPolicy,
    MLPGaussianPolicy,
    RandomPolicy,
    default_policy_spec,
    make_policy,
)

HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def spec_of(obs_space: gym.Space, action_space: gym.Space) -> EnvSpec:
    return EnvSpec(obs_space, action_space)


def gym_spec(env_id: str) -> EnvSpec:
    env = gym.make(env_id)
    try:
        return EnvSpec.from_env(env)
    finally:
        env.close()


def rngs_for(seeds: Iterable[int]) -> list[np.random.Generator]:
    return [np.random.default_rng(seed) for seed in seeds]


def box(n: int) -> Box:
    return Box(-np.inf, np.inf, (n,), np.float32)


def f32(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


# A 4 -> 2 (relu) -> 3 categorical network with integer weights, so every
# value below is computed by hand (see test_categorical_hand_computed).
HAND_PARAMS = {
    "layers.0.weight": f32([[1, 0], [0, 1], [1, 1], [0, 2]]),
    "layers.0.bias": f32([0.5, -3]),
    "layers.1.weight": f32([[2, 0, -2], [1, 1, 1]]),
    "layers.1.bias": f32([0, 0, 1]),
}
HAND_OBS = f32([[1, 2, -1, 0.5]])


def hand_policy(**kwargs: Any) -> MLPCategoricalPolicy:
    policy = MLPCategoricalPolicy(
        spec_of(box(4), Discrete(3)), hidden_sizes=(2,), activation="relu", **kwargs
    )
    policy.set_param_values(HAND_PARAMS)
    return policy


# ---------------------------------------------------------------- categorical


def test_categorical_hand_computed() -> None:
    # x @ W0 = [1 - 1, 2 - 1 + 1] = [0, 2]; + b0 = [0.5, -1]; relu -> [0.5, 0]
    # [0.5, 0] @ W1 = [1, 0, -1]; + b1 = [1, 0, 0]
    policy = hand_policy(deterministic=True)
    actions, infos = policy.get_actions(HAND_OBS)
    np.testing.assert_array_equal(infos["logits"], f32([[1, 0, 0]]))
    assert actions.tolist() == [0]
    assert infos["log_prob"][0] == pytest.approx(1 - math.log(math.e + 2), rel=1e-6)
    assert infos["log_prob"].dtype == np.float32
    assert actions.dtype == np.int64


def test_categorical_tanh_forward_matches_numpy_formula() -> None:
    spec = spec_of(box(5), Discrete(4))
    policy = MLPCategoricalPolicy(spec, hidden_sizes=(8, 6), seed=1)
    rng = np.random.default_rng(0)
    params = {
        name: rng.standard_normal(value.shape).astype(np.float32)
        for name, value in policy.get_param_values().items()
    }
    policy.set_param_values(params)
    obs = rng.standard_normal((7, 5)).astype(np.float32)
    _, infos = policy.get_actions(obs, rngs_for(range(7)))
    h = np.tanh(obs @ params["layers.0.weight"] + params["layers.0.bias"])
    h = np.tanh(h @ params["layers.1.weight"] + params["layers.1.bias"])
    logits = h @ params["layers.2.weight"] + params["layers.2.bias"]
    np.testing.assert_allclose(infos["logits"], logits, rtol=1e-5, atol=1e-6)


def test_categorical_sampling_is_the_documented_inverse_cdf() -> None:
    # Equal logits: action 0 iff u = rng.random() < 0.5, with u drawn from
    # the row's own generator and nothing else.
    policy = MLPCategoricalPolicy(spec_of(box(1), Discrete(2)), hidden_sizes=())
    policy.set_param_values({"layers.0.weight": np.zeros((1, 2)), "layers.0.bias": np.zeros(2)})
    seeds = range(200)
    actions, infos = policy.get_actions(np.zeros((200, 1)), rngs_for(seeds))
    expected = [0 if np.random.default_rng(s).random() < 0.5 else 1 for s in seeds]
    assert actions.tolist() == expected
    assert 50 < sum(expected) < 150  # both branches are exercised
    np.testing.assert_allclose(infos["log_prob"], math.log(0.5), rtol=1e-6)


def test_categorical_log_prob_is_log_softmax_of_the_sampled_action() -> None:
    spec = gym_spec("Acrobot-v1")
    policy = MLPCategoricalPolicy(spec, seed=3)
    rng = np.random.default_rng(1)
    params = {k: 3 * rng.standard_normal(v.shape) for k, v in policy.get_param_values().items()}
    policy.set_param_values(params)
    obs = rng.standard_normal((64, 6)).astype(np.float32)
    actions, infos = policy.get_actions(obs, rngs_for(range(64)))
    logits = infos["logits"].astype(np.float64)
    log_softmax = logits - logits.max(1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(1, keepdims=True))
    np.testing.assert_allclose(
        infos["log_prob"], log_softmax[np.arange(64), actions], rtol=1e-5, atol=1e-6
    )
    assert len(set(actions.tolist())) == 3


def test_zero_probability_actions_are_never_sampled() -> None:
    policy = MLPCategoricalPolicy(spec_of(box(1), Discrete(3)), hidden_sizes=())
    policy.set_param_values(
        {"layers.0.weight": np.zeros((1, 3)), "layers.0.bias": [-1000.0, 0.0, -1000.0]}
    )
    actions, infos = policy.get_actions(np.zeros((100, 1)), rngs_for(range(100)))
    assert set(actions.tolist()) == {1}
    np.testing.assert_array_equal(infos["log_prob"], np.zeros(100, np.float32))


def test_cdf_rounding_past_the_end_picks_the_last_possible_action() -> None:
    # logits = obs: an identity layer.
    policy = MLPCategoricalPolicy(spec_of(box(3), Discrete(3)), hidden_sizes=())
    policy.set_param_values({"layers.0.weight": np.eye(3), "layers.0.bias": np.zeros(3)})
    logits = f32([[0, 0, -1000], [0, -1000, -1000]])
    # No c[i] > t = u * Z needs t >= Z: random() never returns 1.0, hence
    # draws of 1.0 given directly (a NaN draw takes the same path).
    for top in (1.0, np.nan):
        actions, infos = policy.get_actions_from_draws(logits, np.full((2, 1), top))
        assert actions.tolist() == [1, 0]
        np.testing.assert_allclose(infos["log_prob"], [math.log(0.5), 0.0], atol=1e-7)
    # A long batch: every row takes the same path.
    actions, _ = policy.get_actions_from_draws(np.repeat(logits, 20, axis=0), np.ones((40, 1)))
    assert actions.tolist() == [1] * 20 + [0] * 20


def test_categorical_deterministic_takes_first_argmax_and_draws_nothing() -> None:
    policy = MLPCategoricalPolicy(spec_of(box(1), Discrete(3)), hidden_sizes=(), deterministic=True)
    policy.set_param_values({"layers.0.weight": np.zeros((1, 3)), "layers.0.bias": [1.0, 3.0, 3.0]})
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    actions, infos = policy.get_actions(np.zeros((2, 1)), [rng, rng])
    assert actions.tolist() == [1, 1]
    assert rng.bit_generator.state == state
    expected = 3 - math.log(math.exp(1) + 2 * math.exp(3))
    np.testing.assert_allclose(infos["log_prob"], [expected, expected], rtol=1e-6)


def test_discrete_start_offsets_actions() -> None:
    policy = MLPCategoricalPolicy(spec_of(box(1), Discrete(3, start=-1)), hidden_sizes=())
    policy.set_param_values({"layers.0.weight": np.zeros((1, 3)), "layers.0.bias": [0.0, 0.0, 9.0]})
    policy.deterministic = True
    assert policy.get_actions(np.zeros((1, 1)))[0].tolist() == [1]
    policy.deterministic = False
    actions, _ = policy.get_actions(np.zeros((300, 1)), rngs_for(range(300)))
    assert set(actions.tolist()) <= {-1, 0, 1}
    assert 1 in actions


# ------------------------------------------------------------------ gaussian


def linear_gaussian(obs_dim: int, action_space: Box, **kwargs: Any) -> MLPGaussianPolicy:
    return MLPGaussianPolicy(spec_of(box(obs_dim), action_space), hidden_sizes=(), **kwargs)


def test_gaussian_hand_computed_mean_and_log_prob() -> None:
    policy = linear_gaussian(2, Box(-1, 1, (2,)), deterministic=True)
    policy.set_param_values(
        {
            "layers.0.weight": np.eye(2),
            "layers.0.bias": [0.5, -1.0],
            "log_std": [math.log(2.0), 0.0],
        }
    )
    actions, infos = policy.get_actions(f32([[1, 2]]))
    np.testing.assert_array_equal(actions, f32([[1.5, 1.0]]))  # not clipped to [-1, 1]
    np.testing.assert_array_equal(infos["mean"], f32([[1.5, 1.0]]))
    np.testing.assert_array_equal(infos["log_std"], f32([[math.log(2.0), 0.0]]))
    assert infos["log_prob"][0] == pytest.approx(-math.log(2.0) - 2 * HALF_LOG_2PI, rel=1e-6)


def test_gaussian_sample_is_mean_plus_std_times_row_normal_draws() -> None:
    policy = linear_gaussian(2, Box(-1, 1, (3,)))
    params = {
        "layers.0.weight": f32([[1, 0, 2], [0, 1, -1]]),
        "layers.0.bias": f32([0, 1, 0]),
        "log_std": f32([-1, 0, 0.5]),
    }
    policy.set_param_values(params)
    obs = f32([[1, 2], [-1, 0.5], [0, 0]])
    seeds = [11, 12, 13]
    actions, infos = policy.get_actions(obs, rngs_for(seeds))
    mean = obs @ params["layers.0.weight"] + params["layers.0.bias"]
    std = np.exp(params["log_std"])
    eps = np.stack([np.random.default_rng(s).standard_normal(3) for s in seeds])
    np.testing.assert_allclose(actions, mean + std * eps, rtol=1e-6, atol=1e-6)
    z = (actions - mean) / std
    log_prob = np.sum(-0.5 * z**2 - params["log_std"] - HALF_LOG_2PI, axis=1)
    np.testing.assert_allclose(infos["log_prob"], log_prob, rtol=1e-5)
    np.testing.assert_array_equal(infos["mean"], mean)
    assert actions.dtype == infos["log_prob"].dtype == np.float32


def test_gaussian_multi_dimensional_actions_keep_their_shape() -> None:
    space = Box(-1, 1, (2, 3), np.float64)
    policy = linear_gaussian(4, space, init_log_std=-0.5, seed=0)
    assert policy.get_param_values()["log_std"].shape == (6,)
    actions, infos = policy.get_actions(np.ones((5, 4)), rngs_for(range(5)))
    assert actions.shape == infos["mean"].shape == infos["log_std"].shape == (5, 2, 3)
    assert actions.dtype == np.float64
    np.testing.assert_array_equal(infos["log_std"], np.full((5, 2, 3), -0.5, np.float32))


def test_gaussian_deterministic_draws_nothing() -> None:
    policy = make_policy("mlp-gaussian", gym_spec("Pendulum-v1"), seed=2)
    policy.deterministic = True
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    actions, infos = policy.get_actions(np.ones((1, 3)), [rng])
    assert rng.bit_generator.state == state
    np.testing.assert_array_equal(actions, infos["mean"])


def test_non_finite_network_output_is_a_policy_error_naming_the_row() -> None:
    policy = make_policy("mlp-gaussian", gym_spec("Pendulum-v1"), seed=0)
    obs = np.zeros((3, 3), np.float32)
    obs[2, 1] = np.nan
    with pytest.raises(PolicyError, match="action means of row 2 are not finite"):
        policy.get_actions(obs)


# ------------------------------------------------- determinism across batches


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1", "Acrobot-v1"])
@pytest.mark.parametrize("kind", ["default", "random"])
def test_a_row_gets_the_same_bits_alone_or_anywhere_in_a_batch(env_id: str, kind: str) -> None:
    spec = gym_spec(env_id)
    policy = make_policy(default_policy_spec(spec) if kind == "default" else "random", spec, seed=7)
    spec.observation_space.seed(0)
    obs = np.stack([spec.observation_space.sample() for _ in range(8)])
    seeds = [100 + i for i in range(8)]
    permutation = [3, 7, 0, 5, 1, 6, 2, 4]

    def steps(
        rows: np.ndarray, row_seeds: list[int], n_steps: int = 3
    ) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        rngs = rngs_for(row_seeds)
        return [policy.get_actions(rows, rngs) for _ in range(n_steps)]

    batched = steps(obs, seeds)
    shuffled = steps(obs[permutation], [seeds[i] for i in permutation])
    for row in range(8):
        alone = steps(obs[row : row + 1], [seeds[row]])
        position = permutation.index(row)
        for step in range(3):
            for result, index in ((batched[step], row), (shuffled[step], position)):
                actions, infos = result
                assert actions[index].tobytes() == alone[step][0][0].tobytes()
                assert infos.keys() == alone[step][1].keys()
                for key, value in infos.items():
                    assert value[index].tobytes() == alone[step][1][key][0].tobytes(), key


def test_without_rngs_every_row_draws_from_the_policy_generator_in_order() -> None:
    spec = gym_spec("CartPole-v1")
    obs = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    own = make_policy("mlp-categorical", spec, seed=4)
    explicit = make_policy("mlp-categorical", spec, seed=4)
    shared = np.random.default_rng(4)
    for _ in range(3):
        np.testing.assert_array_equal(
            own.get_actions(obs)[0], explicit.get_actions(obs, [shared] * 6)[0]
        )


def test_get_action_is_row_zero_of_a_batch_of_one() -> None:
    spec = gym_spec("Pendulum-v1")
    policy = make_policy("mlp-gaussian", spec, seed=9)
    twin = make_policy("mlp-gaussian", spec, seed=9)
    obs = np.array([0.5, -0.5, 1.0], np.float32)
    action, infos = policy.get_action(obs)
    actions, batch_infos = twin.get_actions(obs[None])
    assert action.shape == (1,)
    np.testing.assert_array_equal(action, actions[0])
    assert infos["log_prob"] == batch_infos["log_prob"][0]


def test_reseeding_restarts_the_policy_generator() -> None:
    policy = make_policy("random", gym_spec("CartPole-v1"), seed=1)
    obs = np.zeros((20, 4), np.float32)
    first = policy.get_actions(obs)[0]
    policy.seed(1)
    np.testing.assert_array_equal(policy.get_actions(obs)[0], first)


# ------------------------------------------------------------- observations


def test_discrete_observations_are_one_hot() -> None:
    spec = gym_spec("FrozenLake-v1")
    policy = MLPCategoricalPolicy(spec, hidden_sizes=())
    weight = np.arange(64, dtype=np.float32).reshape(16, 4)
    policy.set_param_values({"layers.0.weight": weight, "layers.0.bias": np.zeros(4)})
    obs = np.array([0, 5, 15, 5])
    _, infos = policy.get_actions(obs)
    np.testing.assert_array_equal(infos["logits"], weight[obs])


def test_discrete_observations_with_start_and_errors() -> None:
    policy = MLPCategoricalPolicy(spec_of(Discrete(3, start=10), Discrete(2)), hidden_sizes=())
    weight = f32([[1, 0], [2, 0], [3, 0]])
    policy.set_param_values({"layers.0.weight": weight, "layers.0.bias": np.zeros(2)})
    _, infos = policy.get_actions(np.array([12, 10]))
    np.testing.assert_array_equal(infos["logits"][:, 0], [3, 1])
    with pytest.raises(
        PolicyError, match=r"observation row 1 \(13\) is outside Discrete\(3, start=10\)"
    ):
        policy.get_actions(np.array([10, 13]))
    with pytest.raises(PolicyError, match="must be integers, got dtype float64"):
        policy.get_actions(np.array([10.0, 11.0]))


def test_multi_discrete_observations_are_concatenated_one_hots() -> None:
    space = gym.spaces.MultiDiscrete([2, 3], start=[0, 1])
    policy = MLPCategoricalPolicy(spec_of(space, Discrete(5)), hidden_sizes=())
    policy.set_param_values({"layers.0.weight": np.eye(5), "layers.0.bias": np.zeros(5)})
    _, infos = policy.get_actions(np.array([[1, 3], [0, 1]]))
    np.testing.assert_array_equal(infos["logits"], f32([[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]]))
    with pytest.raises(PolicyError, match="observation row 0"):
        policy.get_actions(np.array([[0, 0]]))  # 0 < start 1


def test_box_and_multi_binary_observations_are_flattened_in_c_order() -> None:
    for space, obs in (
        (Box(0, 255, (2, 3), np.uint8), np.arange(6, dtype=np.uint8).reshape(1, 2, 3)),
        (gym.spaces.MultiBinary([2, 3]), np.array([[[0, 1, 0], [1, 1, 0]]], np.int8)),
    ):
        policy = MLPCategoricalPolicy(spec_of(space, Discrete(6)), hidden_sizes=())
        policy.set_param_values({"layers.0.weight": np.eye(6), "layers.0.bias": np.zeros(6)})
        _, infos = policy.get_actions(obs)
        np.testing.assert_array_equal(infos["logits"], obs.reshape(1, 6).astype(np.float32))


def test_wrong_observation_shape_is_a_policy_error_with_expected_and_actual() -> None:
    policy = make_policy("mlp-categorical", gym_spec("CartPole-v1"), seed=0)
    with pytest.raises(PolicyError, match=r"shape \(N, 4\).*got \(8, 3\)"):
        policy.get_actions(np.zeros((8, 3)))
    with pytest.raises(PolicyError, match="looks like one observation: use get_action"):
        policy.get_actions(np.zeros(4))


def test_wrong_number_of_generators_is_a_policy_error() -> None:
    policy = make_policy("mlp-categorical", gym_spec("CartPole-v1"), seed=0)
    with pytest.raises(PolicyError, match="got 2 generators for 3 observations"):
        policy.get_actions(np.zeros((3, 4)), rngs_for([1, 2]))


def test_empty_batch_gives_empty_actions() -> None:
    policy = make_policy("mlp-gaussian", gym_spec("Pendulum-v1"), seed=0)
    actions, infos = policy.get_actions(np.zeros((0, 3)), [])
    assert actions.shape == (0, 1)
    assert infos["log_prob"].shape == (0,)


# --------------------------------------------------------------- parameters


def test_parameter_names_shapes_and_dtype() -> None:
    categorical_params = make_policy("mlp-categorical", gym_spec("CartPole-v1")).get_param_values()
    assert {k: v.shape for k, v in categorical_params.items()} == {
        "layers.0.weight": (4, 32),
        "layers.0.bias": (32,),
        "layers.1.weight": (32, 32),
        "layers.1.bias": (32,),
        "layers.2.weight": (32, 2),
        "layers.2.bias": (2,),
    }
    gaussian = MLPGaussianPolicy(gym_spec("Pendulum-v1"), hidden_sizes=(16,), init_log_std=-1.0)
    params = gaussian.get_param_values()
    assert list(params) == [
        "layers.0.weight",
        "layers.0.bias",
        "layers.1.weight",
        "layers.1.bias",
        "log_std",
    ]
    assert params["layers.1.weight"].shape == (16, 1)
    np.testing.assert_array_equal(params["log_std"], f32([-1.0]))
    assert all(v.dtype == np.float32 for v in [*params.values(), *categorical_params.values()])


def test_initialisation_is_the_documented_scaled_normal() -> None:
    spec = gym_spec("CartPole-v1")
    params = MLPCategoricalPolicy(
        spec, hidden_sizes=(5,), activation="relu", seed=42
    ).get_param_values()
    rng = np.random.default_rng(np.random.SeedSequence(42).spawn(1)[0])
    w0 = (rng.standard_normal((4, 5)) * math.sqrt(2.0) / math.sqrt(4)).astype(np.float32)
    w1 = (rng.standard_normal((5, 2)) * 0.01 / math.sqrt(5)).astype(np.float32)
    np.testing.assert_array_equal(params["layers.0.weight"], w0)
    np.testing.assert_array_equal(params["layers.1.weight"], w1)
    np.testing.assert_array_equal(params["layers.0.bias"], np.zeros(5, np.float32))
    np.testing.assert_array_equal(params["layers.1.bias"], np.zeros(2, np.float32))


def test_initialisation_depends_on_the_seed_only() -> None:
    spec = gym_spec("CartPole-v1")
    a, b, c = (MLPCategoricalPolicy(spec, seed=s).get_param_values() for s in (1, 1, 2))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["layers.0.weight"], c["layers.0.weight"])


def test_get_returns_copies_and_set_keeps_none_of_the_callers_arrays() -> None:
    policy = hand_policy()
    got = policy.get_param_values()
    got["layers.0.bias"][:] = 99
    mine = {k: v.astype(np.float64) for k, v in HAND_PARAMS.items()}
    policy.set_param_values(mine)
    mine["layers.0.bias"][:] = 99
    after = policy.get_param_values()
    np.testing.assert_array_equal(after["layers.0.bias"], HAND_PARAMS["layers.0.bias"])


def test_set_then_get_round_trips_as_float32() -> None:
    policy = make_policy("mlp-gaussian", gym_spec("Pendulum-v1"), seed=0)
    rng = np.random.default_rng(3)
    new: dict[str, np.ndarray] = {
        k: rng.standard_normal(v.shape) for k, v in policy.get_param_values().items()
    }
    new["layers.0.bias"] = np.arange(32)  # ints are accepted and cast
    policy.set_param_values(new)
    got = policy.get_param_values()
    assert got.keys() == new.keys()
    for name, value in new.items():
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], value.astype(np.float32))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.pop("layers.1.bias"), r"missing parameters \['layers.1.bias'\]"),
        (lambda p: p.update(extra=np.zeros(1)), r"unexpected parameters \['extra'\]"),
        (
            lambda p: p.update({"layers.0.weight": np.zeros((2, 4))}),
            r"'layers.0.weight' must have shape \(4, 2\), got \(2, 4\)",
        ),
        (
            lambda p: p.update({"layers.0.bias": [0.0, np.nan]}),
            r"'layers.0.bias' has a non-finite .* index \(1,\)",
        ),
        (lambda p: p.update({"layers.0.bias": [np.inf, 0.0]}), "'layers.0.bias' has a non-finite"),
        (lambda p: p.update({"layers.0.bias": [1e39, 0.0]}), "within float32 range"),
        (lambda p: p.update({"layers.0.bias": ["a", "b"]}), "must hold real numbers"),
        (lambda p: p.update({"layers.0.bias": [True, False]}), "got dtype bool"),
        (lambda p: p.update({"layers.0.bias": [1j, 0]}), "got dtype complex128"),
        (lambda p: p.update({"layers.0.bias": [[1.0], [1.0, 2.0]]}), "not an array of numbers"),
    ],
)
def test_bad_parameters_are_rejected_by_name_and_nothing_changes(
    change: Callable[[dict[str, np.ndarray]], object], message: str
) -> None:
    policy = hand_policy()
    before = policy.get_param_values()
    # Every other value is new and valid: a partial update would show.
    params = {k: v + 1 for k, v in HAND_PARAMS.items()}
    change(params)
    with pytest.raises(PolicyError, match=message):
        policy.set_param_values(params)
    after = policy.get_param_values()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_parameters_must_be_a_mapping() -> None:
    with pytest.raises(PolicyError, match="takes a mapping name -> array, got list"):
        hand_policy().set_param_values([np.zeros(2)])  # type: ignore[arg-type]


# --------------------------------------------------------- configuration errors


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MLPCategoricalPolicy(gym_spec("Pendulum-v1")), "needs a Discrete action space"),
        (lambda: MLPGaussianPolicy(gym_spec("CartPole-v1")), "needs a float Box action space"),
        (
            lambda: MLPGaussianPolicy(spec_of(box(2), Box(0, 3, (1,), np.int64))),
            "needs a float Box action space",
        ),
        (
            lambda: MLPCategoricalPolicy(spec_of(gym.spaces.Dict(a=box(1)), Discrete(2))),
            "FlattenObservation",
        ),
        (
            lambda: MLPCategoricalPolicy(gym_spec("CartPole-v1"), hidden_sizes="32"),  # type: ignore[arg-type]
            "hidden_sizes must be a list",
        ),
        (
            lambda: MLPCategoricalPolicy(gym_spec("CartPole-v1"), hidden_sizes=[8, 0]),
            "positive ints",
        ),
        (
            lambda: MLPCategoricalPolicy(gym_spec("CartPole-v1"), hidden_sizes=[1.5]),  # type: ignore[list-item]
            "positive ints",
        ),
        (
            lambda: MLPCategoricalPolicy(gym_spec("CartPole-v1"), activation="sigmoid"),
            r"activation must be one of \['identity', 'relu', 'tanh'\], got 'sigmoid'",
        ),
        (
            lambda: MLPGaussianPolicy(gym_spec("Pendulum-v1"), init_log_std=float("nan")),
            "init_log_std must be a finite number",
        ),
        (
            lambda: MLPGaussianPolicy(gym_spec("Pendulum-v1"), init_log_std=True),
            "init_log_std must be a finite number",
        ),
        (
            lambda: MLPGaussianPolicy(gym_spec("Pendulum-v1"), deterministic="yes"),  # type: ignore[arg-type]
            "deterministic must be true or false, got 'yes'",
        ),
        (
            lambda: RandomPolicy(spec_of(box(1), gym.spaces.Tuple([Discrete(2)]))),
            "RandomPolicy draws Box, Discrete",
        ),
    ],
)
def test_bad_configuration_is_a_config_error(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


@pytest.mark.parametrize("activation", ["tanh", "relu", "identity"])
def test_every_activation_runs(activation: str) -> None:
    policy = MLPCategoricalPolicy(gym_spec("CartPole-v1"), activation=activation, seed=0)
    actions, _ = policy.get_actions(np.ones((3, 4)))
    assert actions.shape == (3,)


def test_relu_and_identity_hidden_layers_match_the_formula() -> None:
    obs = f32([[1, -2]])
    w0, w1 = f32([[1, -1], [1, 1]]), f32([[1], [1]])
    expected = {"relu": 0.0 + 0.0, "identity": -1.0 + -3.0}  # x @ w0 = [-1, -3]
    for activation, logit in expected.items():
        policy = MLPCategoricalPolicy(
            spec_of(box(2), Discrete(1)), hidden_sizes=(2,), activation=activation
        )
        policy.set_param_values(
            {
                "layers.0.weight": w0,
                "layers.0.bias": np.zeros(2),
                "layers.1.weight": w1,
                "layers.1.bias": np.zeros(1),
            }
        )
        assert policy.get_actions(obs)[1]["logits"].tolist() == [[logit]]


# ------------------------------------------------------------- random policy


def random_actions(
    space: gym.Space, n: int, seed0: int = 0
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    policy = RandomPolicy(spec_of(box(1), space))
    return policy.get_actions(np.zeros((n, 1)), rngs_for(range(seed0, seed0 + n)))


def test_random_discrete_is_start_plus_one_integer_draw() -> None:
    actions, infos = random_actions(Discrete(5, start=3), 50)
    assert infos == {}
    assert actions.tolist() == [3 + np.random.default_rng(s).integers(5) for s in range(50)]
    assert set(actions.tolist()) == {3, 4, 5, 6, 7}


def test_random_box_stays_in_bounds_by_interval_type() -> None:
    low = np.array([-1.0, 0.0, -np.inf, -np.inf], np.float32)
    high = np.array([2.0, np.inf, 5.0, np.inf], np.float32)
    actions, _ = random_actions(Box(low, high, dtype=np.float32), 500)
    assert actions.dtype == np.float32
    assert ((actions[:, 0] >= -1) & (actions[:, 0] <= 2)).all()
    assert (actions[:, 1] >= 0).all()
    assert (actions[:, 2] <= 5).all()
    assert actions[:, 3].min() < 0 < actions[:, 3].max()
    # Uniform on [-1, 2]: mean 0.5 (std of the mean ~0.04).
    assert abs(actions[:, 0].mean() - 0.5) < 0.2


def test_random_integer_box_reaches_both_ends() -> None:
    actions, _ = random_actions(Box(0, 2, (3,), np.int64), 200)
    assert actions.dtype == np.int64
    assert set(np.unique(actions).tolist()) == {0, 1, 2}


def test_random_multi_discrete_and_multi_binary() -> None:
    md = gym.spaces.MultiDiscrete(np.array([[2, 3], [4, 5]]), start=np.array([[1, 0], [0, -2]]))
    actions, _ = random_actions(md, 300)
    assert actions.shape == (300, 2, 2)
    assert all(md.contains(a) for a in actions)
    assert (actions.max(0) == md.start + md.nvec - 1).all()
    mb = gym.spaces.MultiBinary(4)
    actions, _ = random_actions(mb, 100)
    assert actions.dtype == np.int8
    assert set(np.unique(actions).tolist()) == {0, 1}


def test_random_policy_is_deterministic_per_generator_and_ignores_the_space_generator() -> None:
    space = Box(-1, 1, (3,))
    space.seed(0)
    state = space.np_random.bit_generator.state
    first, _ = random_actions(space, 8, seed0=5)
    again, _ = random_actions(space, 8, seed0=5)
    np.testing.assert_array_equal(first, again)
    assert space.np_random.bit_generator.state == state


def test_random_policy_checks_dict_observations() -> None:
    spec = spec_of(gym.spaces.Dict(pos=box(2), goal=Discrete(3)), Discrete(2))
    policy = RandomPolicy(spec, seed=0)
    actions, _ = policy.get_actions({"pos": np.zeros((4, 2)), "goal": np.zeros(4, int)})
    assert actions.shape == (4,)
    with pytest.raises(PolicyError, match=r"observations\['goal'\] has 3 rows but"):
        policy.get_actions({"pos": np.zeros((4, 2)), "goal": np.zeros(3, int)})
    with pytest.raises(PolicyError, match=r"lacks keys \['goal'\]"):
        policy.get_actions({"pos": np.zeros((4, 2))})


def test_random_policy_has_no_parameters() -> None:
    policy = RandomPolicy(gym_spec("CartPole-v1"))
    assert policy.get_param_values() == {}
    policy.set_param_values({})
    with pytest.raises(PolicyError, match="has no parameters"):
        policy.set_param_values({"w": np.zeros(1)})


# ---------------------------------------------------------------- real envs


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1"])
@pytest.mark.parametrize("kind", ["default", "random"])
def test_policies_drive_real_envs(env_id: str, kind: str) -> None:
    envs = [gym.make(env_id) for _ in range(4)]
    spec = EnvSpec.from_env(envs[0])
    policy = make_policy(default_policy_spec(spec) if kind == "default" else "random", spec, seed=0)
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    rngs = rngs_for(range(4))
    for _ in range(30):
        actions, _ = policy.get_actions(obs, rngs)
        assert actions.shape == (4, *(spec.action_space.shape or ()))
        if isinstance(spec.action_space, Discrete):
            assert all(spec.action_space.contains(a) for a in actions)
        rows = []
        for env, action in zip(envs, actions, strict=True):
            ob, _, terminated, truncated, _ = env.step(action)
            rows.append(env.reset()[0] if terminated or truncated else ob)
        obs = np.stack(rows)
    for env in envs:
        env.close()
