"""VecWorker: incremental API, updates, fragments, crashes, NaNs, bad actions.

Expectations are computed by hand from rlfleet/Counter-v0 (observation =
steps taken, reward 1, terminates after ``length`` steps) or by replaying
an episode step by step with plain gymnasium and the episode's own seeds.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import rlfleet.envs.testing  # noqa: F401  (registers the test envs)
from rlfleet.core import EnvSpec, EpisodeBatch, StepType
from rlfleet.core.seeding import episode_seeds, stream_seeds
from rlfleet.envs.config import EnvConfig
from rlfleet.envs.testing import CounterEnv, OffSpaceEnv
from rlfleet.errors import ConfigError, EnvError, InvalidBatchError, PolicyError, UsageError
from rlfleet.policies import MLPCategoricalPolicy, MLPGaussianPolicy, PolicySpec, RandomPolicy
from rlfleet.policies.base import Policy
from rlfleet.worker import EnvRestartBudget, EpisodeUnit, VecWorker, make_units
from rlfleet.worker._restarts import RestartLedger

F, M, TE, TO = StepType.FIRST, StepType.MID, StepType.TERMINAL, StepType.TIMEOUT
CARTPOLE = EnvConfig("CartPole-v1")


def counter(length: int = 5) -> EnvConfig:
    return EnvConfig("rlfleet/Counter-v0", {"length": length})


def cartpole_spec() -> EnvSpec:
    return CARTPOLE.env_spec()


def mlp(seed: int = 0) -> MLPCategoricalPolicy:
    return MLPCategoricalPolicy(cartpole_spec(), hidden_sizes=(16, 16), seed=seed)


def batch_fields(batch: Any) -> dict[str, np.ndarray]:
    """Every array of a batch, infos flattened to 'field.key'."""
    fields = {
        name: getattr(batch, name)
        for name in ("observations", "last_observations", "actions", "rewards", "step_types")
    }
    fields["lengths"] = batch.lengths
    for name in ("episode_infos", "env_infos", "agent_infos"):
        for key, value in getattr(batch, name).items():
            fields[f"{name}.{key}"] = value
    return fields


def assert_same_batches(a: Any, b: Any, *, ignore: tuple[str, ...] = ()) -> None:
    fa, fb = batch_fields(a), batch_fields(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        if key not in ignore:
            assert np.array_equal(fa[key], fb[key]), key


def replay(config: EnvConfig, policy: Policy, unit: EpisodeUnit, max_len: int | None = None):
    """Runs one episode with plain gymnasium and the unit's seeds."""
    env = config()
    rng = np.random.default_rng(unit.policy_seed)
    obs, _ = env.reset(seed=unit.env_seed)
    observations, actions, rewards, log_probs = [], [], [], []
    while True:
        action, infos = policy.get_actions(obs[None], [rng])
        observations.append(obs)
        actions.append(action[0])
        log_probs.append(infos["log_prob"][0])
        obs, reward, terminated, truncated, _ = env.step(action[0])
        rewards.append(reward)
        if terminated or truncated or len(rewards) == max_len:
            env.close()
            return np.array(observations), np.array(actions), np.array(rewards), obs, log_probs


# ---------------------------------------------------------------- episodes


def test_episode_matches_a_plain_gymnasium_replay_with_its_seeds():
    policy = mlp()
    worker = VecWorker(n_envs=3, env=CARTPOLE, policy=policy)
    units = make_units(5, 2, range(4))
    batch = worker.run(units)
    for i, (unit, obs, last) in enumerate(
        zip(units, batch.observations_list, batch.last_observations, strict=True)
    ):
        observations, actions, rewards, last_obs, log_probs = replay(CARTPOLE, policy, unit)
        np.testing.assert_array_equal(obs, observations)
        np.testing.assert_array_equal(batch.actions_list[i], actions)
        np.testing.assert_array_equal(last, last_obs)
        start = batch.lengths[:i].sum()
        np.testing.assert_array_equal(batch.rewards[start : start + len(rewards)], rewards)
        np.testing.assert_array_equal(
            batch.agent_infos["log_prob"][start : start + len(rewards)], log_probs
        )
    assert batch.episode_infos["env_seed"].tolist() == [u.env_seed for u in units]
    assert batch.episode_infos["policy_seed"].tolist() == [u.policy_seed for u in units]
    assert batch.episode_infos["episode_index"].tolist() == [0, 1, 2, 3]
    assert batch.episode_infos["agent_version"].tolist() == [0] * 4
    assert all(v.dtype == np.int64 for v in batch.episode_infos.values())


@pytest.mark.parametrize("worker_limit", [None, 100])
@pytest.mark.parametrize(
    ("env_id", "policy_class"),
    [("CartPole-v1", MLPCategoricalPolicy), ("Pendulum-v1", MLPGaussianPolicy)],
)
def test_env_configs_are_built_without_the_redundant_wrappers_and_give_the_same_bits(
    env_id: str,
    policy_class: type[MLPCategoricalPolicy | MLPGaussianPolicy],
    worker_limit: int | None,
):
    # docs/data_plane.md: a worker builds an EnvConfig's envs without
    # OrderEnforcing, PassiveEnvChecker and TimeLimit (the engine truncates
    # at TimeLimit's step, even under a larger worker limit), and every
    # batch is bit for bit the batch of plain gym.make envs.
    config = EnvConfig(env_id, max_episode_length=12)
    policy = policy_class(config.env_spec(), hidden_sizes=(8,), seed=1)
    lean = VecWorker(n_envs=3, env=config, policy=policy, max_episode_length=worker_limit)
    wrapped = VecWorker(
        n_envs=3,
        env=lambda: gym.make(env_id, max_episode_steps=12),
        policy=policy,
        max_episode_length=worker_limit,
    )
    assert not isinstance(lean.envs[0], gym.Wrapper)
    assert "PassiveEnvChecker" in str(wrapped.envs[0]) and "OrderEnforcing" in str(wrapped.envs[0])
    assert "TimeLimit" in str(wrapped.envs[0])
    assert lean.env_spec == wrapped.env_spec
    units = make_units(3, 0, range(12))
    batch = lean.run(units)
    assert_same_batches(batch, wrapped.run(units))
    # Time-limited episodes are covered (and, for CartPole, terminated ones).
    assert (batch.step_types == TO).sum() >= (3 if env_id == "CartPole-v1" else 12)
    assert batch.lengths.max() == 12
    if env_id == "CartPole-v1":
        assert (batch.step_types == TE).any()


