"""The fleet's agent and env state, and checks of the updates learners send.

The coordinator keeps the *whole* current agent (policy spec + every
parameter) and env, so that a worker joining late is brought to exactly the
state the others are in, with the same version numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc

from rlfleet._values import json_object
from rlfleet.coordinator.failures import CallError, detail_of, invalid
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import (
    ConfigError,
    PermissionDeniedError,
    ResourceExhaustedError,
    WireFormatError,
)
from rlfleet.policies import PolicySpec
from rlfleet.security import Limits, PickleGate
from rlfleet.v1 import spaces_pb2, tensor_pb2, updates_pb2, worker_pb2
from rlfleet.wire import decode_env_spec, decode_tensor_map

#: What workers run before any agent update (version 0).
DEFAULT_POLICY = updates_pb2.PolicySpec(name="random", kwargs_json="{}")


@dataclass(frozen=True)
class AgentState:
    """The agent every ready worker runs.

    Attributes:
        version: 0 until the first update, then strictly increasing.
        policy: The spec workers build (None: their default random policy).
        params: Every parameter set since the policy was built, by name.
        pickled_policy: The pickled policy workers run instead of a spec
            (only with ``--allow-pickle``), or empty.
    """

    version: int = 0
    policy: updates_pb2.PolicySpec | None = None
    params: tensor_pb2.TensorMap = field(default_factory=tensor_pb2.TensorMap)
    pickled_policy: bytes = b""

    def apply(self, update: updates_pb2.AgentUpdate, version: int) -> AgentState:
        """The state after ``update``, as ``version``.

        A new policy spec starts from the parameters that come with it;
        parameters alone replace the same-named ones of the current state.
        """
        if update.HasField("policy") or update.pickled_policy:
            params = tensor_pb2.TensorMap()
            params.CopyFrom(update.params)
            policy = None if update.pickled_policy else update.policy
            return AgentState(version, policy, params, update.pickled_policy)
        merged = _merged(self.params, update.params)
        return AgentState(version, self.policy, merged, self.pickled_policy)

    def full_update(self, version: int | None = None) -> worker_pb2.CoordinatorMessage:
        """An AgentUpdate that brings any worker to this state."""
        return _agent_message(
            updates_pb2.AgentUpdate(
                version=self.version if version is None else version,
                policy=None if self.pickled_policy else self.policy or DEFAULT_POLICY,
                params=self.params,
                pickled_policy=self.pickled_policy,
            )
        )


def delta_update(update: updates_pb2.AgentUpdate, version: int) -> worker_pb2.CoordinatorMessage:
    """The learner's update as sent to workers that hold the previous version."""
    message = updates_pb2.AgentUpdate()
    message.CopyFrom(update)
    message.version = version
    return _agent_message(message)


def _agent_message(update: updates_pb2.AgentUpdate) -> worker_pb2.CoordinatorMessage:
    return worker_pb2.CoordinatorMessage(agent_update=update)


def _merged(old: tensor_pb2.TensorMap, new: tensor_pb2.TensorMap) -> tensor_pb2.TensorMap:
    merged = tensor_pb2.TensorMap()
    replaced = {entry.key: entry for entry in new.entries}
    for entry in old.entries:
        merged.entries.append(replaced.pop(entry.key, entry))
    merged.entries.extend(entry for entry in new.entries if entry.key in replaced)
    return merged


@dataclass(frozen=True)
class EnvState:
    """The env every ready worker runs.

    Attributes:
        update: The EnvUpdate (its generation set) workers get.
        spec_proto: The EnvSpec the first ready worker reported, as sent in
            headers (None until then).
        spec: ``spec_proto`` decoded, for checking results.
    """

    update: updates_pb2.EnvUpdate
    spec_proto: spaces_pb2.EnvSpec | None = None
    spec: EnvSpec | None = None

    @property
    def generation(self) -> int:
        """The env generation (>= 1)."""
        return self.update.generation

    def message(self) -> worker_pb2.CoordinatorMessage:
        """The EnvUpdate message for workers."""
        return worker_pb2.CoordinatorMessage(env_update=self.update)

    def with_spec(self, spec_proto: spaces_pb2.EnvSpec) -> EnvState:
        """The state with its spec known.

        Raises:
            WireFormatError: If the spec cannot be decoded.
        """
        return EnvState(self.update, spec_proto, decode_env_spec(spec_proto))

    def renumbered(self, generation: int) -> EnvState:
        """The same env as a new generation (its spec to be reported again)."""
        update = updates_pb2.EnvUpdate()
        update.CopyFrom(self.update)
        update.generation = generation
        return EnvState(update)


