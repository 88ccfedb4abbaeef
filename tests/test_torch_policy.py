"""TorchPolicy: an nn.Module on workers, built from a spec, deterministic per episode."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet import EnvConfig, LocalSampler, PolicySpec, make_policy
from rlfleet.client import Fleet
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies.torch import TorchPolicy, torch_params
from tests.fixtures.torch_nets import ActorCritic

CARTPOLE = EnvConfig("CartPole-v1", max_episode_length=60)
NETS = "tests.fixtures.torch_nets"
SPEC = PolicySpec(
    "torch",
    {
        "module": f"{NETS}:ActorCritic",
        "module_kwargs": {"obs_dim": 4, "n_actions": 2},
        "distribution": "categorical",
        "threads": 1,
    },
)


def _same(left: object, right: object) -> None:
    for name in ("observations", "actions", "rewards", "lengths", "last_observations"):
        np.testing.assert_array_equal(getattr(left, name), getattr(right, name), err_msg=name)
    for key in ("log_prob", "value"):
        np.testing.assert_array_equal(
            left.agent_infos[key],  # type: ignore[attr-defined]
            right.agent_infos[key],  # type: ignore[attr-defined]
        )


def test_spec_builds_the_module_and_infos_match_torch() -> None:
    policy = make_policy(SPEC, CARTPOLE.env_spec(), seed=3)
    assert isinstance(policy, TorchPolicy) and policy.policy_spec == PolicySpec(
        "torch", {**SPEC.kwargs, "batch_invariant": True}
    )
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actions, infos = policy.get_actions(obs, [np.random.default_rng(i) for i in range(5)])
    assert actions.dtype == np.int64 and set(actions) <= {0, 1}
    with torch.no_grad():
        logits = policy.module(torch.from_numpy(obs))
        expected = torch.distributions.Categorical(logits=logits).log_prob(
            torch.from_numpy(actions)
        )
        values = policy.module.get_value(torch.from_numpy(obs))[:, 0]  # type: ignore[operator]
    np.testing.assert_allclose(infos["log_prob"], expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(infos["value"], values.numpy(), rtol=1e-6)
    # Same seed, same initial weights; the global torch RNG is not consumed.
    state = torch.random.get_rng_state()
    again = make_policy(SPEC, CARTPOLE.env_spec(), seed=3)
    assert torch.equal(state, torch.random.get_rng_state())
    for name, value in policy.get_param_values().items():
        np.testing.assert_array_equal(again.get_param_values()[name], value)


def test_parameters_travel_as_the_state_dict() -> None:
    learner = ActorCritic(4, 2)
    policy = make_policy(SPEC, CARTPOLE.env_spec(), seed=0)
    params = torch_params(learner)
    assert list(params) == list(learner.state_dict())
    policy.set_param_values(params)
    for name, value in learner.state_dict().items():
        np.testing.assert_array_equal(policy.get_param_values()[name], value.numpy())
    with pytest.raises(PolicyError, match="missing parameters"):
        policy.set_param_values({"actor.0.weight": params["actor.0.weight"]})


def test_gaussian_head_log_prob_matches_torch() -> None:
    spec = PolicySpec(
        "torch",
        {
            "module": f"{NETS}:GaussianActor",
            "module_kwargs": {"obs_dim": 3, "act_dim": 1},
            "distribution": "gaussian",
        },
    )
    policy = make_policy(spec, EnvConfig("Pendulum-v1").env_spec(), seed=1)
    assert isinstance(policy, TorchPolicy)
    obs = np.ones((4, 3), np.float32)
    actions, infos = policy.get_actions(obs, [np.random.default_rng(i) for i in range(4)])
    assert actions.shape == (4, 1) and "value" not in infos
    with torch.no_grad():
        mean = policy.module(torch.from_numpy(obs))
        normal = torch.distributions.Normal(mean, policy.module.log_std.exp())  # type: ignore[operator]
        expected = normal.log_prob(torch.from_numpy(actions)).sum(-1)
    np.testing.assert_allclose(infos["log_prob"], expected.numpy(), rtol=1e-4, atol=1e-5)


def test_module_import_is_checked_like_an_import_path_policy() -> None:
    with pytest.raises(ConfigError, match="not allowed here"):
        make_policy(SPEC, CARTPOLE.env_spec(), allowed_modules=["mypkg"])
    with pytest.raises(ConfigError, match="'module' must be the import path"):
        make_policy(PolicySpec("torch", {"module": "os.system"}), CARTPOLE.env_spec())
    with pytest.raises(ConfigError, match="needs Discrete actions"):
        make_policy(SPEC, EnvConfig("Pendulum-v1").env_spec())


def test_batches_do_not_depend_on_the_layout() -> None:
    batches = []
    for workers, envs in ((1, 1), (2, 3)):
        with LocalSampler(
            CARTPOLE, SPEC, n_workers=workers, envs_per_worker=envs, seed=4
        ) as sampler:
            batches.append(sampler.obtain_samples(0, 300))
    _same(*batches)


def test_fleet_workers_run_the_module_as_the_local_sampler_does() -> None:
    learner = ActorCritic(4, 2)
    params = torch_params(learner)
    with LocalSampler(CARTPOLE, SPEC, n_workers=1, seed=9) as local:
        expected = local.obtain_samples(0, 200, agent_update=params)
    with Fleet.local(
        workers=2, envs_per_worker=2, env=CARTPOLE, policy=SPEC, seed=9, imports=(NETS,)
    ) as sampler:
        batch = sampler.obtain_samples(0, 200, agent_update=params)
    _same(batch, expected)