def test_a_time_limit_under_a_registered_wrapper_stays_on_the_env():
    # gymnasium applies a spec's additional_wrappers outside TimeLimit:
    # taking it off would change the env under them, so it stays.
    from gymnasium.envs.registration import WrapperSpec

    env_id = "rlfleet/test-ClippedCartPole-v0"
    if env_id not in gym.registry:
        clip = WrapperSpec("ClipReward", "gymnasium.wrappers:ClipReward", {"max_reward": 0.5})
        gym.register(
            env_id,
            entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv",
            max_episode_steps=5,
            additional_wrappers=(clip,),
        )
    worker = VecWorker(n_envs=1, env=EnvConfig(env_id), max_episode_length=50)
    assert str(worker.envs[0]).startswith("<ClipReward<TimeLimit<")
    batch = worker.run(make_units(0, 0, range(3)))
    assert batch.lengths.tolist() == [5, 5, 5]
    assert (batch.step_types == TO).sum() == 3
    assert set(batch.rewards.tolist()) == {0.5}


def test_generators_reused_across_episodes_sample_as_default_rng():
    # 40 units: their generator states are computed vectorised (prepared by
    # hand, or with the queue when the first starts), the slots' generators
    # reused from episode to episode; every episode still samples exactly as
    # default_rng(policy_seed) does in a plain replay.
    policy = mlp()
    units = make_units(5, 2, range(40))
    queued = VecWorker(n_envs=3, env=CARTPOLE, policy=policy).run(units)
    prepared_worker = VecWorker(n_envs=2, env=CARTPOLE, policy=policy)
    prepared_worker.prepare(units)
    for start in range(0, 40, 7):  # submitted a few at a time, as a remote worker does
        prepared_worker.submit(units[start : start + 7])
        while not prepared_worker.idle:
            prepared_worker.step()
    prepared = prepared_worker.take_finished()
    assert_same_batches(queued, prepared, ignore=("episode_infos.worker",))
    for i in (0, 17, 39):
        _, actions, _, _, log_probs = replay(CARTPOLE, policy, units[i])
        start = queued.lengths[:i].sum()
        np.testing.assert_array_equal(queued.actions_list[i], actions)
        np.testing.assert_array_equal(
            queued.agent_infos["log_prob"][start : start + len(actions)], log_probs
        )


def test_counter_episode_by_hand():
    worker = VecWorker(n_envs=2, env=counter(4), worker_number=3)
    batch = worker.run(make_units(0, 0, range(2)))
    np.testing.assert_array_equal(batch.observations[:, 0], [0, 1, 2, 3, 0, 1, 2, 3])
    np.testing.assert_array_equal(batch.last_observations[:, 0], [4, 4])
    np.testing.assert_array_equal(batch.rewards, np.ones(8))
    np.testing.assert_array_equal(batch.step_types, [F, M, M, TE, F, M, M, TE])
    np.testing.assert_array_equal(batch.lengths, [4, 4])
    assert batch.episode_infos["worker"].tolist() == [3, 3]
    assert batch.env_infos == {}
    assert batch.env_spec.max_episode_length is None


def test_max_episode_length_cuts_with_timeout():
    worker = VecWorker(n_envs=1, env=counter(10), max_episode_length=3)
    batch = worker.run(make_units(0, 0, [0]))
    np.testing.assert_array_equal(batch.step_types, [F, M, TO])
    np.testing.assert_array_equal(batch.last_observations[:, 0], [3])
    assert worker.env_spec.max_episode_length == 3


def test_long_episodes_grow_the_ring_and_wrap_around():
    # The ring starts at 64 rows; slots start 2 apart so the copies wrap.
    worker = VecWorker(n_envs=3, env=counter(150))
    worker.submit(make_units(0, 0, [0]))
    worker.step()
    worker.step()
    worker.submit(make_units(0, 0, range(1, 5)))
    batch = worker.run([])
    assert batch.lengths.tolist() == [150] * 5
    np.testing.assert_array_equal(batch.observations[:, 0], np.tile(np.arange(150), 5))
    np.testing.assert_array_equal(batch.last_observations[:, 0], [150] * 5)


def test_one_step_episode_is_terminal_not_first():
    batch = VecWorker(n_envs=1, env=counter(1)).run(make_units(0, 0, [0]))
    np.testing.assert_array_equal(batch.step_types, [TE])


def test_env_spec_takes_the_limit_from_worker_then_config_then_env():
    assert VecWorker(n_envs=1, env=CARTPOLE).env_spec.max_episode_length == 500
    limited = EnvConfig("CartPole-v1", max_episode_length=7)
    assert VecWorker(n_envs=1, env=limited).env_spec.max_episode_length == 7
    worker = VecWorker(n_envs=1, env=limited, max_episode_length=5)
    assert worker.env_spec.max_episode_length == 5


def test_acts_randomly_before_a_policy_is_given():
    worker = VecWorker(n_envs=2, env=CARTPOLE)
    assert isinstance(worker.policy, RandomPolicy)
    batch = worker.run(make_units(0, 0, range(3)))
    assert batch.n_episodes == 3
    assert batch.agent_infos == {}


