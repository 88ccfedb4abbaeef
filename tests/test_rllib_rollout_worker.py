"""RolloutWorker (RLlib's names) against real gymnasium and PettingZoo envs, locally."""

from __future__ import annotations

import dataclasses
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from mpe2 import simple_spread_v3
from pettingzoo.classic import rps_v2, tictactoe_v3
from pettingzoo.test import parallel_api_test

from rlfleet import StepType
from rlfleet.core import EpisodeBatch, MultiAgentEpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, InvalidBatchError, PolicyError, UsageError
from rlfleet.learners import VPG
from rlfleet.rllib import (
    DEFAULT_POLICY_ID,
    DefaultCallbacks,
    EnvContext,
    MeanStdFilter,
    RolloutWorker,
    RunningStat,
)
from rlfleet.rllib import state as state_module
from rlfleet.rllib.state import MAGIC
from tests.fixtures.rllib_plugins import CountingCallbacks

CARTPOLE = EnvConfig("CartPole-v1")


def cartpole(ctx: EnvContext) -> gym.Env:
    return gym.make("CartPole-v1")


def spread(ctx: EnvContext) -> object:
    return simple_spread_v3.parallel_env(N=3, max_cycles=ctx.get("max_cycles", 25))


def vpg(seed: int = 0) -> VPG:
    return VPG(CARTPOLE.env_spec(), hidden_sizes=(8,), seed=seed)


def sample_single(worker: RolloutWorker) -> EpisodeBatch:
    batch = worker.sample()
    assert isinstance(batch, EpisodeBatch)
    return batch


def sample_multi(worker: RolloutWorker) -> MultiAgentEpisodeBatch:
    batch = worker.sample()
    assert isinstance(batch, MultiAgentEpisodeBatch)
    return batch


def mean_std(worker: RolloutWorker, flush_after: bool = False) -> MeanStdFilter:
    found = worker.get_filters(flush_after)[DEFAULT_POLICY_ID]
    assert isinstance(found, MeanStdFilter)
    return found


def ends(batch: EpisodeBatch) -> np.ndarray:
    """Step type of each episode's last step."""
    return batch.step_types[np.cumsum(batch.lengths) - 1]


# ------------------------------------------------------------ the seed example


def test_seed_example_sample_learn_weights_save_restore() -> None:
    worker = RolloutWorker(env_creator=cartpole, policy_spec=vpg(), seed=3)
    batch = sample_single(worker)
    assert isinstance(batch, EpisodeBatch) and batch.total_steps == 100
    before = worker.get_weights()
    info = worker.learn_on_batch(batch)
    assert info["NumSteps"] == 100
    after = worker.get_weights()
    assert set(after) == {DEFAULT_POLICY_ID}
    assert any(
        not np.array_equal(before[DEFAULT_POLICY_ID][k], v)
        for k, v in after[DEFAULT_POLICY_ID].items()
    )

    other = RolloutWorker(env_creator=cartpole, policy_spec=vpg(seed=9))
    other.set_weights(after, {"timestep": 42})
    assert other.get_global_vars() == {"timestep": 42}
    for name, value in after[DEFAULT_POLICY_ID].items():
        np.testing.assert_array_equal(other.get_weights()[DEFAULT_POLICY_ID][name], value)

    worker.set_global_vars({"timestep": 7})
    state = worker.save()
    assert state.startswith(MAGIC)
    fresh = RolloutWorker(env_creator=cartpole, policy_spec=vpg(seed=5))
    fresh.restore(state)
    assert fresh.get_global_vars() == {"timestep": 7}
    for name, value in after[DEFAULT_POLICY_ID].items():
        np.testing.assert_array_equal(fresh.get_weights()[DEFAULT_POLICY_ID][name], value)


