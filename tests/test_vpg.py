"""The VPG learner: exact gradients, advantages, episode ends, and learning."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.core.step_type import StepType
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, InvalidBatchError
from rlfleet.learners import VPG, train
from rlfleet.learners._advantages import gae, undiscounted_returns
from rlfleet.learners._inputs import BatchEncoder
from rlfleet.learners._losses import categorical_policy_loss, log_softmax, value_loss
from rlfleet.learners._mlp import MLP
from rlfleet.policies import MLPCategoricalPolicy, make_policy

F, M, TERM, TIME = StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT


@pytest.fixture(scope="module")
def cartpole_spec() -> EnvSpec:
    return EnvConfig("CartPole-v1").env_spec()


def _numeric_grads(
    net: MLP, loss_fn: Callable[[], float], eps: float = 1e-6
) -> dict[str, np.ndarray]:
    """Central finite differences of loss_fn() w.r.t. every parameter element."""
    grads = {}
    for name, param in net.params.items():
        grad = np.zeros_like(param)
        for index in np.ndindex(param.shape):
            saved = param[index]
            param[index] = saved + eps
            plus = loss_fn()
            param[index] = saved - eps
            minus = loss_fn()
            param[index] = saved
            grad[index] = (plus - minus) / (2 * eps)
        grads[name] = grad
    return grads


def _small_net(activation: str, out: int, seed: int = 0) -> MLP:
    # output_gain 1 (not the policy's 0.01) so the output layer matters in the check.
    return MLP.initial((3, 5, 4, out), activation, np.random.default_rng(seed))


@pytest.mark.parametrize("activation", ["tanh", "relu", "identity"])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.3])
def test_policy_loss_gradient_matches_finite_differences(
    activation: str, entropy_coef: float
) -> None:
    rng = np.random.default_rng(1)
    net = _small_net(activation, out=3)
    features = rng.standard_normal((7, 3))
    actions = rng.integers(0, 3, size=7)
    weights = rng.standard_normal(7)

    def loss() -> float:
        return categorical_policy_loss(
            net, features, actions, weights, entropy_coef=entropy_coef
        ).loss

    analytic = categorical_policy_loss(net, features, actions, weights, entropy_coef=entropy_coef)
    numeric = _numeric_grads(net, loss)
    assert analytic.grads.keys() == numeric.keys()
    for name in numeric:
        np.testing.assert_allclose(analytic.grads[name], numeric[name], rtol=1e-5, atol=1e-8)


def test_value_loss_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(2)
    net = _small_net("tanh", out=1)
    features = rng.standard_normal((9, 3))
    targets = rng.standard_normal(9) * 5

    analytic = value_loss(net, features, targets)[1]
    numeric = _numeric_grads(net, lambda: value_loss(net, features, targets)[0])
    for name in numeric:
        np.testing.assert_allclose(analytic[name], numeric[name], rtol=1e-5, atol=1e-8)


def test_policy_loss_value_by_hand() -> None:
    # One linear layer with zero weights: uniform over 2 actions, log p = log 0.5.
    net = MLP({"layers.0.weight": np.zeros((1, 2)), "layers.0.bias": np.zeros(2)}, "tanh")
    result = categorical_policy_loss(
        net, np.ones((2, 1)), np.array([0, 1]), np.array([1.0, 3.0]), entropy_coef=0.5
    )
    # -mean(w * log 0.5) - 0.5 * log 2 = 2 log 2 - 0.5 log 2
    assert result.loss == pytest.approx(1.5 * np.log(2))
    assert result.entropy == pytest.approx(np.log(2))
    np.testing.assert_allclose(result.log_probs, np.log([0.5, 0.5]))


def test_gae_reward_to_go_and_bootstrap_by_hand() -> None:
    rewards = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    lengths = np.array([3, 2])
    zeros = np.zeros(5)
    # lambda = 1, zero values: discounted reward-to-go; the second episode
    # was cut off and bootstraps a value of 4 after its last step.
    advantages = gae(rewards, zeros, np.array([0.0, 4.0]), lengths, discount=0.5, gae_lambda=1.0)
    np.testing.assert_allclose(advantages, [1.75, 1.5, 1.0, 2.5, 3.0])


def test_gae_lambda_zero_is_the_td_error() -> None:
    rewards = np.array([1.0, 2.0, 3.0])
    values = np.array([0.5, 1.0, 2.0])
    advantages = gae(rewards, values, np.array([10.0]), np.array([3]), discount=0.9, gae_lambda=0.0)
    # delta_t = r_t + 0.9 V(s_{t+1}) - V(s_t), V(s_3) = 10
    np.testing.assert_allclose(advantages, [1 + 0.9 - 0.5, 2 + 1.8 - 1, 3 + 9 - 2])


def test_gae_general_lambda_by_hand() -> None:
    rewards = np.array([1.0, 0.0])
    values = np.array([2.0, 4.0])
    advantages = gae(rewards, values, np.array([0.0]), np.array([2]), discount=0.5, gae_lambda=0.5)
    d0, d1 = 1 + 0.5 * 4 - 2, 0 + 0 - 4
    np.testing.assert_allclose(advantages, [d0 + 0.25 * d1, d1])


def test_undiscounted_returns() -> None:
    returns = undiscounted_returns(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1, 3]))
    np.testing.assert_allclose(returns, [1.0, 9.0])


def _batch(
    spec: EnvSpec,
    lengths: list[int],
    last_types: list[StepType],
    actions: list[int] | None = None,
) -> EpisodeBatch:
    total = sum(lengths)
    step_types = []
    for length, last in zip(lengths, last_types, strict=True):
        step_types += [F] + [M] * (length - 2) + [last] if length > 1 else [last]
    rng = np.random.default_rng(0)
    return EpisodeBatch(
        env_spec=spec,
        episode_infos={},
        observations=rng.uniform(-0.05, 0.05, (total, 4)).astype(np.float32),
        last_observations=rng.uniform(-0.05, 0.05, (len(lengths), 4)).astype(np.float32),
        actions=np.asarray(actions if actions is not None else np.arange(total) % 2),
        rewards=np.ones(total, dtype=np.float32),
        env_infos={},
        agent_infos={},
        step_types=np.array(step_types, dtype=np.int64),
        lengths=np.array(lengths, dtype=np.int64),
    )


def test_encoder_marks_only_terminal_episodes_as_ended(cartpole_spec: EnvSpec) -> None:
    batch = _batch(cartpole_spec, [3, 2, 4], [TERM, TIME, M])
    data = BatchEncoder(cartpole_spec, "test").encode(batch)
    # TIMEOUT (time limit) and MID (fragment cut) bootstrap; only TERMINAL does not.
    np.testing.assert_array_equal(data.terminated, [True, False, False])
    np.testing.assert_array_equal(data.actions, batch.actions)
    assert data.features.dtype == np.float64
    np.testing.assert_array_equal(data.last_features, batch.last_observations)


def test_encoder_rejects_out_of_space_actions(cartpole_spec: EnvSpec) -> None:
    # EpisodeBatch checks shapes only, so a value outside Discrete(2) gets here.
    batch = _batch(cartpole_spec, [3], [TERM], actions=[0, 2, 1])
    with pytest.raises(InvalidBatchError, match="step 1 is 2, outside Discrete"):
        BatchEncoder(cartpole_spec, "VPG").encode(batch)


def test_timeout_bootstraps_the_value_of_the_last_observation(cartpole_spec: EnvSpec) -> None:
    vpg = VPG(cartpole_spec, seed=3, discount=0.9, gae_lambda=1.0)
    targets = {}
    for last in (TERM, TIME):
        data = vpg._encoder.encode(_batch(cartpole_spec, [3], [last]))
        targets[last] = vpg._advantages_and_targets(data)[1]
    v_last = vpg._predict_values(data.last_features)[0]
    assert v_last != 0.0  # else the check below cannot tell the two apart
    # Rewards are 1: the TERMINAL episode's returns are 1 + 0.9 + 0.81, 1.9, 1;
    # the TIMEOUT one adds the discounted value of the state after step 3.
    np.testing.assert_allclose(targets[TERM], [2.71, 1.9, 1.0])
    np.testing.assert_allclose(
        targets[TIME], [2.71, 1.9, 1.0] + v_last * 0.9 ** np.arange(3, 0, -1)
    )


def test_initial_params_are_the_policy_specs(cartpole_spec: EnvSpec) -> None:
    vpg = VPG(cartpole_spec, hidden_sizes=(16, 8), seed=5)
    expected = MLPCategoricalPolicy(cartpole_spec, hidden_sizes=(16, 8), seed=5)
    params = vpg.get_params()
    assert list(params) == list(expected.get_param_values())
    for name, value in expected.get_param_values().items():
        assert params[name].dtype == np.float32
        np.testing.assert_array_equal(params[name], value)
    # The spec travels as JSON and builds a policy that accepts the params.
    policy = make_policy(vpg.policy_spec.to_json(), cartpole_spec, seed=0)
    policy.set_param_values(params)
    assert vpg.policy_spec.kwargs == {"hidden_sizes": [16, 8], "activation": "tanh"}


def test_learner_logits_equal_the_policy_logits(cartpole_spec: EnvSpec) -> None:
    vpg = VPG(cartpole_spec, seed=1, lr=0.05)
    batch = _batch(cartpole_spec, [20, 30], [TERM, TIME])
    vpg.train_step(batch)  # move away from the near-uniform initial weights
    actions, infos = vpg.make_policy(seed=0).get_actions(batch.observations)
    logits = vpg._policy.forward(batch.observations.astype(np.float64))[0]
    assert np.ptp(logits[:, 0] - logits[:, 1]) > 1e-3  # the rows really differ
    np.testing.assert_allclose(infos["logits"], logits, rtol=1e-4, atol=1e-6)
    expected = log_softmax(logits)[np.arange(50), actions]
    np.testing.assert_allclose(infos["log_prob"], expected, atol=1e-5)


def test_train_step_stats(cartpole_spec: EnvSpec) -> None:
    vpg = VPG(cartpole_spec, seed=0)
    stats = vpg.train_step(_batch(cartpole_spec, [3, 5], [TERM, TIME]))
    assert stats["Iteration"] == 1
    assert stats["NumEpisodes"] == 2
    assert stats["NumSteps"] == 8
    assert stats["AverageReturn"] == 4.0
    assert stats["MaxReturn"] == 5.0
    assert stats["MinReturn"] == 3.0
    assert stats["StdReturn"] == 1.0
    assert stats["Entropy"] == pytest.approx(np.log(2), abs=1e-3)  # near-uniform start
    assert vpg.iteration == 1


def test_rejects_batches_of_another_action_space(cartpole_spec: EnvSpec) -> None:
    vpg = VPG(cartpole_spec)
    other = EnvSpec(cartpole_spec.observation_space, gym.spaces.Discrete(3), 500)
    batch = _batch(other, [2], [TERM])
    with pytest.raises(InvalidBatchError, match="Discrete\\(3\\)"):
        vpg.train_step(batch)


def test_rejects_box_actions_and_bad_hyperparameters(cartpole_spec: EnvSpec) -> None:
    pendulum = EnvConfig("Pendulum-v1").env_spec()
    with pytest.raises(ConfigError, match="Discrete action space"):
        VPG(pendulum)
    with pytest.raises(ConfigError, match="discount"):
        VPG(cartpole_spec, discount=1.5)
    with pytest.raises(ConfigError, match="lr"):
        VPG(cartpole_spec, lr=0.0)


def test_train_needs_a_stopping_condition(cartpole_spec: EnvSpec) -> None:
    with pytest.raises(ConfigError, match="stopping condition"):
        train(object(), VPG(cartpole_spec), steps_per_iteration=10)  # type: ignore[arg-type]


def test_vpg_improves_cartpole_with_a_local_sampler(cartpole_spec: EnvSpec) -> None:
    from rlfleet.sampling.local import LocalSampler

    vpg = VPG(cartpole_spec, seed=0)
    with LocalSampler(
        EnvConfig("CartPole-v1"), vpg.policy_spec, n_workers=2, envs_per_worker=2, seed=0
    ) as sampler:
        result = train(sampler, vpg, steps_per_iteration=1000, max_iterations=10)
    returns = [record.average_return for record in result.history]
    assert len(returns) == 10 and not result.reached
    # The near-uniform initial policy balances ~22 steps; learning must
    # more than double that within 10 iterations (~10k steps).
    assert returns[0] < 30
    assert np.mean(returns[-3:]) > 60
    assert result.history[-1].stats["Iteration"] == 10
    assert result.total_steps == sum(record.steps for record in result.history)