def test_no_env_is_a_config_error():
    worker = VecWorker(n_envs=1)
    worker.submit(make_units(0, 0, [0]))
    with pytest.raises(ConfigError, match="no env"):
        worker.step()
    with pytest.raises(ConfigError, match="no env"):
        _ = worker.env_spec


def test_policy_spec_before_env_is_built_with_the_env():
    worker = VecWorker(n_envs=1, policy=PolicySpec("mlp-categorical", {"hidden_sizes": [8]}))
    assert worker.policy is None
    worker.update_env(CARTPOLE)
    assert isinstance(worker.policy, MLPCategoricalPolicy)
    assert worker.policy.hidden_sizes == (8,)


def test_policy_instance_before_env_is_kept():
    policy = mlp()
    worker = VecWorker(n_envs=1, policy=policy)
    assert worker.policy is policy
    worker.update_env(CARTPOLE)
    assert worker.policy is policy
    assert worker.run(make_units(0, 0, [0])).agent_infos.keys() == {"log_prob", "logits"}


def test_dict_observations_are_rejected_with_a_hint():
    def dict_env() -> gym.Env:
        return gym.wrappers.TransformObservation(
            gym.make("CartPole-v1"),
            lambda obs: {"x": obs},
            gym.spaces.Dict({"x": gym.make("CartPole-v1").observation_space}),
        )

    with pytest.raises(ConfigError, match="FlattenObservation"):
        VecWorker(n_envs=1, env=dict_env)


# ------------------------------------------------------------ incremental API


def test_incremental_counts_by_hand():
    worker = VecWorker(n_envs=2, env=counter(3))
    assert worker.idle
    assert worker.step() == 0
    worker.submit(make_units(0, 0, range(5)))
    assert (worker.queued_count, worker.active_count, worker.finished_count) == (5, 0, 0)
    taken = [worker.step() for _ in range(10)]
    # Units 0,1 run steps 1-3, units 2,3 steps 4-6, unit 4 alone steps 7-9.
    assert taken == [2, 2, 2, 2, 2, 2, 1, 1, 1, 0]
    assert worker.idle and worker.finished_count == 5 and worker.finished_steps == 15


def test_counts_while_running():
    worker = VecWorker(n_envs=2, env=counter(3))
    worker.submit(make_units(0, 0, range(3)))
    worker.step()
    assert (worker.queued_count, worker.active_count, worker.active_steps) == (1, 2, 2)
    worker.step()
    worker.step()
    assert (worker.finished_count, worker.active_count, worker.finished_steps) == (2, 0, 6)
    assert not worker.idle  # unit 2 still queued


def test_take_finished_orders_by_request_then_index_and_limits():
    worker = VecWorker(n_envs=3, env=CARTPOLE)
    units = [EpisodeUnit.seeded(0, r, i) for r, i in [(1, 5), (0, 2), (1, 0), (0, 7)]]
    worker.submit(units)
    while not worker.idle:
        worker.step()
    first = worker.take_finished(max_episodes=3)
    assert first is not None
    assert first.episode_infos["episode_index"].tolist() == [2, 7, 0]
    rest = worker.take_finished()
    assert rest is not None and rest.episode_infos["episode_index"].tolist() == [5]
    assert worker.take_finished() is None
    assert worker.finished_steps == 0


def test_take_finished_of_one_request():
    worker = VecWorker(n_envs=2, env=counter(2))
    worker.submit([EpisodeUnit.seeded(0, r, i) for r in (0, 1) for i in (0, 1)])
    while not worker.idle:
        worker.step()
    batch = worker.take_finished(request=1)
    assert batch is not None
    assert batch.episode_infos["env_seed"].tolist() == [episode_seeds(0, 1, i)[0] for i in (0, 1)]
    assert worker.finished_count == 2


def test_cancel_drops_queued_running_and_finished_episodes():
    worker = VecWorker(n_envs=2, env=counter(3))
    worker.submit(make_units(0, 0, range(6)))
    for _ in range(4):  # 0,1 finished; 2,3 one step in; 4,5 queued
        worker.step()
    assert worker.cancel([1, 3, 5]) == [1, 3, 5]
    assert (worker.finished_count, worker.active_count, worker.queued_count) == (1, 1, 1)
    batch = worker.run([])
    assert batch.episode_infos["episode_index"].tolist() == [0, 2, 4]
    assert batch.lengths.tolist() == [3, 3, 3]  # episode 2 kept running undisturbed


def test_cancel_by_request_and_everything():
    worker = VecWorker(n_envs=1, env=counter(3))
    worker.submit([EpisodeUnit.seeded(0, r, i) for r in (0, 1) for i in (0, 1)])
    worker.step()
    assert worker.cancel(request=1) == [0, 1]
    assert worker.cancel() == [0, 1]
    assert worker.idle and worker.finished_count == 0


def test_submit_rejects_other_objects():
    """The first object that is no unit is named, and none of the list is queued."""
    worker = VecWorker(n_envs=1, env=counter())
    with pytest.raises(TypeError, match="EpisodeUnit"):
        worker.submit([(0, 1, 2)])  # type: ignore[list-item]
    units = [EpisodeUnit.seeded(0, 0, 0), [1], EpisodeUnit.seeded(0, 0, 1), (0, 1, 2)]
    with pytest.raises(TypeError, match=r"EpisodeUnit objects, got list$"):
        worker.submit(units)  # type: ignore[arg-type]
    assert worker.queued_count == 0


