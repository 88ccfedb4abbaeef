"""RLlib's RolloutWorker arguments: one table of what rlfleet does with each.

Every constructor argument of RLlib's ``RolloutWorker`` (the one the seed
documents) is a row of :data:`ARGUMENTS`: its RLlib default and how rlfleet
handles it.

- ``applies``: :class:`~rlfleet.rllib.RolloutWorker` takes it as a parameter
  and does what RLlib does with it (docs/rllib.md says how).
- ``ignored``: accepted; a value other than the default cannot apply here
  but changes nothing in the data ``sample()`` returns, so it is ignored with
  a one-line :class:`IgnoredArgumentWarning` saying why.
- ``refused``: a value other than the default would change the data if it
  were ignored, so it is a :class:`~rlfleet.errors.ConfigError` naming the
  reason and what to do instead.

Every argument is accepted at its default, with one exception that follows
the rule: an ``ignored`` row may name values for which ignoring would change
the data after all (``preprocessor_pref`` on an Atari env, whose frames RLlib
would preprocess), which are refused like a ``refused`` row.
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlfleet.errors import ConfigError


class Handling(enum.Enum):
    """What rlfleet does with an RLlib argument (see the module docstring)."""

    APPLIES = "applies"
    IGNORED = "ignored"
    REFUSED = "refused"


class IgnoredArgumentWarning(UserWarning):
    """An RLlib argument was given a value that cannot apply and changes nothing."""


#: The default of an argument RLlib requires (``env_creator``).
REQUIRED = "(required)"


@dataclass(frozen=True)
class RLlibArgument:
    """One row of the table.

    Attributes:
        name: The argument's name.
        default: RLlib's default (for ``input_creator``/``output_creator``,
            whose defaults are functions, a description of it).
        handling: What rlfleet does with it.
        reason: Why it cannot apply, and what to do instead (``ignored`` and
            ``refused`` rows).
        is_default: Whether a value counts as the default, where ``==`` with
            ``default`` cannot tell (RLlib's defaults that are code or empty
            containers).
        refuse_if: For ``ignored`` rows: given the value and the worker's
            envs, the reason ignoring it would change the data after all,
            or None.
    """

    name: str
    default: Any
    handling: Handling
    reason: str = ""
    is_default: Callable[[Any], bool] | None = None
    refuse_if: Callable[[Any, Sequence[Any]], str | None] | None = None

    def at_default(self, value: Any) -> bool:
        """Whether ``value`` is this argument's default."""
        if self.is_default is not None:
            return self.is_default(value)
        return bool(value is self.default or value == self.default)


def is_atari(env: Any) -> bool:
    """RLlib's test for an Atari env: its unwrapped env has an ALE interface."""
    return hasattr(getattr(env, "unwrapped", env), "ale")


class _SamplerInput:
    """What the probe's ``default_sampler_input()`` returns: RLlib's default input."""


class _IOContextProbe:
    """Stands for RLlib's IOContext, to see whether an input/output creator is the default."""

    def __init__(self) -> None:
        self.log_dir = ""
        self.config: dict[str, Any] = {}
        self.worker_index = 0
        self.worker = None

    def default_sampler_input(self) -> _SamplerInput:
        return _SamplerInput()


def _creates(creator: Any, accepted: Callable[[Any], bool]) -> bool:
    """Whether ``creator`` is None or builds, from a probe context, what ``accepted`` takes."""
    if creator is None:
        return True
    if not callable(creator):
        return False
    try:
        return accepted(creator(_IOContextProbe()))
    except Exception:  # a creator that needs RLlib's real context is not the default
        return False


def _empty(value: Any) -> bool:
    return value is None or (hasattr(value, "__len__") and len(value) == 0)


def _atari_preprocessing(value: Any, envs: Sequence[Any]) -> str | None:
    if value is None or not any(is_atari(env) for env in envs):
        return None
    return (
        f"RLlib would preprocess this Atari env's frames ({value!r}: DeepMind's wrappers or "
        "its pixel preprocessor) and rlfleet does not; wrap the env in env_creator (e.g. "
        "gymnasium's AtariPreprocessing and FrameStackObservation) and pass "
        "preprocessor_pref=None"
    )


