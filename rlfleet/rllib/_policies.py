"""The policies of a RolloutWorker: building them, mapping agents, choosing who trains.

A policy entry is given as one of:

- a :class:`~rlfleet.policies.PolicySpec` or its name/import path (acts only);
- a learner such as :class:`rlfleet.learners.VPG` (acts through the policy
  spec it names and can learn: ``train_step``, and optionally
  ``compute_gradients``/``apply_gradients``);
- a class: a :class:`~rlfleet.policies.Policy` subclass (built from its
  import path, as a spec) or a learner class (built as
  ``cls(env_spec, **config)``), RLlib's bare policy class;
- a tuple ``(entry, observation_space, action_space)`` or RLlib's
  ``(entry, observation_space, action_space, config)``: None spaces are
  the agents' (as in RLlib), and ``config`` holds the constructor's keyword
  arguments (a spec's kwargs, merged over the spec's own);
- None: the built-in MLP that fits the spaces.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from rlfleet._util.imports import import_object
from rlfleet.core.env_spec import EnvSpec
from rlfleet.core.episode_batch import EpisodeBatch
from rlfleet.errors import ConfigError
from rlfleet.policies import (
    BUILTIN_POLICIES,
    Policy,
    PolicySpec,
    default_policy_spec,
    make_policy,
)
from rlfleet.rllib.filters import ObservationFilter, make_filter

#: RLlib's id of the single policy.
DEFAULT_POLICY_ID = "default_policy"

#: Built-in policy-mapping functions, by name.
BUILTIN_MAPPINGS = ("shared", "per-agent")

PolicyMappingFn = Callable[..., str]
IsPolicyToTrain = Callable[[str, Any], bool]


@runtime_checkable
class LearnerLike(Protocol):
    """What a policy entry must offer to learn (``rlfleet.learners.VPG`` does)."""

    env_spec: EnvSpec
    policy_spec: PolicySpec

    def get_params(self) -> dict[str, np.ndarray]:
        """The acting policy's parameters."""

    def set_params(self, params: Mapping[str, np.ndarray]) -> None:
        """Replaces the acting policy's parameters."""

    def train_step(self, batch: EpisodeBatch) -> dict[str, float]:
        """One update from a batch."""


@dataclass
class PolicyEntry:
    """One policy of a worker.

    Attributes:
        policy_id: Its id.
        policy: The policy that acts.
        spec: The spec it was built from.
        learner: What updates it, or None for a policy that only acts.
        env_spec: The spaces it acts in (observations as the policy sees them).
        obs_filter: Its observation filter.
    """

    policy_id: str
    policy: Policy
    spec: PolicySpec
    learner: Any
    env_spec: EnvSpec
    obs_filter: ObservationFilter

    def sync_from_learner(self) -> None:
        """Copies the learner's parameters into the acting policy."""
        if self.learner is not None:
            self.policy.set_param_values(self.learner.get_params())


def build_entry(
    policy_id: str,
    value: Any,
    spaces: tuple[gym.Space, gym.Space] | None,
    *,
    filter_name: str,
    seed: int | None,
) -> PolicyEntry:
    """Builds one policy entry (see the module docstring for ``value``).

    Args:
        policy_id: The policy's id.
        value: The entry as the user gave it.
        spaces: ``(observation_space, action_space)`` of the agents mapped to
            it, or None if no agent is.
        filter_name: The worker's ``observation_filter``.
        seed: Seed of the policy's generator (and built-ins' initial weights).

    Raises:
        ConfigError: If the entry is malformed, its spaces are unknown, or a
            learner's spaces differ from the env's.
    """
    config: Mapping[str, Any] = {}
    if isinstance(value, tuple):
        if len(value) not in (3, 4):
            raise ConfigError(
                f"policy {policy_id!r}: a tuple entry is (entry, observation_space, "
                f"action_space) or RLlib's (entry, observation_space, action_space, config), "
                f"got {len(value)} items"
            )
        value, observation_space, action_space, *rest = value
        config = _config_of(policy_id, rest[0] if rest else None)
        if observation_space is not None or action_space is not None:
            # RLlib: a None space is the agents'.
            agents = spaces or (None, None)
            observation_space = agents[0] if observation_space is None else observation_space
            action_space = agents[1] if action_space is None else action_space
            if observation_space is None or action_space is None:
                raise ConfigError(
                    f"policy {policy_id!r}: its tuple gives one space and no agent maps to "
                    "it to tell the other; give both"
                )
            spaces = (observation_space, action_space)
    if isinstance(value, type):
        value = _from_class(policy_id, value, config, spaces)
        config = {}
    learner = value if isinstance(value, LearnerLike) else None
    if learner is not None:
        env_spec = learner.env_spec
        if spaces is not None and (env_spec.observation_space, env_spec.action_space) != spaces:
            raise ConfigError(
                f"policy {policy_id!r}: the learner's spaces ({env_spec.observation_space}, "
                f"{env_spec.action_space}) are not those of its agents {spaces}"
            )
        spec = learner.policy_spec
        if config:
            raise ConfigError(
                f"policy {policy_id!r}: a built learner takes no config ({sorted(config)}); "
                "give its arguments when you build it, or give its class"
            )
    else:
        if spaces is None:
            raise ConfigError(
                f"policy {policy_id!r}: no agent maps to it and the agents' spaces differ, so "
                f"its spaces are unknown; give "
                "(spec, observation_space, action_space)"
            )
        env_spec = EnvSpec(*spaces)
        if value is not None and not isinstance(value, PolicySpec | str):
            raise ConfigError(
                f"policy {policy_id!r}: expected a PolicySpec, a policy name or import path, "
                f"a learner (with env_spec, policy_spec, get_params, set_params, train_step) "
                f"or None, got {type(value).__name__}"
            )
        spec = default_policy_spec(env_spec) if value is None else _spec_of(value)
        if config:
            spec = PolicySpec(spec.name, {**spec.kwargs, **config})
    policy = make_policy(spec, env_spec, seed=seed)
    entry = PolicyEntry(
        policy_id,
        policy,
        spec,
        learner,
        env_spec,
        make_filter(filter_name, env_spec.observation_space),
    )
    entry.sync_from_learner()
    return entry


