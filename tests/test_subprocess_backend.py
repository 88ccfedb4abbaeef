"""The subprocess backend: ``EnvConfig(vectorization="subprocess")``.

Each worker slot's env runs in a child process (a ``SubprocVectorEnv``
behind the engine); seeds and the sampling contract are those of the
in-process backend, so every batch must be the in-process one bit for bit:
through ``VecWorker``, fragments included, and through ``Fleet.local``'s
real worker processes. A child that dies is an env crash: rebuilt within
the restart budget and its episode re-run from its seeds.
"""

from __future__ import annotations

import dataclasses
import os
import signal

import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs)
from rlfleet.client import Fleet
from rlfleet.envs import EnvConfig, SubprocVectorEnv
from rlfleet.errors import ConfigError, EnvError
from rlfleet.policies import MLPCategoricalPolicy
from rlfleet.sampling.local import LocalSampler
from rlfleet.worker import VecWorker, make_units
from tests.test_fleet_equivalence import assert_same_batch
from tests.test_native_backends import assert_lease_refused
from tests.test_vec_worker import assert_same_batches

pytestmark = pytest.mark.timeout(180)

CARTPOLE = EnvConfig("CartPole-v1")


def in_children(config: EnvConfig) -> EnvConfig:
    return dataclasses.replace(config, vectorization="subprocess")


def mlp() -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(CARTPOLE.env_spec(), hidden_sizes=(16, 16), seed=3)


def children_of(worker: VecWorker) -> SubprocVectorEnv:
    venv = worker._engine.venv
    assert isinstance(venv, SubprocVectorEnv)
    return venv


def finish(worker: VecWorker):
    while not worker.idle:
        worker.step()
    return worker.take_finished()


@pytest.mark.parametrize(
    ("config", "worker_limit"),
    [
        (CARTPOLE, None),
        # The child's env keeps its TimeLimit (12); the in-process one has it
        # taken off and the engine cuts at min(20, 12): the same steps.
        (EnvConfig("CartPole-v1", max_episode_length=12), 20),
        (EnvConfig("CartPole-v1", max_episode_length=12), 7),
    ],
)
def test_vec_worker_batches_equal_the_in_process_ones(
    config: EnvConfig, worker_limit: int | None
) -> None:
    units = make_units(0, 5, range(11))
    here = VecWorker(n_envs=3, env=config, policy=mlp(), max_episode_length=worker_limit)
    there = VecWorker(
        n_envs=3, env=in_children(config), policy=mlp(), max_episode_length=worker_limit
    )
    try:
        assert len(set(children_of(there).pids) - {os.getpid()}) == 3
        assert there.envs == [None, None, None]  # no env objects in this process
        assert there.env_spec == here.env_spec
        assert_same_batches(there.run(units), here.run(units))
    finally:
        here.shutdown()
        there.shutdown()


def test_fragments_and_their_replays_equal_the_in_process_ones() -> None:
    here = VecWorker(n_envs=2, env=CARTPOLE, policy=mlp())
    there = VecWorker(n_envs=2, env=in_children(CARTPOLE), policy=mlp())
    try:
        for call in range(4):
            assert_same_batches(
                there.collect_fragments(7, base_seed=9), here.collect_fragments(7, base_seed=9)
            )
            if call == 1:
                # Episodes between windows use the envs: the streams' episodes
                # are rebuilt by replaying their actions in the children.
                units = make_units(1, 0, range(3))
                assert_same_batches(there.run(units), here.run(units))
    finally:
        here.shutdown()
        there.shutdown()


def test_a_killed_child_is_an_env_crash_rebuilt_and_rerun_from_its_seeds() -> None:
    units = make_units(0, 0, range(6))
    clean = VecWorker(n_envs=2, env=CARTPOLE, policy=mlp()).run(units)
    worker = VecWorker(n_envs=2, env=in_children(CARTPOLE), policy=mlp(), max_env_restarts=3)
    try:
        worker.submit(units)
        for _ in range(5):
            worker.step()
        children = children_of(worker)
        victim = children.pids[1]
        os.kill(victim, signal.SIGKILL)
        batch = finish(worker)
        assert worker.restarts == 1
        assert children.pids[1] != victim and children.pids[0] != victim
        # Nothing lost, nothing twice: the episode on slot 1 ran again from its seeds.
        assert_same_batches(batch, clean)
    finally:
        worker.shutdown()


def test_a_killed_child_past_the_budget_is_an_env_error_and_the_worker_goes_on() -> None:
    worker = VecWorker(
        n_envs=2, env=in_children(CARTPOLE), policy=mlp(), max_env_restarts=0, name="w-3"
    )
    try:
        worker.submit(make_units(0, 0, range(4)))
        worker.step()
        os.kill(children_of(worker).pids[0], signal.SIGKILL)
        with pytest.raises(EnvError, match="killed by SIGKILL") as info:
            finish(worker)
        assert (info.value.worker, info.value.env_index) == ("w-3", 0)
        assert "restart budget spent" in str(info.value)
        # Only the killed episode is lost: the others run, slot 0 on a new child.
        batch = finish(worker)
        assert batch.episode_infos["episode_index"].tolist() == [1, 2, 3]
    finally:
        worker.shutdown()


def test_an_env_raising_in_its_child_is_restarted_as_in_process() -> None:
    crashing = EnvConfig(
        "rlfleet/Crashing-v0",
        {"crash_at_step": 7, "crash_in": "reset", "length": 5},
        imports=("rlfleet.envs.testing",),
    )
    units = make_units(0, 0, range(5))
    here = VecWorker(n_envs=1, env=crashing)
    there = VecWorker(n_envs=1, env=in_children(crashing))
    try:
        assert_same_batches(there.run(units), here.run(units))
        assert there.restarts == here.restarts == 2
    finally:
        here.shutdown()
        there.shutdown()


def test_fleet_of_subprocess_workers_equals_local_in_process_sampling() -> None:
    """Real worker processes, each slot's env in a child of its worker."""
    policy = mlp()
    with (
        LocalSampler(CARTPOLE, n_workers=2, envs_per_worker=2, seed=4) as local,
        Fleet.local(2, 2, in_children(CARTPOLE), seed=4) as remote,
    ):
        worker_ids = {w.worker_id for w in remote.status().workers}
        for call in (
            lambda s: s.obtain_samples(0, 300, agent_update=policy),
            lambda s: s.obtain_episodes(5),
            lambda s: s.obtain_fragments(2 * 4 * 6, 6),
        ):
            expected, got = call(local), call(remote)
            assert_same_batch(expected, got, worker_ids)
            assert np.all(got.episode_infos["env_seed"] >= 0)  # episodes keep their seeds


def test_the_config_travels_as_json_and_leases_refuse_it_by_name() -> None:
    config = in_children(EnvConfig("CartPole-v1", max_episode_length=9))
    assert EnvConfig.from_json(config.to_json()) == config and not config.native
    assert config().spec is not None  # one env per slot: the config is a factory
    with pytest.raises(ConfigError, match="give one of"):
        EnvConfig("CartPole-v1", vectorization="subprocesses")
    assert_lease_refused("subprocess")