def _simulation(value: Any, envs: Sequence[Any]) -> str | None:
    if value is not None and "simulation" in value:
        return (
            "'simulation' keeps the sampled data for evaluation only, never for learning; "
            "rlfleet's sample() returns what it samples. Sample evaluation episodes with a "
            "second RolloutWorker"
        )
    return None


_A, _I, _R = Handling.APPLIES, Handling.IGNORED, Handling.REFUSED
_POLICY_SETTINGS = (
    "a policy's settings are those of its policy_spec entry (PolicySpec kwargs, a learner's "
    "arguments, or the config of a (cls, observation_space, action_space, config) entry); "
    "RLlib would build the policy with these, so ignoring them would give other actions. "
    "Move them into the entries"
)

#: Every RLlib RolloutWorker argument, in the seed's order.
ARGUMENTS: tuple[RLlibArgument, ...] = (
    RLlibArgument("env_creator", REQUIRED, _A),
    RLlibArgument("validate_env", None, _A),
    RLlibArgument("policy_spec", None, _A),
    RLlibArgument("policy_mapping_fn", None, _A),
    RLlibArgument("policies_to_train", None, _A),
    RLlibArgument(
        "tf_session_creator",
        None,
        _I,
        "rlfleet has no TensorFlow policies, so it creates no session",
    ),
    RLlibArgument("rollout_fragment_length", 100, _A),
    RLlibArgument("count_steps_by", "env_steps", _A),
    RLlibArgument("batch_mode", "truncate_episodes", _A),
    RLlibArgument("episode_horizon", None, _A),
    RLlibArgument(
        "preprocessor_pref",
        "deepmind",
        _I,
        "RLlib knows 'deepmind', 'rllib' and None, and uses them for Atari envs only (as "
        "it does, rlfleet ignores them on other envs)",
        is_default=lambda value: value in (None, "deepmind", "rllib"),
        refuse_if=_atari_preprocessing,
    ),
    RLlibArgument(
        "sample_async",
        False,
        _I,
        "sampling is synchronous: each sample() acts with the weights set before it (the "
        "on-policy data asynchronous sampling approximates)",
    ),
    RLlibArgument(
        "compress_observations",
        False,
        _I,
        "batches hold plain arrays (the fleet's wire codec compresses what travels); the "
        "observations are the same",
    ),
    RLlibArgument("num_envs", 1, _A),
    RLlibArgument(
        "observation_fn",
        None,
        _R,
        "it rewrites what policies observe; rlfleet has no observation functions: wrap the "
        "PettingZoo env in env_creator instead",
    ),
    RLlibArgument("observation_filter", "NoFilter", _A),
    RLlibArgument("clip_rewards", None, _A),
    RLlibArgument("normalize_actions", True, _A),
    RLlibArgument("clip_actions", False, _A),
    RLlibArgument("env_config", None, _A),
    RLlibArgument("model_config", None, _R, _POLICY_SETTINGS, is_default=_empty),
    RLlibArgument("policy_config", None, _R, _POLICY_SETTINGS, is_default=_empty),
    RLlibArgument("worker_index", 0, _A),
    RLlibArgument("num_workers", 0, _A),
    RLlibArgument("recreated_worker", False, _A),
    RLlibArgument(
        "record_env",
        False,
        _I,
        "a RolloutWorker records nothing itself: wrap the env in gymnasium's RecordVideo or "
        "RecordEpisodeStatistics in env_creator",
    ),
    RLlibArgument(
        "log_dir",
        None,
        _I,
        "a RolloutWorker writes no files (no recording, no offline output)",
    ),
    RLlibArgument("log_level", None, _A),
    RLlibArgument("callbacks", None, _A),
    RLlibArgument(
        "input_creator",
        "(sample the envs)",
        _R,
        "offline input is not supported: sample() steps the envs, and reading experiences "
        "from elsewhere would be other data",
        is_default=lambda value: _creates(value, lambda made: isinstance(made, _SamplerInput)),
    ),
    RLlibArgument(
        "input_evaluation",
        frozenset(),
        _I,
        "off-policy estimates ('is', 'wis') of offline input are not computed; they are "
        "metrics, not batch data",
        is_default=_empty,
        refuse_if=_simulation,
    ),
    RLlibArgument(
        "output_creator",
        "(no output)",
        _R,
        "offline output is not supported, so the batches would not be written; save "
        "sample()'s batches with rlfleet.save_batch",
        is_default=lambda value: _creates(
            value, lambda made: made is None or type(made).__name__ == "NoopOutput"
        ),
    ),
    RLlibArgument(
        "remote_worker_envs",
        False,
        _I,
        "the envs step in this process; the data are the same. For envs in other processes "
        "use rlfleet's SubprocVectorEnv, or the fleet (RolloutWorkerGroup)",
    ),
    RLlibArgument(
        "remote_env_batch_wait_ms",
        0,
        _I,
        "it applies to remote_worker_envs only, and the envs step in this process",
    ),
    RLlibArgument("soft_horizon", False, _A),
    RLlibArgument("no_done_at_end", False, _A),
    RLlibArgument("seed", None, _A),
    RLlibArgument("extra_python_environs", None, _A),
    RLlibArgument(
        "fake_sampler",
        False,
        _R,
        "it returns the first batch over and over; rlfleet always samples",
    ),
    RLlibArgument("spaces", None, _A),
    RLlibArgument("policy", None, _A),
    RLlibArgument(
        "monitor_path",
        None,
        _I,
        "obsolete in RLlib (record_env's old name); a RolloutWorker records nothing itself: "
        "wrap the env in gymnasium's RecordVideo in env_creator",
    ),
    RLlibArgument("disable_env_checking", False, _A),
)