def test_restore_refuses_foreign_damaged_and_other_format_bytes_and_other_policies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = RolloutWorker(env_creator=cartpole, policy_spec="random")
    with pytest.raises(ConfigError, match=r"not a state written by RolloutWorker\.save"):
        worker.restore(b"\x80\x04pickle")
    damaged = worker.save().replace(b'"format": 1', b'"format": 9')
    with pytest.raises(ConfigError, match="damaged"):
        worker.restore(damaged)
    monkeypatch.setattr(state_module, "STATE_FORMAT", 9)
    future = worker.save()
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="state format 9; this rlfleet reads format 1"):
        worker.restore(future)
    multi = RolloutWorker(env_creator=cartpole, policy_spec={"a": "random", "b": "random"})
    with pytest.raises(ConfigError, match="has policies"):
        worker.restore(multi.save())


def test_same_seed_same_batches_and_fragments_continue_episodes() -> None:
    def make() -> RolloutWorker:
        return RolloutWorker(
            env_creator=cartpole, policy_spec=vpg(), seed=11, num_envs=2, rollout_fragment_length=30
        )

    a, b = make(), make()
    first_a, first_b = sample_single(a), sample_single(b)
    np.testing.assert_array_equal(first_a.observations, first_b.observations)
    np.testing.assert_array_equal(first_a.actions, first_b.actions)
    assert first_a.total_steps == 60
    # A fragment cut at the end of a sample ends MID; the next sample goes on with it.
    cut = ends(first_a) == StepType.MID
    assert 1 <= cut.sum() <= 2  # at most one cut per env (none if an episode just ended)
    second = sample_single(a)
    carried = set(first_a.episode_infos["env_episode"][cut].tolist())
    starts = second.step_types[np.cumsum(second.lengths) - second.lengths]
    for row, episode in enumerate(second.episode_infos["env_episode"].tolist()):
        if episode in carried:
            assert starts[row] == StepType.MID and second.episode_infos["fragment"][row] == 1


def test_complete_episodes_and_horizons() -> None:
    worker = RolloutWorker(
        env_creator=cartpole,
        policy_spec="random",
        batch_mode="complete_episodes",
        rollout_fragment_length=50,
        seed=0,
    )
    batch = sample_single(worker)
    assert batch.total_steps >= 50
    assert set(ends(batch).tolist()) <= {StepType.TERMINAL, StepType.TIMEOUT}

    capped = RolloutWorker(
        env_creator=cartpole,
        policy_spec="random",
        batch_mode="complete_episodes",
        episode_horizon=5,
        rollout_fragment_length=20,
    )
    batch = sample_single(capped)
    assert batch.lengths.max() <= 5
    assert (ends(batch)[batch.lengths == 5] == StepType.TIMEOUT).all()

    no_done = RolloutWorker(
        env_creator=cartpole,
        policy_spec="random",
        batch_mode="complete_episodes",
        no_done_at_end=True,
        rollout_fragment_length=50,
    )
    assert (ends(sample_single(no_done)) == StepType.TIMEOUT).all()


def test_soft_horizon_cuts_episodes_without_resetting_the_env() -> None:
    resets = []

    def counted(ctx: EnvContext) -> gym.Env:
        env = gym.make("MountainCar-v0")  # 200 steps before it ends on its own
        original = env.reset

        def reset(*, seed: int | None = None, options: dict | None = None) -> tuple:
            resets.append(1)
            return original(seed=seed, options=options)

        env.reset = reset  # type: ignore[method-assign]
        return env

    worker = RolloutWorker(
        env_creator=counted,
        policy_spec="random",
        episode_horizon=10,
        soft_horizon=True,
        rollout_fragment_length=40,
        disable_env_checking=True,
    )
    batch = sample_single(worker)
    assert len(resets) == 1
    assert batch.lengths.tolist() == [10, 10, 10, 10]
    assert (ends(batch) == StepType.TIMEOUT).all()
    # Each new episode starts from the observation the previous one ended on.
    np.testing.assert_array_equal(batch.observations[10], batch.last_observations[0])
    assert len(worker.get_metrics()) == 4


