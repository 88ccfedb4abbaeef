"""RLlib's forms of policy entries: bare classes, 4-tuples, add_policy(policy_cls=...), KeyError."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from mpe2 import simple_spread_v3

from rlfleet.core import MultiAgentEpisodeBatch
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, PolicyIdError
from rlfleet.learners import VPG
from rlfleet.policies import MLPCategoricalPolicy, RandomPolicy
from rlfleet.rllib import DEFAULT_POLICY_ID, EnvContext, RolloutWorker
from rlfleet.rllib.sample_batch import RolloutEpisodeBatch


class FirstAction(RandomPolicy):
    """Always the same action (a user's Policy subclass, RLlib's policy class)."""

    def __init__(self, env_spec: Any, *, action: int = 0, seed: int | None = None) -> None:
        super().__init__(env_spec, seed=seed)
        self.action = action

    def get_actions(
        self, observations: Any, rngs: Any = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return np.full(len(observations), self.action), {}


class NotAPolicy:
    """Neither an rlfleet Policy nor a learner (e.g. an RLlib TorchPolicy subclass)."""


def cartpole(ctx: EnvContext) -> gym.Env:
    return gym.make("CartPole-v1")


def spread(ctx: EnvContext) -> object:
    return simple_spread_v3.parallel_env(N=2, max_cycles=5)


def test_a_bare_policy_class_is_a_policy_spec() -> None:
    for cls, name in ((RandomPolicy, "random"), (MLPCategoricalPolicy, "mlp-categorical")):
        worker = RolloutWorker(env_creator=cartpole, policy_spec=cls, seed=0)
        assert type(worker.get_policy()) is cls
        assert worker._entry(DEFAULT_POLICY_ID).spec.name == name  # built-ins by name
    worker = RolloutWorker(env_creator=cartpole, policy_spec=FirstAction, rollout_fragment_length=8)
    assert worker._entry(DEFAULT_POLICY_ID).spec.name == f"{__name__}:FirstAction"
    batch = worker.sample()
    assert isinstance(batch, RolloutEpisodeBatch) and not batch["actions"].any()


def test_a_bare_learner_class_is_built_in_the_envs_spaces_and_learns() -> None:
    worker = RolloutWorker(env_creator=cartpole, policy_spec=VPG, rollout_fragment_length=50)
    before = worker.get_weights()[DEFAULT_POLICY_ID]
    assert "PolicyLoss" in worker.learn_on_batch(worker.sample())
    after = worker.get_weights()[DEFAULT_POLICY_ID]
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_rllibs_four_tuple_gives_spaces_and_constructor_config() -> None:
    space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    worker = RolloutWorker(
        env_creator=spread,
        policy_spec={
            "ones": (FirstAction, None, None, {"action": 1}),  # None spaces: the agents'
            "mlp": ("mlp-categorical", None, None, {"hidden_sizes": [3]}),
            "learner": (VPG, None, None, {"hidden_sizes": [5]}),
            "spare": (RandomPolicy, space, gym.spaces.Discrete(5), {}),
        },
        policy_mapping_fn=lambda agent, episode, **kw: "ones" if agent == "agent_0" else "mlp",
        rollout_fragment_length=4,
    )
    batch = worker.sample()
    assert isinstance(batch, MultiAgentEpisodeBatch)
    ones = batch.policy_batches["ones"]
    assert isinstance(ones, RolloutEpisodeBatch)
    np.testing.assert_array_equal(ones["actions"], np.ones(4))
    hidden = {k: v.shape for k, v in worker.get_weights(["mlp", "learner"])["mlp"].items()}
    assert (3,) in hidden.values()
    assert (5,) in {v.shape for v in worker.get_weights()["learner"].values()}
    spare = worker.get_policy("spare")
    assert spare is not None and spare.env_spec.observation_space == space


def test_malformed_entries_are_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="NotAPolicy is neither an rlfleet Policy"):
        RolloutWorker(env_creator=cartpole, policy_spec=NotAPolicy)
    with pytest.raises(ConfigError, match="config of a 4-tuple entry must be a dict"):
        RolloutWorker(env_creator=cartpole, policy_spec={"p": (RandomPolicy, None, None, [1])})
    with pytest.raises(ConfigError, match="rejected its kwargs"):
        RolloutWorker(env_creator=cartpole, policy_spec={"p": (RandomPolicy, None, None, {"x": 1})})
    with pytest.raises(ConfigError, match="a built learner takes no config"):
        spec = EnvConfig("CartPole-v1").env_spec()
        RolloutWorker(env_creator=cartpole, policy_spec={"p": (VPG(spec), None, None, {"lr": 1})})

    class Local(RandomPolicy):
        pass

    with pytest.raises(ConfigError, match="define it at module level"):
        RolloutWorker(env_creator=cartpole, policy_spec=Local)


def test_add_policy_takes_policy_cls_and_a_duplicate_id_is_a_key_error() -> None:
    worker = RolloutWorker(env_creator=cartpole, seed=0)
    space = worker.foreach_env(lambda env: env.observation_space)[0]
    added = worker.add_policy(
        policy_id="fixed",
        policy_cls=FirstAction,
        observation_space=space,
        action_space=gym.spaces.Discrete(2),
        config={"action": 1},
    )
    assert isinstance(added, FirstAction) and added.action == 1
    with pytest.raises(KeyError) as duplicate:
        worker.add_policy(policy_id="fixed", policy_cls=RandomPolicy)
    assert isinstance(duplicate.value, PolicyIdError) and isinstance(duplicate.value, ConfigError)
    assert str(duplicate.value).startswith("RolloutWorker.add_policy: policy 'fixed' exists")
    with pytest.raises(ConfigError, match="policy_cls and policy_spec"):
        worker.add_policy(policy_id="other", policy_cls=RandomPolicy, policy_spec="random")
    with pytest.raises(KeyError, match="no policy 'nobody'"):
        worker.for_policy(lambda policy: policy, policy_id="nobody")