def env_update_of(config: EnvConfig, generation: int) -> updates_pb2.EnvUpdate:
    """The EnvUpdate for a locally configured env."""
    update = updates_pb2.EnvUpdate(
        generation=generation, env_id=config.id, kwargs_json=json.dumps(dict(config.kwargs))
    )
    if config.max_episode_length is not None:
        update.max_episode_length = config.max_episode_length
    if config.vectorization is not None:
        update.vectorization = config.vectorization
    return update


def check_env_update(update: updates_pb2.EnvUpdate) -> None:
    """Refuses env updates no worker should be sent.

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field. A pickled factory
            is :func:`check_pickles`' to allow or refuse.
    """
    if update.pickled_env_factory:
        return  # the factory is the whole env; kwargs and length do not apply
    if not update.env_id:
        raise invalid("EnvUpdate.env_id is empty; give a registered gymnasium id, e.g. CartPole-v1")
    if ":" in update.env_id:
        raise invalid(
            f"env id {update.env_id!r} names a module to import, which workers refuse from "
            "the network; start workers with --import MODULE and send the plain id"
        )
    kwargs = _json_object(update.kwargs_json, "EnvUpdate.kwargs_json")
    length = update.max_episode_length if update.HasField("max_episode_length") else None
    try:
        EnvConfig(update.env_id, kwargs, length, vectorization=update.vectorization or None)
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def check_agent_update(update: updates_pb2.AgentUpdate, limits: Limits) -> None:
    """Refuses agent updates that are malformed before any worker sees them.

    Parameter names and shapes are checked by the workers, which hold the
    policy; here only what needs no policy.

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field, RESOURCE_EXHAUSTED
            for a tensor over ``limits.max_tensor_elements``. A pickled
            policy is :func:`check_pickles`' to allow or refuse.
    """
    if not (update.HasField("policy") or update.pickled_policy or update.params.entries):
        raise invalid("an AgentUpdate needs a policy spec, parameters, or both; it had neither")
    if update.HasField("policy"):
        kwargs = _json_object(update.policy.kwargs_json, "AgentUpdate.policy.kwargs_json")
        try:
            PolicySpec(update.policy.name, kwargs)
        except ConfigError as exc:
            raise invalid(str(exc)) from None
    try:
        params = decode_tensor_map(update.params, name="AgentUpdate.params")
    except WireFormatError as exc:
        raise invalid(str(exc)) from None
    try:
        limits.check_tensor_map(params, "AgentUpdate.params")
    except ResourceExhaustedError as exc:
        raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None


def _json_object(text: str, where: str) -> dict[str, object]:
    try:
        return json_object(text, where)
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def check_pickles(
    update: updates_pb2.AgentUpdate | updates_pb2.EnvUpdate,
    gate: PickleGate,
    workers: Iterable[WorkerHandle],
) -> None:
    """Refuses pickled code unless this coordinator and every worker allow it.

    Raises:
        CallError: PERMISSION_DENIED (ERROR_KIND_PERMISSION) naming what
            is not allowed where.
    """
    if isinstance(update, updates_pb2.AgentUpdate):
        field_name, data = "AgentUpdate.pickled_policy", update.pickled_policy
    else:
        field_name, data = "EnvUpdate.pickled_env_factory", update.pickled_env_factory
    if not data:
        return
    try:
        gate.check_peers(field_name, {h.name: h.hello.capabilities for h in workers})
    except PermissionDeniedError as exc:
        message = str(exc)
        detail = detail_of(updates_pb2.ERROR_KIND_PERMISSION, message)
        raise CallError(grpc.StatusCode.PERMISSION_DENIED, message, detail) from None