def test_soft_horizon_still_resets_when_the_env_itself_ends() -> None:
    resets = []

    def counted(ctx: EnvContext) -> gym.Env:
        env = gym.make("CartPole-v1")
        original = env.reset

        def reset(*, seed: int | None = None, options: dict | None = None) -> tuple:
            resets.append(1)
            return original(seed=seed, options=options)

        env.reset = reset  # type: ignore[method-assign]
        return env

    worker = RolloutWorker(
        env_creator=counted,
        policy_spec="random",
        episode_horizon=12,
        soft_horizon=True,
        rollout_fragment_length=300,
        seed=5,
        disable_env_checking=True,
    )
    batch = sample_single(worker)
    kinds = ends(batch)
    assert (batch.lengths <= 12).all()
    # Every TERMINAL (the pole fell) needs a reset; a soft-horizon TIMEOUT does not.
    assert len(resets) == 1 + int((kinds[:-1] == StepType.TERMINAL).sum())
    assert (kinds == StepType.TIMEOUT).any() and (kinds == StepType.TERMINAL).any()


def test_env_context_validate_env_foreach_env() -> None:
    contexts, validated = [], []

    def creator(ctx: EnvContext) -> gym.Env:
        contexts.append(ctx)
        return gym.make("CartPole-v1")

    worker = RolloutWorker(
        env_creator=creator,
        validate_env=lambda env, ctx: validated.append((env, ctx)),
        env_config={"level": 3},
        num_envs=3,
        worker_index=2,
        num_workers=4,
        policy_spec="random",
    )
    assert [c.vector_index for c in contexts] == [0, 1, 2]
    assert all(
        c["level"] == 3 and c.worker_index == 2 and c.num_workers == 4 and not c.remote
        for c in contexts
    )
    assert len(validated) == 1
    assert worker.foreach_env(lambda env: env.spec.id) == ["CartPole-v1"] * 3
    assert worker.foreach_env_with_context(lambda env, ctx: ctx.vector_index) == [0, 1, 2]


def test_reward_clipping_and_action_normalisation() -> None:
    seen = []

    def pendulum(ctx: EnvContext) -> gym.Env:
        env = gym.make("Pendulum-v1")  # actions in [-2, 2], rewards down to about -16

        def record(action: np.ndarray) -> np.ndarray:
            seen.append(action)
            return action

        return gym.wrappers.TransformAction(env, record, env.action_space)

    worker = RolloutWorker(
        env_creator=pendulum,
        policy_spec="random",
        clip_rewards=True,
        rollout_fragment_length=20,
        disable_env_checking=True,
    )
    batch = sample_single(worker)
    assert batch.rewards.min() >= -1.0
    # The random policy acts in [-2, 2]; normalize_actions reads that as [-1, 1]-clipped.
    expected = -2.0 + (np.clip(batch.actions, -1, 1) + 1.0) * 2.0
    np.testing.assert_allclose(np.concatenate(seen[-20:]), expected.reshape(-1), rtol=1e-6)

    seen.clear()
    plain = RolloutWorker(
        env_creator=pendulum,
        policy_spec="random",
        normalize_actions=False,
        clip_actions=True,
        clip_rewards=0.5,
        rollout_fragment_length=20,
        disable_env_checking=True,
    )
    batch = sample_single(plain)
    assert batch.rewards.min() >= -0.5
    np.testing.assert_allclose(
        np.concatenate(seen[-20:]), np.clip(batch.actions, -2, 2).reshape(-1)
    )


# ------------------------------------------------------------------- filters