def test_episode_unit_validation():
    with pytest.raises(ConfigError, match="env_seed"):
        EpisodeUnit(0, -1, 0)
    with pytest.raises(ConfigError, match="32 bits"):
        EpisodeUnit(0, 0, 1 << 32)
    with pytest.raises(ConfigError, match="episode_index"):
        EpisodeUnit(True, 0, 0)
    assert EpisodeUnit.seeded(1, 2, 3) == EpisodeUnit(3, *episode_seeds(1, 2, 3), request=2)


def test_shutdown_closes_envs_and_refuses_work():
    closed: list[gym.Env] = []

    class Closing(CounterEnv):
        def close(self) -> None:
            closed.append(self)

    worker = VecWorker(n_envs=2, env=Closing)
    envs = worker.envs
    worker.shutdown()
    worker.shutdown()
    assert closed == envs
    assert worker.envs == [None, None]
    with pytest.raises(UsageError, match="shut down"):
        worker.step()


# ---------------------------------------------------------------- updates


def test_agent_update_aborts_and_requeues_in_flight_episodes():
    policy = mlp()
    worker = VecWorker(n_envs=2, env=CARTPOLE, policy=policy)
    units = make_units(0, 0, range(4))
    worker.submit(units)
    worker.step()
    worker.step()
    params = {k: v * 3 for k, v in policy.get_param_values().items()}
    assert worker.update_agent(params) == 1
    assert (worker.active_count, worker.queued_count) == (0, 4)
    batch = worker.run([])

    fresh_policy = mlp()
    fresh_policy.set_param_values(params)
    fresh = VecWorker(n_envs=1, env=CARTPOLE, policy=fresh_policy).run(units)
    assert_same_batches(batch, fresh, ignore=("episode_infos.agent_version",))
    assert batch.episode_infos["agent_version"].tolist() == [1] * 4


def test_agent_update_keeps_finished_episodes_and_their_version():
    worker = VecWorker(n_envs=1, env=counter(2), policy=RandomPolicy(counter(2).env_spec()))
    worker.submit(make_units(0, 0, range(2)))
    worker.step()
    worker.step()  # episode 0 done, episode 1 not started
    worker.update_agent(RandomPolicy(counter(2).env_spec(), seed=1), version=7)
    batch = worker.run([])
    assert batch.episode_infos["agent_version"].tolist() == [0, 7]
    assert worker.agent_version == 7


def test_agent_update_none_is_a_no_op_and_bad_updates_change_nothing():
    policy = mlp()
    worker = VecWorker(n_envs=1, env=CARTPOLE, policy=policy)
    worker.submit(make_units(0, 0, [0]))
    worker.step()
    assert worker.update_agent(None) == 0
    assert worker.active_count == 1
    with pytest.raises(PolicyError):
        worker.update_agent({"nope": np.zeros(3)})
    with pytest.raises(TypeError, match="agent update"):
        worker.update_agent(3.5)  # type: ignore[arg-type]
    assert worker.agent_version == 0 and worker.active_count == 1


def test_agent_update_with_a_spec_builds_seeded_weights():
    worker_a = VecWorker(n_envs=1, seed=4, env=CARTPOLE)
    worker_b = VecWorker(n_envs=2, seed=4, env=CARTPOLE)
    for worker in (worker_a, worker_b):
        worker.update_agent("mlp-categorical")
    a, b = worker_a.policy, worker_b.policy
    assert a is not None and b is not None and a is not b
    for key, value in a.get_param_values().items():
        np.testing.assert_array_equal(value, b.get_param_values()[key])


def test_policy_for_other_spaces_is_a_policy_error_at_the_next_step():
    worker = VecWorker(n_envs=1, env=counter(), policy=mlp())
    worker.submit(make_units(0, 0, [0]))
    with pytest.raises(PolicyError, match="observation_space"):
        worker.step()


def test_env_update_aborts_requeues_and_switches_env():
    worker = VecWorker(n_envs=2, env=counter(3))
    worker.submit(make_units(0, 0, range(3)))
    worker.step()
    old_envs = worker.envs
    worker.update_env(counter(5))
    assert (worker.active_count, worker.queued_count) == (0, 3)
    assert all(env is not old for env, old in zip(worker.envs, old_envs, strict=True))
    batch = worker.run([])
    assert batch.lengths.tolist() == [5, 5, 5]


def test_a_batch_never_mixes_envs():
    worker = VecWorker(n_envs=1, env=counter(3))
    worker.submit(make_units(0, 0, [0]))
    while not worker.idle:
        worker.step()
    worker.update_env(counter(5))
    worker.submit(make_units(0, 0, [1]))
    while not worker.idle:
        worker.step()
    old, new = worker.take_finished(), worker.take_finished()
    assert old is not None and new is not None
    assert old.lengths.tolist() == [3] and new.lengths.tolist() == [5]
    assert old.env_spec.observation_space != new.env_spec.observation_space


def test_env_update_with_an_instance_uses_it_for_slot_zero():
    env = gym.make("CartPole-v1")
    worker = VecWorker(n_envs=2, env=env)
    assert worker.envs[0] is env
    assert worker.envs[1] is not env
    assert worker.run(make_units(0, 0, range(2))).n_episodes == 2


def test_bad_env_update_keeps_the_old_env():
    worker = VecWorker(n_envs=1, env=counter(3))
    with pytest.raises(ConfigError):
        worker.update_env(EnvConfig("NoSuchEnv-v0"))
    with pytest.raises(TypeError, match="env update"):
        worker.update_env(42)  # type: ignore[arg-type]
    assert worker.run(make_units(0, 0, [0])).lengths.tolist() == [3]


# ------------------------------------------------------------ env infos