def _config_of(policy_id: str, config: Any) -> Mapping[str, Any]:
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"policy {policy_id!r}: the config of a 4-tuple entry must be a dict of the "
            f"policy's keyword arguments, got {type(config).__name__}"
        )
    return config


def _from_class(
    policy_id: str,
    cls: type,
    config: Mapping[str, Any],
    spaces: tuple[gym.Space, gym.Space] | None,
) -> Any:
    """A bare class as an entry: a Policy subclass's spec, or a built learner."""
    if issubclass(cls, Policy):
        builtin = [name for name, known in BUILTIN_POLICIES.items() if known is cls]
        name = builtin[0] if builtin else f"{cls.__module__}:{cls.__qualname__}"
        if "<locals>" in name:
            raise ConfigError(
                f"policy {policy_id!r}: {cls.__qualname__} is defined inside a function; "
                "rlfleet builds policies from their import path, so define it at module level"
            )
        return PolicySpec(name, dict(config))
    if callable(getattr(cls, "train_step", None)):
        if spaces is None:
            raise ConfigError(
                f"policy {policy_id!r}: no agent maps to it and the agents' spaces differ, so "
                f"the spaces to build {cls.__qualname__} in are unknown; give "
                "(cls, observation_space, action_space, config)"
            )
        try:
            learner_class: Any = cls
            return learner_class(EnvSpec(*spaces), **config)
        except TypeError as exc:
            raise ConfigError(
                f"policy {policy_id!r}: {cls.__qualname__}(env_spec, **config) failed: {exc}"
            ) from exc
    raise ConfigError(
        f"policy {policy_id!r}: class {cls.__qualname__} is neither an rlfleet Policy "
        "subclass nor a learner class (with train_step); RLlib's TF/Torch policy classes do "
        "not run on rlfleet: use a built-in policy, a Policy subclass or a learner such as "
        "rlfleet.learners.VPG"
    )


def _spec_of(value: PolicySpec | str) -> PolicySpec:
    if isinstance(value, PolicySpec):
        return value
    return PolicySpec.from_json(value) if value.startswith("{") else PolicySpec(value)


def mapping_fn(
    value: PolicyMappingFn | str | None, policy_ids: Callable[[], list[str]]
) -> PolicyMappingFn:
    """Resolves ``policy_mapping_fn``: a callable, a built-in name, an import path or None.

    Args:
        value: ``"shared"`` (every agent to the one policy, or to
            ``default_policy``), ``"per-agent"`` (policy id = agent id), an
            import path ``"package.module:function"``, a callable
            ``fn(agent_id, episode, worker=...) -> policy_id``, or None
            (``"shared"``).
        policy_ids: Returns the worker's current policy ids.

    Raises:
        ConfigError: If a name is neither built-in nor an importable callable.
    """
    if value is None or value == "shared":

        def shared(agent_id: str, episode: Any, **kwargs: Any) -> str:
            ids = policy_ids()
            if len(ids) == 1:
                return ids[0]
            if DEFAULT_POLICY_ID in ids:
                return DEFAULT_POLICY_ID
            raise ConfigError(
                f"policy_mapping_fn 'shared' cannot choose among policies {ids} for agent "
                f"{agent_id!r}; give a policy_mapping_fn"
            )

        return shared
    if value == "per-agent":
        return lambda agent_id, episode, **kwargs: str(agent_id)
    if isinstance(value, str):
        value = import_object(value, "policy_mapping_fn")
    if not callable(value):
        raise ConfigError(
            f"policy_mapping_fn must be callable, one of {BUILTIN_MAPPINGS} or an import path, "
            f"got {value!r}"
        )
    return value


def is_to_train_fn(value: Container[str] | IsPolicyToTrain | None) -> IsPolicyToTrain:
    """Resolves ``policies_to_train``: None (all), a container of ids, or ``fn(pid, batch)``.

    Raises:
        ConfigError: If it is none of those (a bare string is refused, as it
            would test substrings).
    """
    if value is None:

        def every(policy_id: str, batch: Any = None) -> bool:
            return True

        return every
    if isinstance(value, str):
        raise ConfigError(
            f"policies_to_train must be a collection of policy ids or a callable, got the "
            f"string {value!r}; write [{value!r}]"
        )
    if callable(value):
        return value
    if isinstance(value, Container):
        ids = value

        def listed(policy_id: str, batch: Any = None) -> bool:
            return policy_id in ids

        return listed
    raise ConfigError(
        f"policies_to_train must be None, a collection of policy ids or a callable, got {value!r}"
    )