def test_mean_std_filter_merges_deltas_like_filter_manager() -> None:
    def make(index: int) -> RolloutWorker:
        return RolloutWorker(
            env_creator=cartpole,
            policy_spec="random",
            observation_filter="MeanStdFilter",
            worker_index=index,
            seed=index,
            rollout_fragment_length=50,
        )

    local, remotes = make(0), [make(1), make(2)]
    seen = []
    for remote in remotes:
        batch = sample_single(remote)
        # Every observation is filtered once: each reset's and each step's.
        starts = batch.step_types[np.cumsum(batch.lengths) - batch.lengths]
        seen.append(batch.total_steps + int((starts == StepType.FIRST).sum()))
    # The driver merges the flushed deltas into its own filter (FilterManager.synchronize).
    merged = mean_std(local)
    for remote, count in zip(remotes, seen, strict=True):
        delta = mean_std(remote, flush_after=True)
        assert delta.buffer.n == count
        merged.apply_changes(delta)
        assert mean_std(remote).buffer.n == 0
    assert merged.running.n == sum(seen)
    for remote in remotes:
        remote.sync_filters({DEFAULT_POLICY_ID: merged})
        state = mean_std(remote)
        assert state.running.n == sum(seen)
        np.testing.assert_allclose(state.running.mean, merged.running.mean)


def test_mean_std_filter_statistics_are_exact_and_the_batch_holds_filtered_obs() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(3.0, 2.0, size=(300, 4))
    whole = RunningStat.of(rows)
    pieces = (
        RunningStat.of(rows[:10])
        .merged(RunningStat.of(rows[10:200]))
        .merged(RunningStat.of(rows[200:]))
    )
    np.testing.assert_allclose(pieces.mean, rows.mean(axis=0))
    np.testing.assert_allclose(pieces.std, rows.std(axis=0, ddof=1))
    assert whole.n == pieces.n == 300

    worker = RolloutWorker(
        env_creator=cartpole,
        policy_spec="random",
        observation_filter="MeanStdFilter",
        batch_mode="complete_episodes",
        rollout_fragment_length=300,
        seed=1,
    )
    batch = sample_single(worker)
    f = worker.get_filters()[DEFAULT_POLICY_ID]
    assert isinstance(f, MeanStdFilter) and f.running.n == batch.total_steps + batch.n_episodes
    assert np.abs(batch.observations).max() <= 10.0
    with pytest.raises(ConfigError, match="MeanStdFilter needs Box"):
        RolloutWorker(
            env_creator=lambda ctx: gym.make("FrozenLake-v1"),
            policy_spec="random",
            observation_filter="MeanStdFilter",
        )


# ------------------------------------------------------- callbacks and metrics


@pytest.mark.parametrize(
    "callbacks", [CountingCallbacks, "tests.fixtures.rllib_plugins:CountingCallbacks"]
)
def test_callbacks_and_metrics(callbacks: type[DefaultCallbacks] | str) -> None:
    worker = RolloutWorker(
        env_creator=cartpole,
        policy_spec="random",
        callbacks=callbacks,
        batch_mode="complete_episodes",
        rollout_fragment_length=60,
        seed=2,
    )
    batch = sample_single(worker)
    metrics = worker.get_metrics()
    assert [m.episode_length for m in metrics] == batch.lengths.tolist()
    assert [m.episode_reward for m in metrics] == batch.lengths.astype(float).tolist()
    assert all(m.custom_metrics["steps_seen"] == m.episode_length for m in metrics)
    assert worker.get_metrics() == []
    calls = worker.apply(lambda w: w._callbacks.calls)
    assert (
        calls["end"] == len(metrics) and calls["sample"] == 1 and calls["step"] == batch.total_steps
    )


def test_refused_and_unknown_arguments_and_bad_values() -> None:
    # Each RLlib argument's handling: tests/test_rllib_arguments.py.
    with pytest.raises(ConfigError, match=r"input_creator.*offline"):
        RolloutWorker(env_creator=cartpole, input_creator=lambda ctx: None)
    with pytest.raises(ConfigError, match="unknown argument 'frobnicate'"):
        RolloutWorker(env_creator=cartpole, frobnicate=1)
    with pytest.raises(ConfigError, match="batch_mode"):
        RolloutWorker(env_creator=cartpole, batch_mode="whole")
    with pytest.raises(ConfigError, match="callbacks must be a subclass"):
        RolloutWorker(env_creator=cartpole, callbacks=dict)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="policies_to_train"):
        RolloutWorker(env_creator=cartpole, policies_to_train="default_policy")