class _InfoEnv(gym.Env):
    """Counts steps; info 'step' at every step, 'final' at the last one only."""

    observation_space = gym.spaces.Box(0, 10, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        info = {"step": self.t, "pos": {"x": float(self.t)}}
        if self.t == 3:
            info["final"] = True
        return np.full(1, self.t, np.float32), 0.5, self.t == 3, False, info


def test_discrete_observations_and_gymnasium_infos():
    worker = VecWorker(n_envs=2, env=EnvConfig("FrozenLake-v1"), policy="mlp-categorical")
    batch = worker.run(make_units(0, 0, range(4)))
    assert batch.observations.dtype == np.int64 and batch.observations.ndim == 1
    # FrozenLake reports the transition probability at every step.
    np.testing.assert_allclose(batch.env_infos["prob"], 1 / 3)
    starts = np.concatenate([[0], np.cumsum(batch.lengths)[:-1]])
    assert (batch.observations[starts] == 0).all()  # every episode starts in cell 0


def test_env_infos_keep_keys_present_at_every_step():
    batch = VecWorker(n_envs=2, env=_InfoEnv).run(make_units(0, 0, range(2)))
    assert sorted(batch.env_infos) == ["pos", "step"]
    np.testing.assert_array_equal(batch.env_infos["step"], [1, 2, 3, 1, 2, 3])
    np.testing.assert_array_equal(batch.env_infos["pos"]["x"], [1.0, 2.0, 3.0] * 2)


class _AlternateInfoEnv(_InfoEnv):
    """Every other episode adds an info key at each of its steps."""

    resets = 0

    def reset(self, *, seed=None, options=None):
        self.resets += 1
        return super().reset(seed=seed, options=options)

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if self.resets % 2:
            info["in_odd_episodes_only"] = 1
        return observation, reward, terminated, truncated, info


def test_env_infos_keep_keys_present_in_every_episode(caplog):
    with caplog.at_level("WARNING", logger="rlfleet.worker"):
        batch = VecWorker(n_envs=1, env=_AlternateInfoEnv).run(make_units(0, 0, range(3)))
    assert sorted(batch.env_infos) == ["pos", "step"]
    np.testing.assert_array_equal(batch.env_infos["step"], [1, 2, 3] * 3)
    assert "'in_odd_episodes_only' is present in some episodes" in caplog.text
    # Alone, the odd episodes keep it.
    worker = VecWorker(n_envs=1, env=_AlternateInfoEnv)
    odd = worker.run(make_units(0, 0, [0]))
    np.testing.assert_array_equal(odd.env_infos["in_odd_episodes_only"], [1, 1, 1])


# ---------------------------------------------------------------- fragments


def piece_table(batch: Any) -> list[tuple[int, int, int, list[float], float, list[int]]]:
    """(stream, episode, fragment, observations, last observation, step types) per piece."""
    infos = batch.episode_infos
    rows = []
    start = 0
    for i, length in enumerate(batch.lengths.tolist()):
        rows.append(
            (
                int(infos["stream"][i]),
                int(infos["episode_index"][i]),
                int(infos["fragment_index"][i]),
                batch.observations[start : start + length, 0].tolist(),
                float(batch.last_observations[i, 0]),
                batch.step_types[start : start + length].tolist(),
            )
        )
        start += length
    return rows


def test_fragments_by_hand():
    worker = VecWorker(n_envs=1, env=counter(5))
    calls = [
        piece_table(worker.collect_fragments(3, base_seed=0, first_stream=4)) for _ in range(3)
    ]
    assert calls == [
        [(4, 0, 0, [0, 1, 2], 3, [F, M, M])],
        [(4, 0, 1, [3, 4], 5, [M, TE]), (4, 1, 0, [0], 1, [F])],
        [(4, 1, 1, [1, 2, 3], 4, [M, M, M])],
    ]


def test_fragments_have_exact_lengths_and_continuous_observations():
    worker = VecWorker(n_envs=3, env=CARTPOLE, policy=mlp())
    previous_last: dict[tuple[int, int], np.ndarray] = {}
    for _ in range(6):
        batch = worker.collect_fragments(7, base_seed=1, first_stream=0)
        streams = batch.episode_infos["stream"]
        for stream in range(3):
            assert batch.lengths[streams == stream].sum() == 7
        starts = np.concatenate([[0], np.cumsum(batch.lengths)[:-1]])
        for i, start in enumerate(starts):
            key = (int(streams[i]), int(batch.episode_infos["episode_index"][i]))
            first = batch.step_types[start]
            if batch.episode_infos["fragment_index"][i] == 0:
                assert first == F or batch.lengths[i] == 1
            else:
                assert first == M
                np.testing.assert_array_equal(batch.observations[start], previous_last[key])
            previous_last[key] = batch.last_observations[i]
            last = batch.step_types[start + batch.lengths[i] - 1]
            assert last in (M, TE, TO) or (last == F and batch.lengths[i] == 1)


def test_fragment_seeds_come_from_stream_seeds():
    worker = VecWorker(n_envs=2, env=counter(2))
    batch = worker.collect_fragments(5, base_seed=9, first_stream=10)
    infos = batch.episode_infos
    for stream, episode, env_seed, policy_seed in zip(
        infos["stream"],
        infos["episode_index"],
        infos["env_seed"],
        infos["policy_seed"],
        strict=True,
    ):
        assert (env_seed, policy_seed) == stream_seeds(9, int(stream), int(episode))
    assert infos["stream"].tolist() == [10, 10, 10, 11, 11, 11]
    assert infos["episode_index"].tolist() == [0, 1, 2, 0, 1, 2]


def test_fragments_record_the_agent_version_of_each_piece():
    worker = VecWorker(n_envs=1, env=counter(10), policy=RandomPolicy(counter(10).env_spec()))
    first = worker.collect_fragments(4, base_seed=0, first_stream=0)
    worker.update_agent(RandomPolicy(counter(10).env_spec(), seed=5))
    second = worker.collect_fragments(4, base_seed=0, first_stream=0)
    assert first.episode_infos["agent_version"].tolist() == [0]
    assert second.episode_infos["agent_version"].tolist() == [1]
    assert second.episode_infos["fragment_index"].tolist() == [1]  # the episode went on
    assert second.observations[0, 0] == 4


def test_fragment_streams_do_not_depend_on_the_layout():
    one = VecWorker(n_envs=4, env=CARTPOLE, policy=mlp())
    two = [VecWorker(n_envs=2, env=CARTPOLE, policy=mlp(), worker_number=w) for w in (0, 1)]
    for _ in range(3):
        whole = one.collect_fragments(9, base_seed=2, first_stream=0)
        parts = [w.collect_fragments(9, base_seed=2, first_stream=2 * n) for n, w in enumerate(two)]
        assert_same_batches(
            whole, EpisodeBatch.concatenate(*parts), ignore=("episode_infos.worker",)
        )


def test_fragment_windows_truncate_at_the_time_limit_the_wrapper_would():
    # The engine enforces the TimeLimit taken off the env across windows
    # (a parked episode goes on counting): the same fragments as gym.make envs.
    config = EnvConfig("CartPole-v1", max_episode_length=12)
    lean = VecWorker(n_envs=3, env=config, policy=mlp())
    wrapped = VecWorker(
        n_envs=3, env=lambda: gym.make("CartPole-v1", max_episode_steps=12), policy=mlp()
    )
    timeouts = 0
    for _ in range(6):
        batch = lean.collect_fragments(5, base_seed=4, first_stream=0)
        assert_same_batches(batch, wrapped.collect_fragments(5, base_seed=4, first_stream=0))
        timeouts += int((batch.step_types == TO).sum())
    assert timeouts >= 3


def test_fragments_need_an_idle_worker_and_units_between_change_no_stream():
    worker = VecWorker(n_envs=1, env=counter(10))
    worker.collect_fragments(3, base_seed=0, first_stream=0)
    worker.submit(make_units(0, 0, [0]))
    with pytest.raises(UsageError, match="queued"):
        worker.collect_fragments(3, base_seed=0, first_stream=0)
    worker.run([])
    batch = worker.collect_fragments(3, base_seed=0, first_stream=0)
    # The episode goes on where it stopped: its env was rebuilt by replay.
    assert piece_table(batch) == [(0, 0, 1, [3, 4, 5], 6, [M, M, M])]


def test_other_first_stream_starts_other_streams():
    worker = VecWorker(n_envs=1, env=counter(10))
    worker.collect_fragments(3, base_seed=0, first_stream=0)
    batch = worker.collect_fragments(3, base_seed=0, first_stream=1)
    assert piece_table(batch) == [(1, 0, 0, [0, 1, 2], 3, [F, M, M])]


# ------------------------------------------------------------ crashing envs


def crashing(at: int, where: str, length: int = 5) -> EnvConfig:
    return EnvConfig(
        "rlfleet/Crashing-v0", {"crash_at_step": at, "crash_in": where, "length": length}
    )


def test_transient_reset_crash_is_restarted_and_rerun_from_its_seed():
    units = make_units(0, 0, range(5))
    clean = VecWorker(n_envs=1, env=counter(5)).run(units)
    worker = VecWorker(n_envs=1, env=crashing(7, "reset"))
    batch = worker.run(units)
    # A fresh env crashes at its first reset after 7 steps: before episodes 2 and 4.
    assert worker.restarts == 2
    assert_same_batches(batch, clean)


def test_step_crash_past_the_budget_raises_env_error_and_worker_stays_usable():
    worker = VecWorker(n_envs=1, env=crashing(3, "step"), max_env_restarts=2, name="w-7")
    worker.submit(make_units(0, 0, range(2)))
    with pytest.raises(EnvError) as info:
        while not worker.idle:
            worker.step()
    error = info.value
    assert (error.worker, error.env_index, error.step) == ("w-7", 0, 3)
    assert "RuntimeError" in str(error) and "crashed on purpose" in str(error)
    assert "restart budget spent" in str(error)
    assert error.remote_traceback is not None
    assert "envs/testing.py" in error.remote_traceback  # the env's own frame
    assert worker.restarts == 2
    # The crashing unit was dropped; the worker goes on with the next one.
    assert worker.queued_count == 1
    worker.update_env(counter(2))
    assert worker.run([]).episode_infos["episode_index"].tolist() == [1]


def test_a_crash_does_not_disturb_the_other_slots():
    made: list[gym.Env] = []

    def factory() -> gym.Env:
        # Slot 0 and every rebuild crash at step 2; slot 1 is a plain counter.
        env = gym.make("rlfleet/Counter-v0", length=4) if len(made) == 1 else None
        env = env or gym.make("rlfleet/Crashing-v0", crash_at_step=2, length=4)
        made.append(env)
        return env

    worker = VecWorker(n_envs=2, env=factory, max_env_restarts=1)
    worker.submit(make_units(0, 0, range(2)))
    with pytest.raises(EnvError) as info:
        for _ in range(10):
            worker.step()
    assert info.value.env_index == 0
    while not worker.idle:
        worker.step()
    batch = worker.take_finished()
    assert batch is not None
    clean = VecWorker(n_envs=1, env=counter(4)).run(make_units(0, 0, [1]))
    assert_same_batches(batch, clean)


class _WrongShapeEnv(CounterEnv):
    """Returns a (2,) observation from its last step, for a (1,) space."""

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if terminated:
            observation = np.zeros(2, np.float32)
        return observation, reward, terminated, truncated, info


def test_observation_of_the_wrong_shape_is_an_env_failure():
    worker = VecWorker(n_envs=2, env=lambda: _WrongShapeEnv(length=2), max_env_restarts=0)
    worker.submit(make_units(0, 0, range(2)))
    worker.step()
    with pytest.raises(EnvError, match=r"shape \(2,\)") as info:
        worker.step()
    assert info.value.env_index == 0 and info.value.step == 2
    assert "also in the same step" in "\n".join(info.value.__notes__)  # env 1 failed too
    assert worker.idle and worker.finished_count == 0


def test_env_instance_cannot_be_rebuilt():
    env = gym.make("rlfleet/Crashing-v0", crash_at_step=1)
    worker = VecWorker(n_envs=1, env=env)
    worker.submit(make_units(0, 0, [0]))
    with pytest.raises(EnvError, match="cannot be rebuilt"):
        worker.step()


def test_fragment_crash_cuts_the_piece_and_moves_to_the_next_episode():
    worker = VecWorker(n_envs=1, env=crashing(3, "step", length=5), max_env_restarts=5)
    batch = worker.collect_fragments(5, base_seed=0, first_stream=0)
    # Each episode crashes in its 3rd step: pieces of 2 steps, cut (MID).
    assert piece_table(batch) == [
        (0, 0, 0, [0, 1], 2, [F, M]),
        (0, 1, 0, [0, 1], 2, [F, M]),
        (0, 2, 0, [0], 1, [F]),
    ]
    assert worker.restarts == 2


def test_restart_budget_rate_window_and_total():
    now = [0.0]
    ledger = RestartLedger(
        EnvRestartBudget(max_restarts=2, window_seconds=10.0, max_total=3), clock=lambda: now[0]
    )
    results = []
    for t in (0.0, 1.0, 2.0, 10.5, 11.5, 30.0):
        now[0] = t
        results.append(ledger.try_restart())
    # Two per 10 s: refused at t=2, the t=0 restart leaves the window at 10.5;
    # the total of 3 is reached at 10.5.
    assert results == [True, True, False, True, False, False]
    assert ledger.total == 3


def test_restart_budget_validation_and_int_shorthand():
    assert EnvRestartBudget.coerce(4) == EnvRestartBudget(4, float("inf"), 4)
    with pytest.raises(ConfigError):
        EnvRestartBudget(max_restarts=-1)
    with pytest.raises(ConfigError):
        EnvRestartBudget(window_seconds=0)
    with pytest.raises(ConfigError):
        EnvRestartBudget.coerce("5")  # type: ignore[arg-type]


# ---------------------------------------------------------- NaN observations


def nan_env(at: int = 2) -> EnvConfig:
    return EnvConfig("rlfleet/NaN-v0", {"nan_at_step": at, "length": 5})


def test_nan_observation_error_names_env_and_step():
    worker = VecWorker(n_envs=2, env=nan_env(2))
    worker.submit(make_units(0, 0, range(2)))
    with pytest.raises(EnvError) as info:
        for _ in range(10):
            worker.step()
    assert (info.value.env_index, info.value.step) == (0, 2)
    assert "non-finite" in str(info.value)
    assert worker.finished_count == 0  # both episodes had the NaN and were dropped


def test_nan_observation_that_breaks_the_policy_is_reported_as_env_error():
    spec = nan_env().env_spec()
    policy = MLPCategoricalPolicy(spec, seed=0)
    worker = VecWorker(n_envs=1, env=nan_env(2), policy=policy)
    worker.submit(make_units(0, 0, range(2)))
    with pytest.raises(EnvError) as info:
        for _ in range(10):
            worker.step()
    assert (info.value.env_index, info.value.step) == (0, 2)
    assert isinstance(info.value.__cause__, PolicyError)
    assert worker.queued_count == 1  # the other unit waits; the NaN one is dropped


def test_nan_observation_flag_marks_steps_touching_it():
    worker = VecWorker(n_envs=1, env=nan_env(2), nan_observations="flag")
    batch = worker.run(make_units(0, 0, [0]))
    # observations 0, 1, NaN, 3, 4 and last 5: steps 1 and 2 touch the NaN.
    np.testing.assert_array_equal(batch.env_infos["nonfinite_obs"], [0, 1, 1, 0, 0])
    clean = VecWorker(n_envs=1, env=CARTPOLE, nan_observations="flag")
    assert not clean.run(make_units(0, 0, [0])).env_infos["nonfinite_obs"].any()


def test_nan_observation_ignore_keeps_it():
    worker = VecWorker(n_envs=1, env=nan_env(2), nan_observations="ignore")
    batch = worker.run(make_units(0, 0, [0]))
    assert np.isnan(batch.observations[2, 0]) and "nonfinite_obs" not in batch.env_infos


def test_bad_nan_mode_is_rejected():
    with pytest.raises(ConfigError, match="nan_observations"):
        VecWorker(n_envs=1, nan_observations="drop")  # type: ignore[arg-type]


# ---------------------------------------------------------------- bad actions


class _BadPolicy(Policy):
    """Returns what it is told to, to test the checks."""

    def __init__(self, env_spec: EnvSpec, make) -> None:
        super().__init__(env_spec)
        self.make = make

    def get_actions(self, observations, rngs=None):
        return self.make(len(observations)), {}


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda n: np.zeros((n, 1), np.int64), r"shape \(2, 1\)"),
        (lambda n: np.zeros(n, np.float32), "dtype float32"),
        (lambda n: np.array([0, 2])[:n], r"env 1: 2 is outside"),
        (lambda n: [0] * n, "type list"),
    ],
)
def test_bad_discrete_actions_are_policy_errors(make, match):
    spec = cartpole_spec()
    worker = VecWorker(n_envs=2, env=CARTPOLE, policy=_BadPolicy(spec, make))
    worker.submit(make_units(0, 0, range(2)))
    with pytest.raises(PolicyError, match=match):
        worker.step()


