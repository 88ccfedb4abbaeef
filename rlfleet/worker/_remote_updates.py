"""What the coordinator's agent and env updates mean on a remote worker.

An update arrives as rlfleet's own types (:mod:`rlfleet.protocol.updates`);
these turn it into what :class:`~rlfleet.worker.vec.VecWorker` applies,
refusing what must not come from the network (module-naming env ids,
pickles unless both sides opted in).
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from rlfleet._util.values import json_object
from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, PolicyError
from rlfleet.policies import Policy, PolicySpec, make_policy
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.security import PickleGate
from rlfleet.worker.vec import VecWorker


def agent_of(
    update: AgentChange, vec: VecWorker, pickle: PickleGate, *, seed: int, imports: tuple[str, ...]
) -> Policy | dict[str, Any]:
    """The Policy (new spec) or merged parameter dict an update stands for.

    Parameters alone replace the same-named ones of the current policy
    (the coordinator merges updates the same way).
    """
    params: dict[str, Any] = dict(update.params)
    if update.pickled_policy:
        policy = pickle.loads(update.pickled_policy, "AgentUpdate.pickled_policy", PolicyError)
        if not isinstance(policy, Policy):
            raise PolicyError(
                f"AgentUpdate.pickled_policy holds a {type(policy).__name__}, not a rlfleet Policy"
            )
        if params:
            policy.set_param_values({**policy.get_param_values(), **params})
        return policy
    if update.policy is not None:
        spec = PolicySpec(
            update.policy.name,
            json_object(update.policy.kwargs_json, "AgentUpdate.policy.kwargs_json"),
        )
        policy = make_policy(
            spec,
            vec.env_spec,
            seed=seed,
            allowed_modules=imports,
        )
        if params:
            policy.set_param_values({**policy.get_param_values(), **params})
        return policy
    if not params:
        raise PolicyError("the agent update carries neither a policy spec nor parameters")
    current = vec.policy
    if current is None:
        raise PolicyError("parameters arrived before the worker had an env and a policy")
    return {**current.get_param_values(), **params}


def env_config(
    update: EnvChange, imports: tuple[str, ...], pickle: PickleGate
) -> EnvConfig | Callable[[], gym.Env]:
    """The EnvConfig (or allowed pickled factory) of an EnvUpdate.

    Refuses what must not come from the network: module-naming ids, and
    pickles unless both sides opted in.
    """
    if update.pickled_env_factory:
        factory = pickle.loads(
            update.pickled_env_factory, "EnvUpdate.pickled_env_factory", ConfigError
        )
        if not callable(factory):
            raise ConfigError(
                f"EnvUpdate.pickled_env_factory holds a {type(factory).__name__}, not a "
                "callable that returns an env"
            )
        return factory
    if ":" in update.env_id:
        raise ConfigError(
            f"env id {update.env_id!r} names a module to import, which this worker refuses "
            "from the network; start the worker with --import MODULE and send the plain id"
        )
    return EnvConfig(
        update.env_id,
        json_object(update.kwargs_json, "EnvUpdate.kwargs_json"),
        update.max_episode_length,
        imports,
        vectorization=update.vectorization or None,
    )


def observation_bytes(spec: EnvSpec) -> int:
    """Bytes of one observation: a lower bound of a step's size on the wire."""
    space = spec.observation_space
    if space.shape is None or space.dtype is None:
        return 0
    return math.prod(space.shape) * space.dtype.itemsize


def format_traceback(exc: BaseException) -> str:
    """The formatted traceback of ``exc``, for an error report."""
    return "".join(traceback.format_exception(exc))