# ------------------------------------------------------------------ policies


def test_policy_management() -> None:
    worker = RolloutWorker(
        env_creator=spread,
        policy_spec={"solo": "random", "team": "random"},
        policy_mapping_fn="tests.fixtures.rllib_plugins:first_agent_alone",
        rollout_fragment_length=10,
        seed=0,
    )
    batch = sample_multi(worker)
    assert isinstance(batch, MultiAgentEpisodeBatch)
    assert set(batch["solo"].episode_infos["agent_id"].tolist()) == {"agent_0"}
    assert set(batch["team"].episode_infos["agent_id"].tolist()) == {"agent_1", "agent_2"}
    assert batch.env_steps == 10 and batch.agent_steps == 30

    assert worker.get_policy("nobody") is None
    space = worker.foreach_env(lambda env: env.observation_space("agent_0"))[0]
    added = worker.add_policy(
        policy_id="extra",
        policy_spec="mlp-categorical",
        observation_space=space,
        action_space=gym.spaces.Discrete(5),
        policies_to_train=["extra"],
    )
    assert worker.get_policy("extra") is added
    assert worker.get_policies_to_train() == {"extra"}
    with pytest.raises(ConfigError, match="exists already"):
        worker.add_policy(policy_id="extra", policy_spec="random")
    assert sorted(worker.foreach_policy(lambda p, pid: pid)) == ["extra", "solo", "team"]
    assert worker.foreach_policy_to_train(lambda p, pid: pid) == ["extra"]
    assert worker.for_policy(lambda p, tag: (type(p).__name__, tag), policy_id="extra", tag=1) == (
        "MLPCategoricalPolicy",
        1,
    )

    worker.set_policy_mapping_fn(lambda agent_id, episode, **kw: "extra")

    def not_extra(policy_id: str, batch: object = None) -> bool:
        return policy_id != "extra"

    worker.set_is_policy_to_train(not_extra)
    assert worker.get_policies_to_train() == {"solo", "team"}
    sample_multi(worker)  # running episodes keep their bindings ...
    with pytest.raises(ConfigError, match="bound to 'solo'"):
        worker.remove_policy(policy_id="solo")
    for _ in range(3):
        sample_multi(worker)  # ... and new ones (25 steps each) use the new mapping
    assert set(sample_multi(worker).policy_batches) == {"extra"}
    worker.remove_policy(policy_id="solo")
    assert worker.get_policy("solo") is None


def test_learning_only_trained_policies_and_gradients_between_workers() -> None:
    def make(seed: int) -> RolloutWorker:
        return RolloutWorker(
            env_creator=cartpole,
            policy_spec={"a": vpg(seed), "b": vpg(seed + 1)},
            policy_mapping_fn=lambda agent_id, episode, **kw: (
                "a" if episode.episode_id % 2 else "b"
            ),
            policies_to_train=["a"],
            num_envs=2,
            rollout_fragment_length=50,
            seed=seed,
        )

    worker = make(0)
    batch = sample_multi(worker)
    assert set(batch.policy_batches) == {"a", "b"}
    before = worker.get_weights()
    info = worker.learn_on_batch(batch)
    assert set(info) == {"a"}
    after = worker.get_weights()
    for name, value in before["b"].items():
        np.testing.assert_array_equal(after["b"][name], value)

    # Gradients computed on one worker and applied on another with the same
    # weights and learner state give the same weights as applying them locally.
    left, right = make(1), make(1)
    grads, infos = left.compute_gradients(sample_multi(left))
    assert set(grads) == set(infos) == {"a"}
    left.apply_gradients(grads)
    right.apply_gradients(grads)
    for name, value in left.get_weights()["a"].items():
        np.testing.assert_array_equal(right.get_weights()["a"][name], value)

    actor = RolloutWorker(env_creator=cartpole, policy_spec="random")
    with pytest.raises(UsageError, match="cannot train_step"):
        actor.learn_on_batch(sample_single(actor))


