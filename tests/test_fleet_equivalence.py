"""The fleet returns LocalSampler's batches, bit for bit, over 1 and 3 worker processes.

Every sampling mode, agent updates (a built-in policy instance, then a
params dict), an env update to Pendulum-v1 with an mlp-gaussian policy,
and multi-round fragments. Everything must be equal except
``episode_infos["worker"]``, which names the producer.
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest

from rlfleet.client import Fleet, RemoteSampler
from rlfleet.core import EpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy
from rlfleet.sampling.local import LocalSampler

pytestmark = pytest.mark.timeout(180)

SEED = 11
ENVS_PER_WORKER = 2
CARTPOLE = EnvConfig("CartPole-v1")
PENDULUM = EnvConfig("Pendulum-v1", max_episode_length=40)
_ARRAYS = ("observations", "last_observations", "actions", "rewards", "step_types", "lengths")


def assert_same_batch(local: EpisodeBatch, remote: EpisodeBatch, worker_ids: set[int]) -> None:
    """Every field equal (values and dtypes) except episode_infos['worker']."""
    assert remote.env_spec == local.env_spec
    for name in _ARRAYS:
        mine, theirs = getattr(remote, name), getattr(local, name)
        assert mine.dtype == theirs.dtype, name
        np.testing.assert_array_equal(mine, theirs, err_msg=name)
    for name in ("env_infos", "agent_infos"):
        mine, theirs = getattr(remote, name), getattr(local, name)
        assert mine.keys() == theirs.keys(), name
        for key in theirs:
            assert mine[key].dtype == theirs[key].dtype, (name, key)
            np.testing.assert_array_equal(mine[key], theirs[key], err_msg=f"{name}[{key}]")
    assert remote.episode_infos.keys() == local.episode_infos.keys()
    for key, value in local.episode_infos.items():
        if key != "worker":
            np.testing.assert_array_equal(remote.episode_infos[key], value, err_msg=key)
    assert set(remote.episode_infos["worker"].tolist()) <= worker_ids


@pytest.mark.parametrize("workers", [1, 3])
def test_every_mode_equals_local_sampler(workers: int) -> None:
    cartpole_spec = CARTPOLE.env_spec()
    categorical = MLPCategoricalPolicy(cartpole_spec, hidden_sizes=(16,), seed=1)
    sharper = {name: 4 * value for name, value in categorical.get_param_values().items()}
    gaussian = MLPGaussianPolicy(PENDULUM.env_spec(), hidden_sizes=(8,), seed=2)
    slots = workers * ENVS_PER_WORKER

    with (
        LocalSampler(
            CARTPOLE, n_workers=workers, envs_per_worker=ENVS_PER_WORKER, seed=SEED
        ) as local,
        Fleet.local(workers, ENVS_PER_WORKER, CARTPOLE, seed=SEED) as remote,
    ):
        worker_ids = {w.worker_id for w in remote.status().workers}
        assert len(worker_ids) == workers

        def same(call: Callable[[LocalSampler | RemoteSampler], EpisodeBatch]) -> EpisodeBatch:
            expected, got = call(local), call(remote)
            assert_same_batch(expected, got, worker_ids)
            return got

        batch = same(lambda s: s.obtain_samples(0, 400, agent_update=categorical))
        assert batch.total_steps >= 400 > batch.total_steps - batch.lengths[-1]
        assert batch.episode_infos["agent_version"].tolist() == [1] * batch.n_episodes

        batch = same(lambda s: s.obtain_episodes(5, agent_update=sharper))
        assert batch.episode_infos["episode_index"].tolist() == [0, 1, 2, 3, 4]
        assert set(batch.episode_infos["agent_version"].tolist()) == {2}

        batch = same(lambda s: s.obtain_exact_episodes(2))
        assert batch.n_episodes == 2 * workers

        # Three rounds of 8-step windows: pieces continue across rounds and calls.
        batch = same(lambda s: s.obtain_fragments(3 * slots * 8 - 1, 8))
        assert batch.total_steps == 3 * slots * 8
        assert set(batch.episode_infos["stream"].tolist()) == set(range(slots))
        batch = same(lambda s: s.obtain_fragments(slots * 5, 5))
        assert batch.episode_infos["fragment_index"].max() >= 1  # episodes went on

        same(lambda s: s.obtain_samples(1, 200))

        # An env update switches every worker to Pendulum with a Gaussian policy.
        batch = same(lambda s: s.obtain_samples(2, 100, agent_update=gaussian, env_update=PENDULUM))
        assert isinstance(batch.env_spec.action_space, gym.spaces.Box)
        assert batch.lengths.tolist() == [40] * 3  # cut at max_episode_length
        assert set(batch.episode_infos["agent_version"].tolist()) == {3}
        assert batch.agent_infos.keys() == {"log_prob", "mean", "log_std"}
        same(lambda s: s.obtain_fragments(slots * 15, 15))
