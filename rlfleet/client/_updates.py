"""Turn a learner's ``agent_update`` / ``env_update`` arguments into changes.

The samplers accept the same loose forms as garage and ``LocalSampler``
(a param dict, a policy, a spec, an env id, ...); this module is the one
place that decides what each form means for the fleet: an
:class:`~rlfleet.protocol.updates.AgentChange` or
:class:`~rlfleet.protocol.updates.EnvChange`. (The messages themselves are
accepted too: ``rlfleet.client._learner_messages`` reads those.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeAlias

import numpy as np

from rlfleet._util.values import json_object
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError
from rlfleet.policies import BUILTIN_POLICIES, Policy, PolicySpec
from rlfleet.protocol.updates import AgentChange, EnvChange, PolicyChoice
from rlfleet.wire.tensor_messages import copy_tensor_map

#: The forms of ``agent_update`` arguments that are not messages (see :func:`agent_change`).
AgentUpdateForm: TypeAlias = (
    Mapping[str, np.ndarray]
    | PolicySpec
    | str
    | tuple[PolicySpec | str, Mapping[str, np.ndarray]]
    | Policy
)
#: The forms of ``env_update`` arguments that are not messages (see :func:`env_change`).
EnvUpdateForm: TypeAlias = EnvConfig | str

# Constructor arguments that shape a built-in policy's parameters or
# behaviour; everything else (seed, initial values) is replaced by the
# params that travel with the spec.
_SPEC_ATTRIBUTES = ("hidden_sizes", "activation", "deterministic")


def agent_change(update: AgentUpdateForm) -> AgentChange:
    """The AgentChange an ``agent_update`` argument stands for.

    Args:
        update: One of

            * a mapping name -> array: new parameters for the current policy;
            * a :class:`PolicySpec`, a built-in name (``"mlp-categorical"``),
              an import path ``"pkg.mod:Class"`` or a spec's JSON text: build
              this policy (with its default initial weights);
            * a tuple ``(spec, params)``: build the policy, then set the
              parameters;
            * a built-in :class:`Policy` instance: its spec (class and
              layer sizes) and its current parameters.

    Returns:
        The change; its ``version`` is left 0 (the coordinator assigns it).

    Raises:
        ConfigError: If the argument is none of those forms, or a policy
            instance is not a built-in (its class cannot be named for the
            workers: send ``(PolicySpec("pkg.mod:Class", kwargs), params)``).
        WireFormatError: If a parameter cannot travel as a tensor.
    """
    if isinstance(update, Policy):
        return _change(policy_spec_of(update), update.get_param_values())
    if isinstance(update, PolicySpec | str):
        return _change(_as_spec(update), None)
    if isinstance(update, tuple):
        if len(update) != 2 or not isinstance(update[1], Mapping):
            raise ConfigError(
                "an agent_update tuple must be (policy spec, params dict), got a tuple of "
                f"{len(update)} items: {tuple(type(item).__name__ for item in update)}"
            )
        return _change(_as_spec(update[0]), update[1])
    if isinstance(update, Mapping):
        return _change(None, update)
    raise ConfigError(
        "agent_update must be a params dict, a PolicySpec or policy name, a "
        f"(spec, params) tuple or a built-in Policy, got {type(update).__name__}"
    )


def env_change(update: EnvUpdateForm) -> EnvChange:
    """The EnvChange an ``env_update`` argument stands for.

    ``EnvConfig.imports`` are not sent: a worker imports only the modules
    its operator named (``rlfleet worker --import MODULE``), never modules
    named by the network. ``Fleet.local`` starts its workers with them.

    Args:
        update: An :class:`EnvConfig` or a registered gymnasium id such as
            ``"CartPole-v1"``.

    Returns:
        The change; its ``generation`` is left 0 (the coordinator assigns it).

    Raises:
        ConfigError: If the argument has another type or the id is invalid.
    """
    config = EnvConfig(update) if isinstance(update, str) else update
    if not isinstance(config, EnvConfig):
        raise ConfigError(
            f"env_update must be an EnvConfig or a gymnasium id string, got {type(update).__name__}"
        )
    return EnvChange(
        env_id=config.id,
        kwargs_json=json.dumps(dict(config.kwargs), separators=(",", ":")),
        max_episode_length=config.max_episode_length,
        vectorization=config.vectorization or "",
    )


def env_config_of(change: EnvChange) -> EnvConfig:
    """The EnvConfig an EnvChange describes (the inverse of :func:`env_change`).

    Raises:
        ConfigError: If the kwargs are not a JSON object or a field is invalid.
    """
    kwargs = json_object(change.kwargs_json, f"env {change.env_id!r} kwargs")
    return EnvConfig(
        change.env_id,
        kwargs,
        max_episode_length=change.max_episode_length,
        vectorization=change.vectorization or None,
    )


def policy_spec_of(policy: Policy) -> PolicySpec:
    """The spec of a policy instance: its own ``policy_spec``, or a built-in's by class.

    Raises:
        ConfigError: If the policy's class is not a built-in.
    """
    own = getattr(policy, "policy_spec", None)
    if isinstance(own, PolicySpec):  # e.g. TorchPolicy: it names its own module
        return own
    name = next((n for n, cls in BUILTIN_POLICIES.items() if type(policy) is cls), None)
    if name is None:
        raise ConfigError(
            f"cannot name the class of a {type(policy).__qualname__} for the workers (only "
            f"built-ins {sorted(BUILTIN_POLICIES)} are named automatically); pass "
            "agent_update=(PolicySpec('package.module:Class', kwargs), policy.get_param_values())"
        )
    kwargs: dict[str, Any] = {}
    for attribute in _SPEC_ATTRIBUTES:
        if hasattr(policy, attribute):
            value = getattr(policy, attribute)
            kwargs[attribute] = list(value) if isinstance(value, tuple) else value
    if not kwargs.get("deterministic", True):
        del kwargs["deterministic"]  # keep specs minimal: False is the default
    return PolicySpec(name, kwargs)


def _as_spec(spec: PolicySpec | str) -> PolicySpec:
    if isinstance(spec, PolicySpec):
        return spec
    if isinstance(spec, str):
        return PolicySpec.from_json(spec) if spec.lstrip().startswith("{") else PolicySpec(spec)
    raise ConfigError(
        f"a policy spec must be a PolicySpec or a policy name, got {type(spec).__name__}"
    )


def _change(spec: PolicySpec | None, params: Mapping[str, np.ndarray] | None) -> AgentChange:
    policy = None
    if spec is not None:
        policy = PolicyChoice(spec.name, json.dumps(spec.kwargs, separators=(",", ":")))
    if params is None:
        return AgentChange(policy=policy)
    bad = [name for name in params if not isinstance(name, str)]
    if bad:
        raise ConfigError(f"parameter names must be str, got {bad!r}")
    # A copy: the sampler keeps the change to push again after a coordinator
    # restart, and the learner goes on changing its arrays.
    return AgentChange(policy=policy, params=copy_tensor_map(params))
