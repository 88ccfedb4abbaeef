"""LocalSampler: garage's Sampler contract, the prefix rule, requests, updates."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs)
from rlfleet.core.seeding import episode_seeds
from rlfleet.envs.config import EnvConfig
from rlfleet.errors import ConfigError, EnvError
from rlfleet.policies import MLPCategoricalPolicy, PolicySpec
from rlfleet.sampling.local import LocalSampler
from rlfleet.worker import VecWorker, make_units
from rlfleet.worker.units import UnitRow

CARTPOLE = EnvConfig("CartPole-v1")


def counter(length: int) -> EnvConfig:
    return EnvConfig("rlfleet/Counter-v0", {"length": length})


def lengths_of_request(seed: int, request: int, n: int, policy=None) -> list[int]:
    """Episode lengths of episodes 0..n-1 of a request, run one by one."""
    worker = VecWorker(n_envs=1, env=CARTPOLE, policy=policy)
    return worker.run(make_units(seed, request, range(n))).lengths.tolist()


@pytest.mark.parametrize(("n_workers", "envs_per_worker"), [(1, 1), (3, 2)])
def test_obtain_samples_returns_the_shortest_prefix_reaching_num_samples(
    n_workers, envs_per_worker
):
    lengths = lengths_of_request(11, 0, 40)
    num_samples = sum(lengths[:9]) - 3  # reached within episode 8, not before
    with LocalSampler(
        CARTPOLE, n_workers=n_workers, envs_per_worker=envs_per_worker, seed=11
    ) as sampler:
        batch = sampler.obtain_samples(0, num_samples)
    assert batch.episode_infos["episode_index"].tolist() == list(range(9))
    assert batch.lengths.tolist() == lengths[:9]
    assert sum(lengths[:8]) < num_samples <= batch.total_steps


def test_obtain_samples_exactly_at_a_boundary_stops_there():
    lengths = lengths_of_request(0, 0, 10)
    with LocalSampler(CARTPOLE, n_workers=2, envs_per_worker=2) as sampler:
        batch = sampler.obtain_samples(0, sum(lengths[:4]))
    assert batch.n_episodes == 4


def test_each_call_is_a_new_request():
    with LocalSampler(counter(3), n_workers=2, seed=5) as sampler:
        first = sampler.obtain_episodes(2)
        second = sampler.obtain_episodes(2)
    for request, batch in enumerate((first, second)):
        assert batch.episode_infos["env_seed"].tolist() == [
            episode_seeds(5, request, k)[0] for k in range(2)
        ]
        assert batch.episode_infos["policy_seed"].tolist() == [
            episode_seeds(5, request, k)[1] for k in range(2)
        ]


def test_the_scheduler_units_reach_the_workers_as_checked_rows(monkeypatch):
    """The in-process sampler hands its workers the scheduler's units as a
    remote worker's TaskBook does: rows of the columns (``UnitRow.many``), never
    EpisodeUnit objects, with the seeds of their episodes."""
    handed: list[UnitRow] = []
    submit_rows = VecWorker.submit_rows

    def recorded(worker: VecWorker, units: list[UnitRow]) -> None:
        handed.extend(units)
        submit_rows(worker, units)

    monkeypatch.setattr(VecWorker, "submit_rows", recorded)
    monkeypatch.setattr(VecWorker, "submit", None)  # a call would fail
    with LocalSampler(counter(2), n_workers=2, envs_per_worker=2, seed=5) as sampler:
        batch = sampler.obtain_episodes(6)
    assert handed and all(type(unit) is UnitRow for unit in handed)
    assert {(u.episode_index, u.env_seed, u.policy_seed, u.request) for u in handed} >= {
        (k, *episode_seeds(5, 0, k), 0) for k in range(6)
    }
    assert batch.episode_infos["episode_index"].tolist() == list(range(6))


def test_obtain_episodes_and_exact_episodes_counts():
    with LocalSampler(counter(2), n_workers=3, envs_per_worker=2) as sampler:
        assert sampler.obtain_episodes(5).episode_infos["episode_index"].tolist() == [0, 1, 2, 3, 4]
        exact = sampler.obtain_exact_episodes(2)
    assert exact.n_episodes == 6
    assert exact.episode_infos["episode_index"].tolist() == list(range(6))
    assert set(exact.episode_infos["worker"].tolist()) <= {0, 1, 2}


def test_step_types_are_uint8_as_on_the_wire():
    # One dtype from the worker to the learner, locally as remotely.
    with LocalSampler(counter(3), n_workers=2, envs_per_worker=2) as sampler:
        assert sampler.obtain_episodes(3).step_types.dtype == np.uint8
        assert sampler.obtain_samples(0, 7).step_types.dtype == np.uint8
        assert sampler.obtain_fragments(8, 2).step_types.dtype == np.uint8


def test_agent_updates_bump_the_version_on_every_worker():
    spec = CARTPOLE.env_spec()
    policy = MLPCategoricalPolicy(spec, seed=1)
    with LocalSampler(CARTPOLE, policy, n_workers=2, envs_per_worker=2) as sampler:
        assert sampler.agent_version == 0
        assert sampler.obtain_episodes(3).episode_infos["agent_version"].tolist() == [0] * 3
        params = {k: v * 2 for k, v in policy.get_param_values().items()}
        batch = sampler.obtain_episodes(3, agent_update=params)
        assert batch.episode_infos["agent_version"].tolist() == [1] * 3
        assert sampler.agent_version == 1
        assert all(worker.agent_version == 1 for worker in sampler.workers)
        assert sampler.obtain_episodes(1, agent_update=None).episode_infos[
            "agent_version"
        ].tolist() == [1]


def test_policy_given_as_spec_is_shared_by_the_workers():
    with LocalSampler(CARTPOLE, "mlp-categorical", n_workers=3, seed=2) as sampler:
        policies = {id(worker.policy) for worker in sampler.workers}
        assert len(policies) == 1
        sampler.obtain_samples(0, 50, agent_update=PolicySpec("mlp-categorical", {"seed": 3}))
        assert len({id(worker.policy) for worker in sampler.workers}) == 1


def test_env_update_applies_to_every_worker():
    with LocalSampler(counter(3), n_workers=2, envs_per_worker=2) as sampler:
        assert sampler.obtain_episodes(4).lengths.tolist() == [3] * 4
        batch = sampler.obtain_episodes(4, env_update=counter(6))
        assert batch.lengths.tolist() == [6] * 4
        assert sampler.env_spec.observation_space == gym.spaces.Box(0, 6, (1,), np.float32)


def test_env_instance_is_copied_for_the_other_workers():
    env = gym.make("CartPole-v1")
    with LocalSampler(env, n_workers=2, envs_per_worker=2) as sampler:
        assert sampler.workers[0].envs[0] is env
        others = [e for w in sampler.workers for e in w.envs][1:]
        assert all(other is not env for other in others)
        assert sampler.obtain_episodes(4).n_episodes == 4


def test_obtain_fragments_rounds_streams_and_lengths():
    with LocalSampler(counter(4), n_workers=2, envs_per_worker=2) as sampler:
        batch = sampler.obtain_fragments(25, fragment_length=3)
        again = sampler.obtain_fragments(1, fragment_length=3)
    # 4 streams x 3 steps = 12 steps a round: 3 rounds reach 25. Every stream
    # runs 4-step episodes: round 1 [0 1 2], round 2 [3] + [0 1], round 3
    # [2 3] + [0]; ordered by stream, then episode, then piece.
    assert batch.total_steps == 36
    infos = batch.episode_infos
    assert infos["stream"].tolist() == [s for s in range(4) for _ in range(5)]
    assert batch.lengths.tolist() == [3, 1, 2, 2, 1] * 4
    assert infos["episode_index"].tolist() == [0, 0, 1, 1, 2] * 4
    assert infos["fragment_index"].tolist() == [0, 1, 0, 1, 0] * 4
    assert infos["worker"].tolist() == [0] * 10 + [1] * 10
    # The next call continues the streams: episode 2's second piece, [1 2 3].
    assert again.lengths.tolist() == [3] * 4
    assert again.episode_infos["episode_index"].tolist() == [2] * 4
    assert again.episode_infos["fragment_index"].tolist() == [1] * 4
    np.testing.assert_array_equal(again.observations[:3, 0], [1, 2, 3])


def test_errors_leave_the_sampler_usable():
    crashing = EnvConfig("rlfleet/Crashing-v0", {"crash_at_step": 2, "length": 3})
    with LocalSampler(counter(3), n_workers=2) as sampler:
        with pytest.raises(EnvError):
            sampler.obtain_episodes(4, env_update=crashing)
        assert all(worker.idle and not worker.finished_count for worker in sampler.workers)
        batch = sampler.obtain_episodes(3, env_update=counter(3))
        assert batch.lengths.tolist() == [3, 3, 3]


def test_close_shuts_the_workers_down():
    sampler = LocalSampler(counter(3), n_workers=2)
    with sampler:
        pass
    assert all(env is None for worker in sampler.workers for env in worker.envs)
    with pytest.raises(RuntimeError, match="shut down"):
        sampler.obtain_episodes(1)


def test_argument_validation():
    with pytest.raises(ConfigError, match="n_workers"):
        LocalSampler(CARTPOLE, n_workers=0)
    with LocalSampler(CARTPOLE) as sampler:
        with pytest.raises(ConfigError, match="num_samples"):
            sampler.obtain_samples(0, 0)
        with pytest.raises(TypeError):
            LocalSampler(CARTPOLE, policy=3)  # type: ignore[arg-type]
        assert np.isfinite(sampler.obtain_samples(0, 1).rewards).all()
