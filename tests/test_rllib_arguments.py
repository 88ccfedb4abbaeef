"""Every RLlib RolloutWorker argument: applied, ignored with a warning, or refused (one table).

rlfleet/rllib/arguments.py holds the table; these tests hold it to RLlib's
signature (the seed's argument list) and to its rule: accepted at the
default, ignored with one warning line where ignoring changes no data (the
batches equal those of a worker without the argument), refused, naming the
reason, where it would.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from mpe2 import simple_spread_v3

from rlfleet.errors import ConfigError
from rlfleet.rllib import EnvContext, RolloutWorker
from rlfleet.rllib.arguments import (
    ARGUMENTS,
    REQUIRED,
    Handling,
    IgnoredArgumentWarning,
)
from rlfleet.rllib.sample_batch import RolloutEpisodeBatch

#: The arguments of RLlib's RolloutWorker, in the seed's order.
SEED_ARGUMENTS = [
    "env_creator",
    "validate_env",
    "policy_spec",
    "policy_mapping_fn",
    "policies_to_train",
    "tf_session_creator",
    "rollout_fragment_length",
    "count_steps_by",
    "batch_mode",
    "episode_horizon",
    "preprocessor_pref",
    "sample_async",
    "compress_observations",
    "num_envs",
    "observation_fn",
    "observation_filter",
    "clip_rewards",
    "normalize_actions",
    "clip_actions",
    "env_config",
    "model_config",
    "policy_config",
    "worker_index",
    "num_workers",
    "recreated_worker",
    "record_env",
    "log_dir",
    "log_level",
    "callbacks",
    "input_creator",
    "input_evaluation",
    "output_creator",
    "remote_worker_envs",
    "remote_env_batch_wait_ms",
    "soft_horizon",
    "no_done_at_end",
    "seed",
    "extra_python_environs",
    "fake_sampler",
    "spaces",
    "policy",
    "monitor_path",
    "disable_env_checking",
]

#: A value other than RLlib's default for every ignored argument.
IGNORED = {
    "tf_session_creator": lambda: None,
    "preprocessor_pref": "my-preprocessor",
    "sample_async": True,
    "compress_observations": True,
    "record_env": True,
    "log_dir": "/tmp/rllib-logs",
    "input_evaluation": ["is", "wis"],
    "remote_worker_envs": True,
    "remote_env_batch_wait_ms": 10,
    "monitor_path": "/tmp/rllib-monitor",
}

#: A value other than RLlib's default for every refused argument, and the reason's words.
REFUSED = {
    "observation_fn": (lambda agent_obs, **kw: agent_obs, "rewrites what policies observe"),
    "model_config": ({"fcnet_hiddens": [8]}, "other actions"),
    "policy_config": ({"explore": False}, "other actions"),
    "input_creator": (lambda ioctx: "a JSON reader", "offline input is not supported"),
    "output_creator": (lambda ioctx: "a JSON writer", "would not be written"),
    "fake_sampler": (True, "first batch over and over"),
}


class NoopOutput:
    """Stands for RLlib's NoopOutput, what its default output_creator returns."""


def cartpole(ctx: EnvContext) -> gym.Env:
    return gym.make("CartPole-v1")


def _batch(**kwargs: Any) -> Any:
    worker = RolloutWorker(env_creator=cartpole, rollout_fragment_length=20, seed=5, **kwargs)
    return worker.sample()


def _ignored_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, IgnoredArgumentWarning)]