def test_nan_box_action_names_the_env_and_requeues():
    spec = EnvConfig("Pendulum-v1").env_spec()
    bad = _BadPolicy(spec, lambda n: np.array([[0.5], [np.nan], [0.1]], np.float32)[:n])
    worker = VecWorker(n_envs=3, env=EnvConfig("Pendulum-v1"), policy=bad, max_episode_length=5)
    units = make_units(0, 0, range(3))
    worker.submit(units)
    with pytest.raises(PolicyError, match=r"env 1: \[nan\] is NaN"):
        worker.step()
    assert (worker.active_count, worker.queued_count) == (0, 3)
    good = MLPGaussianPolicy(spec, seed=1)
    worker.update_agent(good)
    fresh = VecWorker(n_envs=1, env=EnvConfig("Pendulum-v1"), policy=good, max_episode_length=5)
    assert_same_batches(worker.run([]), fresh.run(units), ignore=("episode_infos.agent_version",))


def test_out_of_range_box_actions_are_not_clipped_or_rejected():
    spec = EnvConfig("Pendulum-v1").env_spec()
    big = _BadPolicy(spec, lambda n: np.full((n, 1), 50.0, np.float32))
    worker = VecWorker(n_envs=1, env=EnvConfig("Pendulum-v1"), policy=big, max_episode_length=2)
    batch = worker.run(make_units(0, 0, [0]))
    np.testing.assert_array_equal(batch.actions, [[50.0], [50.0]])