def test_lifecycle() -> None:
    closed = []

    def creator(ctx: EnvContext) -> gym.Env:
        env = gym.make("CartPole-v1")
        env.close = lambda: closed.append(1)  # type: ignore[method-assign]
        return env

    worker = RolloutWorker(
        env_creator=creator, policy_spec="random", num_envs=2, rollout_fragment_length=7
    )
    assert worker.creation_args()["rollout_fragment_length"] == 7
    assert worker.get_host() == socket.gethostname()
    assert worker.apply(lambda w, x, *, y: (w is worker, x, y), 1, y=2) == (True, 1, 2)
    worker.stop()
    assert len(closed) == 2


# --------------------------------------------------------------- multi-agent


def test_pettingzoo_envs_as_the_worker_builds_them_pass_parallel_api_test() -> None:
    for creator in (spread, lambda ctx: rps_v2.env(num_actions=3, max_cycles=15)):
        worker = RolloutWorker(env_creator=creator, policy_spec="random")
        worker.foreach_env(lambda env: parallel_api_test(env, num_cycles=30))


def test_classic_game_through_aec_conversion_and_turn_based_games_refused() -> None:
    worker = RolloutWorker(
        env_creator=lambda ctx: rps_v2.env(num_actions=3, max_cycles=15),
        policy_spec={"p0": "random", "p1": "random"},
        policy_mapping_fn=lambda agent_id, episode, **kw: "p0" if agent_id == "player_0" else "p1",
        batch_mode="complete_episodes",
        rollout_fragment_length=30,
        seed=4,
    )
    batch = sample_multi(worker)
    assert batch.env_steps == sum(m.episode_length for m in worker.get_metrics())
    for policy_id, agent in (("p0", "player_0"), ("p1", "player_1")):
        assert set(batch[policy_id].episode_infos["agent_id"].tolist()) == {agent}
    # Rock-paper-scissors is zero-sum: the two players' rewards cancel step by step.
    np.testing.assert_array_equal(batch["p0"].rewards, -batch["p1"].rewards)
    with pytest.raises(ConfigError, match="not parallelizable"):
        RolloutWorker(env_creator=lambda ctx: tictactoe_v3.env(), policy_spec="random")


def test_multi_agent_batches_split_and_concatenate_and_count_agent_steps() -> None:
    worker = RolloutWorker(
        env_creator=spread,
        env_config={"max_cycles": 8},
        policy_spec={"solo": None, "team": None},
        policy_mapping_fn="tests.fixtures.rllib_plugins:first_agent_alone",
        count_steps_by="agent_steps",
        rollout_fragment_length=20,
        seed=0,
    )
    batch, count = worker.sample_with_count()
    assert isinstance(batch, MultiAgentEpisodeBatch)
    assert count == batch.agent_steps >= 20
    assert batch.env_steps == 7  # 3 agents act each env step: 7 steps give 21 >= 20
    two = MultiAgentEpisodeBatch.concatenate(batch, sample_multi(worker))
    parts = two.split()
    assert {int(p["solo"].episode_infos["env_episode"][0]) for p in parts} == set(
        two["solo"].episode_infos["env_episode"].tolist()
    )
    rebuilt = MultiAgentEpisodeBatch.concatenate(*parts)
    assert rebuilt.agent_steps == two.agent_steps
    for policy_id in two:
        assert sorted(rebuilt[policy_id].rewards.tolist()) == sorted(
            two[policy_id].rewards.tolist()
        )
    # Each mpe agent appears once per env episode and fragment.
    infos = two["team"].episode_infos
    keys = list(
        zip(
            infos["env_episode"].tolist(),
            infos["fragment"].tolist(),
            infos["agent_id"].tolist(),
            strict=True,
        )
    )
    assert len(keys) == len(set(keys))