ARGUMENTS_BY_NAME: Mapping[str, RLlibArgument] = {row.name: row for row in ARGUMENTS}


def check_arguments(given: Mapping[str, Any]) -> None:
    """Checks the arguments that do not apply, before any env is built.

    Args:
        given: The keyword arguments RolloutWorker does not take as
            parameters (the ``ignored`` and ``refused`` rows, or unknown).

    Raises:
        ConfigError: For an unknown argument, or a ``refused`` one away from
            its default.
    """
    for name, value in given.items():
        row = ARGUMENTS_BY_NAME.get(name)
        if row is None or row.handling is Handling.APPLIES:
            raise ConfigError(f"RolloutWorker got an unknown argument {name!r}")
        if row.handling is Handling.REFUSED and not row.at_default(value):
            raise ConfigError(f"RolloutWorker({name}={value!r}) is refused: {row.reason}")


def check_against_envs(given: Mapping[str, Any], envs: Sequence[Any]) -> None:
    """Refuses ignored values that would change these envs' data; warns about the others.

    Args:
        given: As for :func:`check_arguments`.
        envs: The worker's envs (as ``env_creator`` returned them).

    Raises:
        ConfigError: If ignoring a value would change the data.
    """
    for row in ARGUMENTS:
        if row.handling is not Handling.IGNORED:
            continue
        value = given.get(row.name, row.default)
        refusal = row.refuse_if(value, envs) if row.refuse_if is not None else None
        if refusal is not None:
            raise ConfigError(f"RolloutWorker({row.name}={value!r}) is refused: {refusal}")
        if row.name in given and not row.at_default(value):
            warnings.warn(
                f"RolloutWorker ignores {row.name}={value!r}: {row.reason}",
                IgnoredArgumentWarning,
                stacklevel=3,
            )


__all__ = [
    "ARGUMENTS",
    "ARGUMENTS_BY_NAME",
    "Handling",
    "IgnoredArgumentWarning",
    "RLlibArgument",
    "check_against_envs",
    "check_arguments",
    "is_atari",
]