def test_checks_can_be_disabled():
    spec = cartpole_spec()
    floats = _BadPolicy(spec, lambda n: np.zeros(n, np.float64))
    worker = VecWorker(
        n_envs=1, env=CARTPOLE, policy=floats, check_actions=False, max_env_restarts=0
    )
    worker.submit(make_units(0, 0, [0]))
    # The float action reaches CartPole, whose own assertion rejects it.
    with pytest.raises(EnvError, match="AssertionError"):
        worker.step()


def test_worker_batches_are_not_rechecked_but_unchecked_actions_are():
    # take_finished skips EpisodeBatch's checks for what the engine's ring
    # guarantees; the batch still passes them all.
    worker = VecWorker(n_envs=3, env=CARTPOLE, policy=mlp(), max_episode_length=30)
    batch = worker.run(make_units(0, 0, range(5)))
    rebuilt = EpisodeBatch(**{name: getattr(batch, name) for name in batch.__dataclass_fields__})
    assert_same_batches(batch, rebuilt)
    # Actions nobody checked while stepping (check_actions=False) are checked
    # by the batch: Counter-v0 ignores its actions, so a wrong shape gets there.
    spec = counter(4).env_spec()
    triples = _BadPolicy(spec, lambda n: np.zeros((n, 3), np.int64))
    unchecked = VecWorker(n_envs=2, env=counter(4), policy=triples, check_actions=False)
    with pytest.raises(InvalidBatchError, match=r"EpisodeBatch.actions.*got per-step shape \(3,\)"):
        unchecked.run(make_units(0, 0, range(2)))
    checked = VecWorker(n_envs=2, env=counter(4), policy=triples)
    with pytest.raises(PolicyError, match=r"shape \(2, 3\)"):
        checked.run(make_units(0, 0, range(2)))


