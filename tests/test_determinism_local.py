"""Same seed, same calls, same agent updates => identical batches, any layout.

Every field is compared with np.array_equal, infos included, except
episode_infos['worker'], which records where each episode ran.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from rlfleet.core import EpisodeBatch
from rlfleet.envs.config import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, Policy
from rlfleet.sampling.local import LocalSampler
from tests._coordinator_fakes import batch_arrays

CARTPOLE = EnvConfig("CartPole-v1")
PENDULUM = EnvConfig("Pendulum-v1", max_episode_length=40)
LAYOUTS = [(1, 1), (4, 3)]


def assert_identical(a: EpisodeBatch, b: EpisodeBatch) -> None:
    fa, fb = batch_arrays(a), batch_arrays(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        if key != "episode_infos[worker]":
            assert fa[key].dtype == fb[key].dtype, key
            assert np.array_equal(fa[key], fb[key]), key


def session(
    env: EnvConfig, make_policy: Callable[[], Policy], layout: tuple[int, int], seed: int = 3
) -> list[EpisodeBatch]:
    """A learner's calls: samples, an update, episodes, samples again."""
    policy = make_policy()
    n_workers, envs_per_worker = layout
    with LocalSampler(
        env, policy, n_workers=n_workers, envs_per_worker=envs_per_worker, seed=seed
    ) as sampler:
        first = sampler.obtain_samples(0, 300)
        update = {k: v * 1.5 + 0.01 for k, v in policy.get_param_values().items()}
        second = sampler.obtain_episodes(10, agent_update=update)
        third = sampler.obtain_samples(1, 200)
    return [first, second, third]


def cartpole_mlp() -> Policy:
    return MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(32, 32), seed=0)


def pendulum_gaussian() -> Policy:
    return MLPGaussianPolicy(PENDULUM.env_spec(), hidden_sizes=(16,), seed=0)


@pytest.mark.parametrize(
    ("env", "make_policy"),
    [(CARTPOLE, cartpole_mlp), (PENDULUM, pendulum_gaussian)],
    ids=["cartpole-categorical", "pendulum-gaussian"],
)
def test_one_by_one_and_four_by_three_give_identical_batches(env, make_policy):
    small, large = (session(env, make_policy, layout) for layout in LAYOUTS)
    for a, b in zip(small, large, strict=True):
        assert_identical(a, b)
    # The large layout really spread the work.
    assert len(set(large[1].episode_infos["worker"].tolist())) > 1
    assert small[1].episode_infos["agent_version"].tolist() == [1] * 10


def test_same_layout_twice_is_identical_and_another_seed_differs():
    once = session(CARTPOLE, cartpole_mlp, (2, 2))
    twice = session(CARTPOLE, cartpole_mlp, (2, 2))
    for a, b in zip(once, twice, strict=True):
        assert_identical(a, b)
        np.testing.assert_array_equal(a.episode_infos["worker"], b.episode_infos["worker"])
    other = session(CARTPOLE, cartpole_mlp, (2, 2), seed=4)
    assert not np.array_equal(once[0].observations[:5], other[0].observations[:5])


def test_fragments_depend_on_the_number_of_streams_not_on_the_workers():
    batches = []
    for n_workers, envs_per_worker in [(1, 4), (2, 2), (4, 1)]:
        policy = cartpole_mlp()
        with LocalSampler(
            CARTPOLE, policy, n_workers=n_workers, envs_per_worker=envs_per_worker, seed=1
        ) as sampler:
            first = sampler.obtain_fragments(100, 16)
            update = {k: -v for k, v in policy.get_param_values().items()}
            second = sampler.obtain_fragments(100, 16, agent_update=update)
            batches.append((first, second))
    for other in batches[1:]:
        for a, b in zip(batches[0], other, strict=True):
            assert_identical(a, b)