def test_two_vpg_policies_learn_on_a_multi_agent_batch() -> None:
    env = simple_spread_v3.parallel_env(N=2, max_cycles=10)
    spec = EnvConfig("CartPole-v1").env_spec()  # only for its type; spaces come from mpe below
    del spec
    from rlfleet.core import EnvSpec

    env_spec = EnvSpec(env.observation_space("agent_0"), env.action_space("agent_0"))
    learners = {
        "agent_0": VPG(env_spec, hidden_sizes=(8,), seed=0),
        "agent_1": VPG(env_spec, hidden_sizes=(8,), seed=1),
    }
    worker = RolloutWorker(
        env_creator=lambda ctx: simple_spread_v3.parallel_env(N=2, max_cycles=10),
        policy_spec=learners,
        policy_mapping_fn="per-agent",
        batch_mode="complete_episodes",
        rollout_fragment_length=40,
        seed=0,
    )
    batch = sample_multi(worker)
    info = worker.learn_on_batch(batch)
    assert set(info) == {"agent_0", "agent_1"}
    assert all(stats["NumSteps"] == batch[pid].total_steps for pid, stats in info.items())


def test_local_rollout_workers_need_no_grpc() -> None:
    code = (
        "import sys; from rlfleet import RolloutWorker, MultiAgentEpisodeBatch; "
        "import rlfleet.rllib; print('grpc' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert out == "False"


@pytest.mark.parametrize("local", [False, True])
def test_multiagent_example_runs(capsys: pytest.CaptureFixture[str], local: bool) -> None:
    """Trains briefly through Fleet.local (the default) and on a local worker."""
    example = runpy.run_path(str(Path(__file__).parent.parent / "examples" / "multiagent.py"))
    assert example["main"](2, local=local) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("itr   0  team return") and "agent_1 500 steps" in lines[0]
    assert lines[-1].endswith("(local)" if local else "(fleet)")


def test_bad_weights_and_bad_multi_agent_batches_are_refused() -> None:
    worker = RolloutWorker(env_creator=cartpole, policy_spec=vpg())
    before = worker.get_weights()
    with pytest.raises(PolicyError):
        worker.set_weights({DEFAULT_POLICY_ID: {"layers.0.weight": np.zeros((2, 2))}})
    with pytest.raises(ConfigError, match="no policy 'other'"):
        worker.set_weights({"other": {}})
    for name, value in before[DEFAULT_POLICY_ID].items():
        np.testing.assert_array_equal(worker.get_weights()[DEFAULT_POLICY_ID][name], value)
    learner = vpg()
    with pytest.raises(PolicyError, match="expected parameters"):
        learner.set_params({"x": np.zeros(1)})

    single = sample_single(worker)
    plain = dataclasses.replace(single, episode_infos={})
    with pytest.raises(InvalidBatchError, match="lacks"):
        MultiAgentEpisodeBatch({"p": plain}, 3)
    with pytest.raises(InvalidBatchError, match=">= 0"):
        MultiAgentEpisodeBatch({"p": single}, -1)
    with pytest.raises(InvalidBatchError, match="at least one"):
        MultiAgentEpisodeBatch.concatenate()


def test_multi_agent_sampling_is_deterministic_and_add_policy_takes_a_state() -> None:
    def make() -> RolloutWorker:
        return RolloutWorker(
            env_creator=spread,
            policy_spec={"solo": None, "team": None},
            policy_mapping_fn="tests.fixtures.rllib_plugins:first_agent_alone",
            num_envs=2,
            rollout_fragment_length=30,
            seed=8,
        )

    a, b = make(), make()
    for _ in range(2):
        left, right = sample_multi(a), sample_multi(b)
        for policy_id in ("solo", "team"):
            np.testing.assert_array_equal(
                left[policy_id].observations, right[policy_id].observations
            )
            np.testing.assert_array_equal(left[policy_id].actions, right[policy_id].actions)
            np.testing.assert_array_equal(left[policy_id].rewards, right[policy_id].rewards)

    state = a.get_weights(["team"])["team"]
    copy = a.add_policy(policy_id="copy", policy_spec=None, policy_state=state)
    for name, value in state.items():
        np.testing.assert_array_equal(copy.get_param_values()[name], value)