def test_agent_info_keys_must_not_change():
    class Flaky(Policy):
        calls = 0

        def get_actions(self, observations, rngs=None):
            self.calls += 1
            infos = {"a": np.zeros(len(observations))} if self.calls == 1 else {}
            return np.zeros(len(observations), np.int64), infos

    worker = VecWorker(n_envs=1, env=CARTPOLE, policy=Flaky(cartpole_spec()))
    worker.submit(make_units(0, 0, [0]))
    worker.step()
    with pytest.raises(PolicyError, match="keys changed"):
        worker.step()


# ------------------------------------------------- observations outside the space


def test_one_env_leaving_its_space_in_a_vector_step_is_named_with_step_value_and_space():
    # Slots 0 and 2 stay inside Box(-1, 1, (3,)) for their 20 steps; slot 1's
    # observation is 50.0 at every 7th step.
    every = iter([1000, 7, 1000])
    worker = VecWorker(n_envs=3, env=lambda: OffSpaceEnv(every=next(every)), max_env_restarts=0)
    worker.submit(make_units(0, 0, range(3)))
    with pytest.raises(EnvError) as info:
        while not worker.idle:
            worker.step()
    error = info.value
    assert (error.env_index, error.step, error.episode_index) == (1, 7, 1)
    for phrase in ("the observation of step 7", "50.0", "Box(-1.0, 1.0, (3,), float32)"):
        assert phrase in error.bare_message, error.bare_message
    while not worker.idle:
        worker.step()
    batch = worker.take_finished()
    assert batch is not None and batch.episode_infos["episode_index"].tolist() == [0, 2]


def test_honest_episodes_never_reach_the_exact_observation_check(monkeypatch):
    # The exact check costs ~4x the quick one; it runs only where the quick one fails.
    import rlfleet.worker._segments as segments

    exact_checks: list[int] = []

    def counted(observations: np.ndarray, *args: Any) -> Any:
        exact_checks.append(len(observations))
        return real(observations, *args)

    real = segments.outside_space_error
    monkeypatch.setattr(segments, "outside_space_error", counted)
    worker = VecWorker(n_envs=4, env=CARTPOLE, policy=mlp())
    batch = worker.run(make_units(0, 0, range(12)))
    assert batch.n_episodes == 12 and exact_checks == []
    off = VecWorker(n_envs=1, env=EnvConfig("rlfleet/OffSpace-v0", {"every": 3}))
    with pytest.raises(EnvError, match="the observation of step 3"):
        off.run(make_units(0, 0, [0]))
    assert exact_checks == [21]  # the whole episode, its last observation included
