"""``Policy.get_actions_batched``: one generator for the whole batch (native workers).

The contract (docs/policies.md, "Native vector-env workers"): the per-row
formulas, with row i taking the i-th draws of one vectorised call on one
generator. The built-in MLPs' kernel computes each row alone, so their
batches are ``get_actions`` with ``[generator] * N``, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from gymnasium.spaces import Box, Discrete, MultiDiscrete

from rlfleet.core.env_spec import EnvSpec
from rlfleet.errors import PolicyError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, RandomPolicy
from rlfleet.policies.base import Policy

OBS = Box(-np.inf, np.inf, (4,), np.float32)


def observations(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def categorical_policy(deterministic: bool = False) -> MLPCategoricalPolicy:
    # A large output gain makes the probabilities far from uniform: a wrong
    # draw-to-row mapping then shows in the actions.
    policy = MLPCategoricalPolicy(
        EnvSpec(OBS, Discrete(5, start=2)), seed=3, deterministic=deterministic
    )
    params = policy.get_param_values()
    params["layers.2.weight"] = params["layers.2.weight"] * 300
    policy.set_param_values(params)
    return policy


def gaussian_policy(deterministic: bool = False) -> MLPGaussianPolicy:
    return MLPGaussianPolicy(
        EnvSpec(OBS, Box(-1, 1, (2, 3), np.float32)),
        init_log_std=-0.5,
        seed=3,
        deterministic=deterministic,
    )


@pytest.mark.parametrize("n", [1, 7, 64, 200])
def test_categorical_batch_is_the_per_row_contract_with_one_shared_generator(n: int) -> None:
    policy = categorical_policy()
    obs = observations(n)
    actions, infos = policy.get_actions_batched(obs, np.random.default_rng(9))
    row_actions, row_infos = policy.get_actions(obs, [np.random.default_rng(9)] * n)
    # The same draws, and rows computed alone: the same bits.
    assert actions.tobytes() == row_actions.tobytes()
    assert actions.dtype == row_actions.dtype and set(infos) == {"log_prob", "logits"}
    for key in ("logits", "log_prob"):
        assert infos[key].tobytes() == row_infos[key].tobytes(), key
    assert actions.min() >= 2 and actions.max() <= 6
    if n > 1:
        assert len(set(actions.tolist())) > 1  # not one value for all rows


@pytest.mark.parametrize("n", [1, 9, 64])
def test_gaussian_batch_is_the_per_row_contract_with_one_shared_generator(n: int) -> None:
    policy = gaussian_policy()
    obs = observations(n)
    actions, infos = policy.get_actions_batched(obs, np.random.default_rng(9))
    row_actions, row_infos = policy.get_actions(obs, [np.random.default_rng(9)] * n)
    assert actions.shape == (n, 2, 3) and actions.dtype == np.float32
    assert actions.tobytes() == row_actions.tobytes()
    for key in ("log_prob", "mean", "log_std"):
        assert infos[key].tobytes() == row_infos[key].tobytes(), key


def test_a_batch_takes_one_draw_per_row_from_the_generator() -> None:
    """After a batch of N, the generator is where N ``random()`` calls leave it."""
    generator, reference = np.random.default_rng(4), np.random.default_rng(4)
    categorical_policy().get_actions_batched(observations(13), generator)
    reference.random(13)
    assert generator.random() == reference.random()


@pytest.mark.parametrize("make", [categorical_policy, gaussian_policy])
def test_deterministic_batches_draw_nothing(make: Callable[[bool], Policy]) -> None:
    policy = make(True)
    generator = np.random.default_rng(4)
    actions, _ = policy.get_actions_batched(observations(10), generator)
    again, _ = policy.get_actions_batched(observations(10), np.random.default_rng(77))
    assert np.array_equal(actions, again)
    assert generator.random() == np.random.default_rng(4).random()


def test_policies_without_a_batched_path_get_per_row_calls_on_the_one_generator() -> None:
    """The default: ``get_actions`` with the generator for every row."""
    policy = RandomPolicy(EnvSpec(OBS, MultiDiscrete([3, 4, 5])))
    actions, infos = policy.get_actions_batched(observations(6), np.random.default_rng(2))
    row_actions, _ = policy.get_actions(observations(6), [np.random.default_rng(2)] * 6)
    assert np.array_equal(actions, row_actions) and infos == {}


def test_bad_batches_are_policy_errors_naming_the_problem() -> None:
    policy = categorical_policy()
    with pytest.raises(PolicyError, match=r"shape"):
        policy.get_actions_batched(np.zeros((3, 5), np.float32), np.random.default_rng(0))
    with pytest.raises(PolicyError, match=r"logits of row 1 are not finite"):
        bad = observations(3)
        bad[1, 0] = np.nan
        policy.get_actions_batched(bad, np.random.default_rng(0))
    with pytest.raises(PolicyError, match=r"shape"):
        RandomPolicy(EnvSpec(OBS, Discrete(2))).get_actions_batched(
            np.zeros((3, 2), np.float32), np.random.default_rng(0)
        )


def test_an_empty_batch_gives_empty_actions() -> None:
    actions, infos = categorical_policy().get_actions_batched(
        np.zeros((0, 4), np.float32), np.random.default_rng(0)
    )
    assert actions.shape == (0,) and infos["log_prob"].shape == (0,)
