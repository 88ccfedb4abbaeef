"""The policies of a RolloutWorker: building them, mapping agents, choosing who trains.

A policy entry is given as one of:

- a :class:`~rlfleet.policies.PolicySpec` or its name/import path (acts only);
- a learner such as :class:`rlfleet.learners.VPG` (acts through the policy
  spec it names and can learn: ``train_step``, and optionally
  ``compute_gradients``/``apply_gradients``);
- a tuple ``(spec_or_learner, observation_space, action_space)`` giving the
  spaces explicitly (RLlib's ``PolicySpec`` tuple without the config);
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
from rlfleet.policies import Policy, PolicySpec, default_policy_spec, make_policy
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
    if isinstance(value, tuple):
        if len(value) != 3:
            raise ConfigError(
                f"policy {policy_id!r}: a tuple entry is (spec, observation_space, "
                f"action_space), got {len(value)} items"
            )
        value, observation_space, action_space = value
        spaces = (observation_space, action_space)
    learner = value if isinstance(value, LearnerLike) else None
    if learner is not None:
        env_spec = learner.env_spec
        if spaces is not None and (env_spec.observation_space, env_spec.action_space) != spaces:
            raise ConfigError(
                f"policy {policy_id!r}: the learner's spaces ({env_spec.observation_space}, "
                f"{env_spec.action_space}) are not those of its agents {spaces}"
            )
        spec = learner.policy_spec
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
