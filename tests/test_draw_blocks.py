"""Policy draws taken a block per episode give the same batches as per-row generators.

The built-in MLPs declare their per-row draws (``Policy.row_draws``), so a
worker draws each episode's values in blocks (rlfleet/worker/_draw_blocks.py)
instead of one generator call per row per step. Every test here compares
against the same policy forced onto the generator path (``row_draws`` None):
the batches must be bit-identical, including episodes longer than a block
(refills), slots idle at times (index gathers), and fragment streams whose
episodes are cut by windows and continue later (the generator is rewound).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.core import EnvSpec
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, RandomPolicy
from rlfleet.policies.base import RowDraws
from rlfleet.worker import VecWorker, make_units
from rlfleet.worker._draw_blocks import BLOCK_STEPS, DrawBlocks

CARTPOLE = EnvConfig("CartPole-v1")
PENDULUM = EnvConfig("Pendulum-v1")


class _CategoricalWithGenerators(MLPCategoricalPolicy):
    def row_draws(self) -> RowDraws | None:
        return None


class _GaussianWithGenerators(MLPGaussianPolicy):
    def row_draws(self) -> RowDraws | None:
        return None


def _fields(batch: Any) -> dict[str, np.ndarray]:
    return {
        "observations": batch.observations,
        "last_observations": batch.last_observations,
        "actions": batch.actions,
        "rewards": batch.rewards,
        "step_types": batch.step_types,
        "lengths": batch.lengths,
        **{f"agent_infos.{k}": v for k, v in batch.agent_infos.items()},
        **{f"episode_infos.{k}": v for k, v in batch.episode_infos.items()},
    }


def _assert_same(a: Any, b: Any) -> None:
    fa, fb = _fields(a), _fields(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        assert fa[key].dtype == fb[key].dtype, key
        np.testing.assert_array_equal(fa[key], fb[key], err_msg=key)


@pytest.mark.parametrize("seed", range(50))
def test_numpy_draws_a_block_as_the_same_values_as_one_call_per_step(seed: int) -> None:
    # The premise of draw blocks: same values and same final generator state.
    for d in (1, 3):
        one_by_one, block = np.random.default_rng(seed), np.random.default_rng(seed)
        uniforms = [one_by_one.random() for _ in range(70 * d)]
        np.testing.assert_array_equal(uniforms, block.random(70 * d))
        normals = np.concatenate([one_by_one.standard_normal(d) for _ in range(70)])
        np.testing.assert_array_equal(normals, block.standard_normal(70 * d))
        assert one_by_one.bit_generator.state == block.bit_generator.state


@pytest.mark.parametrize(
    ("config", "blocked", "plain", "max_len"),
    [
        (CARTPOLE, MLPCategoricalPolicy, _CategoricalWithGenerators, None),
        # 200-step episodes: several refills per episode.
        (PENDULUM, MLPGaussianPolicy, _GaussianWithGenerators, 150),
    ],
)
@pytest.mark.parametrize("n_envs", [1, 3, 8])
def test_episodes_with_draw_blocks_equal_episodes_with_generators(
    config: EnvConfig, blocked: Any, plain: Any, max_len: int | None, n_envs: int
) -> None:
    spec = config.env_spec()
    batches = []
    for policy_class in (blocked, plain):
        policy: Any = policy_class(spec, hidden_sizes=(8,), seed=3)
        worker = VecWorker(n_envs=n_envs, env=config, policy=policy, max_episode_length=max_len)
        try:
            # 13 episodes on n slots: slots go idle at the end (gathered rows).
            batches.append(worker.run(make_units(11, 0, range(13))))
        finally:
            worker.shutdown()
    assert blocked(spec).row_draws() is not None
    assert batches[0].total_steps > BLOCK_STEPS
    _assert_same(*batches)


@pytest.mark.parametrize(
    ("config", "blocked", "plain"),
    [
        (CARTPOLE, MLPCategoricalPolicy, _CategoricalWithGenerators),
        (PENDULUM, MLPGaussianPolicy, _GaussianWithGenerators),
    ],
)
def test_fragment_streams_cut_by_windows_continue_with_the_same_draws(
    config: EnvConfig, blocked: Any, plain: Any
) -> None:
    # Windows of 7 and 90 steps cut episodes that continue in the next call,
    # possibly on another slot: their generators must go on from where the
    # per-step draws left them, not from the end of a block.
    spec = config.env_spec()
    results = []
    for policy_class in (blocked, plain):
        policy: Any = policy_class(spec, hidden_sizes=(8,), seed=5)
        worker = VecWorker(n_envs=3, env=config, policy=policy)
        try:
            batches = [
                worker.collect_fragments(7, base_seed=2),
                worker.collect_fragments(90, base_seed=2, streams=[2, 0]),
                worker.collect_fragments(7, base_seed=2, streams=[0, 1, 2]),
            ]
        finally:
            worker.shutdown()
        results.append(batches)
    for a, b in zip(*results, strict=True):
        _assert_same(a, b)


def test_get_actions_from_draws_equals_get_actions_on_the_same_generators() -> None:
    rng = np.random.default_rng(0)
    cartpole = CARTPOLE.env_spec()
    box = EnvSpec(gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,)), None)
    for policy in (
        MLPCategoricalPolicy(cartpole, seed=1),
        MLPGaussianPolicy(box, seed=1),
        MLPCategoricalPolicy(cartpole, seed=1, deterministic=True),
        MLPGaussianPolicy(box, seed=1, deterministic=True),
    ):
        dim = policy.env_spec.observation_space.shape[0]  # type: ignore[index]
        observations = rng.standard_normal((5, dim)).astype(np.float32)
        draws = policy.row_draws()
        count = 1 if draws is None else draws.count
        rngs = [np.random.default_rng(seed) for seed in range(5)]
        if draws is None or draws.kind == "random":
            values = np.array([[r.random() for _ in range(count)] for r in rngs])
        else:
            values = np.array([r.standard_normal(count) for r in rngs])
        rngs = [np.random.default_rng(seed) for seed in range(5)]
        expected_actions, expected_infos = policy.get_actions(observations, rngs)
        actions, infos = policy.get_actions_from_draws(observations, values)
        np.testing.assert_array_equal(actions, expected_actions)
        assert infos.keys() == expected_infos.keys()
        for key in infos:
            np.testing.assert_array_equal(infos[key], expected_infos[key])
        assert (draws is None) == policy.deterministic


def test_wrong_draws_and_undeclared_draws_are_policy_errors() -> None:
    spec = CARTPOLE.env_spec()
    policy = MLPCategoricalPolicy(spec, seed=0)
    observations = np.zeros((2, 4), np.float32)
    with pytest.raises(
        PolicyError, match=r"float64 draws of shape \(2, 1\) or \(2,\), got float64 \(3, 1\)"
    ):
        policy.get_actions_from_draws(observations, np.zeros((3, 1)))
    with pytest.raises(PolicyError, match=r"got float32 \(2, 1\)"):
        policy.get_actions_from_draws(observations, np.zeros((2, 1), np.float32))
    random_policy = RandomPolicy(spec, seed=0)
    assert random_policy.row_draws() is None  # its draws depend on the action space
    with pytest.raises(PolicyError, match="RandomPolicy does not declare its per-row draws"):
        random_policy.get_actions_from_draws(observations, np.zeros((2, 1)))


def test_row_draws_validation() -> None:
    with pytest.raises(ConfigError, match="kind must be one of"):
        RowDraws("integers", 1)  # type: ignore[arg-type]
    for count in (0, 1.0, True):
        with pytest.raises(ConfigError, match="count must be a positive int"):
            RowDraws("random", count)  # type: ignore[arg-type]


def test_a_finished_slot_is_not_refilled_from_its_old_generator() -> None:
    blocks = DrawBlocks(2, RowDraws("random", 1), size=4)
    rng = np.random.default_rng(0)
    blocks.start(0, rng, step=0)
    state = rng.bit_generator.state
    blocks.stop(0)
    blocks.take(4, None)  # the step at which slot 0's block would have been refilled
    assert rng.bit_generator.state == state