def test_the_table_is_rllibs_signature_and_applied_rows_are_parameters() -> None:
    assert [row.name for row in ARGUMENTS] == SEED_ARGUMENTS
    parameters = inspect.signature(RolloutWorker.__init__).parameters
    applied = {row.name: row.default for row in ARGUMENTS if row.handling is Handling.APPLIES}
    named = {n: p.default for n, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert set(named) == set(applied)
    for name, default in applied.items():
        expected = inspect.Parameter.empty if default == REQUIRED else default
        assert named[name] == expected, name
    assert {r.name for r in ARGUMENTS if r.handling is Handling.IGNORED} == set(IGNORED)
    assert {r.name for r in ARGUMENTS if r.handling is Handling.REFUSED} == set(REFUSED)
    assert all(row.reason for row in ARGUMENTS if row.handling is not Handling.APPLIES)


def test_every_argument_spelled_out_at_rllibs_default_is_accepted_silently() -> None:
    defaults = {
        row.name: row.default
        for row in ARGUMENTS
        if row.handling is not Handling.APPLIES
        and row.name not in ("input_creator", "output_creator")
    }
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        batch = _batch(
            validate_env=None,
            policy_spec=None,
            policy_mapping_fn=None,
            policies_to_train=None,
            count_steps_by="env_steps",
            batch_mode="truncate_episodes",
            episode_horizon=None,
            num_envs=1,
            observation_filter="NoFilter",
            clip_rewards=None,
            normalize_actions=True,
            clip_actions=False,
            env_config=None,
            worker_index=0,
            num_workers=0,
            recreated_worker=False,
            log_level=None,
            callbacks=None,
            input_creator=lambda ioctx: ioctx.default_sampler_input(),
            output_creator=lambda ioctx: NoopOutput(),
            soft_horizon=False,
            no_done_at_end=False,
            extra_python_environs=None,
            spaces=None,
            policy=None,
            disable_env_checking=False,
            **defaults,
        )
    assert _ignored_warnings(record) == []
    assert batch == _batch()


@pytest.mark.parametrize("name", sorted(IGNORED))
def test_an_ignored_argument_warns_in_one_line_and_changes_no_data(name: str) -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        batch = _batch(**{name: IGNORED[name]})
    [message] = _ignored_warnings(record)
    assert message.startswith(f"RolloutWorker ignores {name}=") and "\n" not in message
    assert batch == _batch()


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_argument_names_the_reason(name: str) -> None:
    value, reason = REFUSED[name]
    with pytest.raises(ConfigError, match=rf"RolloutWorker\({name}=.*refused: .*{reason}"):
        _batch(**{name: value})


def test_rllibs_other_values_that_change_nothing_here_are_accepted_silently() -> None:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        # Empty configs ask for nothing; RLlib preprocesses Atari envs only.
        batch = _batch(model_config={}, policy_config={}, preprocessor_pref="rllib")
        batch_without_preprocessing = _batch(preprocessor_pref=None)
    assert _ignored_warnings(record) == []
    assert batch == _batch() == batch_without_preprocessing


class AtariLike(gym.Env[np.ndarray, int]):
    """An env RLlib takes for Atari (it has an ALE interface); rewards 5 per step."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (4,), np.uint8)
        self.action_space: Any = gym.spaces.Discrete(2)
        self.ale = object()
        self.steps = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(4, np.uint8), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        return np.full(4, self.steps, np.uint8), 5.0, self.steps >= 5, False, {}


def test_on_an_atari_env_preprocessing_is_refused_and_none_clips_rewards() -> None:
    for pref in ("deepmind", "rllib"):  # RLlib preprocesses Atari frames, even at its default
        with pytest.raises(ConfigError, match=r"preprocessor_pref=.*Atari.*preprocessor_pref=None"):
            RolloutWorker(env_creator=lambda ctx: AtariLike(), preprocessor_pref=pref)
    worker = RolloutWorker(
        env_creator=lambda ctx: AtariLike(), preprocessor_pref=None, rollout_fragment_length=5
    )
    batch = worker.sample()
    assert isinstance(batch, RolloutEpisodeBatch)
    np.testing.assert_array_equal(batch["rewards"], np.ones(5))  # RLlib's Atari clip


def test_input_evaluation_simulation_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"input_evaluation=.*'simulation' keeps"):
        _batch(input_evaluation=["simulation"])


def test_applied_arguments_recreated_worker_log_level_environs_and_spaces() -> None:
    rlfleet_logger = logging.getLogger("rlfleet")
    level = rlfleet_logger.level
    variable = "RLFLEET_TEST_EXTRA_ENVIRON"
    seen: list[str | None] = []

    def creator(ctx: EnvContext) -> gym.Env:
        seen.append(os.environ.get(variable))
        return gym.make("CartPole-v1")

    try:
        worker = RolloutWorker(
            env_creator=creator,
            recreated_worker=True,
            log_level="DEBUG",
            extra_python_environs={variable: 7},
        )
        assert worker.recreated_worker
        assert rlfleet_logger.level == logging.DEBUG
        assert seen == ["7"]  # set before the envs are built
    finally:
        rlfleet_logger.setLevel(level)
        os.environ.pop(variable, None)

    # A policy no agent maps to takes its spaces from `spaces`.
    box: gym.Space[Any] = gym.spaces.Box(-1, 1, (3,), np.float32)
    discrete: gym.Space[Any] = gym.spaces.Discrete(4)

    def spread(ctx: EnvContext) -> object:
        return simple_spread_v3.parallel_env(N=2, max_cycles=5)

    specs = {"shared": "random", "spare": "random"}

    def worker_with(**kwargs: Any) -> RolloutWorker:
        return RolloutWorker(
            env_creator=spread,
            policy_spec=specs,
            policy_mapping_fn=lambda agent, episode, **kw: "shared",
            **kwargs,
        )

    def spare_space(worker: RolloutWorker) -> gym.Space:
        spare = worker.get_policy("spare")
        assert spare is not None
        return spare.env_spec.observation_space

    assert spare_space(worker_with()) != box  # the agents' spaces
    assert spare_space(worker_with(spaces={"spare": (box, discrete)})) == box


def test_policy_is_rllibs_obsolete_name_for_policy_spec() -> None:
    with pytest.warns(IgnoredArgumentWarning, match="obsolete name for policy_spec"):
        worker = RolloutWorker(env_creator=cartpole, policy="random")
    assert type(worker.get_policy()).__name__ == "RandomPolicy"
    again = RolloutWorker(**worker.creation_args())
    assert type(again.get_policy()).__name__ == "RandomPolicy"
    with pytest.raises(ConfigError, match="policy_spec and policy"):
        RolloutWorker(env_creator=cartpole, policy="random", policy_spec="random")


def test_creation_args_keep_the_rllib_arguments() -> None:
    worker = RolloutWorker(env_creator=cartpole, sample_async=False, num_envs=2)
    args = worker.creation_args()
    assert args["sample_async"] is False and args["num_envs"] == 2


def test_docs_list_every_argument_that_does_not_apply_with_its_handling() -> None:
    text = (Path(__file__).parent.parent / "docs" / "rllib.md").read_text()
    table = text.split("| argument (RLlib's default) |", 1)[1].split("\n\n", 1)[0]
    listed: dict[str, str] = {}
    for line in table.splitlines()[2:]:
        first, handling = line.split(" | ")[:2]
        for name in re.findall(r"`(\w+)`", first):
            listed[name] = handling
    rows = {row.name: row for row in ARGUMENTS if row.handling is not Handling.APPLIES}
    assert set(listed) == set(rows)
    for name, row in rows.items():
        assert listed[name].startswith(row.handling.value), name
