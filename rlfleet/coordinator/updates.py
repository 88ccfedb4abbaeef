"""The fleet's agent and env state, and checks of the updates learners send.

The coordinator keeps the *whole* current agent (policy spec + every
parameter) and env, so that a worker joining late is brought to exactly the
state the others are in, with the same version numbers.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

import grpc

from rlfleet._util.values import json_object
from rlfleet.coordinator.failures import CallError, detail_of, invalid
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import ConfigError, PermissionDeniedError, ResourceExhaustedError
from rlfleet.policies import PolicySpec
from rlfleet.protocol.error_reports import ErrorKind
from rlfleet.protocol.updates import AgentChange, EnvChange, PolicyChoice
from rlfleet.security import Limits, PickleGate
from rlfleet.wire import parse_env_spec

#: What workers run before any agent update (version 0).
DEFAULT_POLICY = PolicyChoice(name="random", kwargs_json="{}")


def whole_agent(agent: AgentChange) -> AgentChange:
    """The update that brings any worker to ``agent`` (the fleet's whole agent).

    ``agent`` is the fleet's state: every update since its policy, merged
    (:meth:`AgentChange.after`); version 0 and no policy mean workers'
    default random policy, which is named here.
    """
    if agent.pickled_policy or agent.policy is not None:
        return agent
    return dataclasses.replace(agent, policy=DEFAULT_POLICY)


@dataclasses.dataclass(frozen=True)
class EnvState:
    """The env every ready worker runs.

    Attributes:
        update: The env change (its generation set) workers get.
        spec_wire: The EnvSpec the first ready worker reported, serialized
            as it sent it: headers and GetStatus pass it on (None until then).
        spec: ``spec_wire`` decoded, for checking results.
    """

    update: EnvChange
    spec_wire: bytes | None = None
    spec: EnvSpec | None = None

    @property
    def generation(self) -> int:
        """The env generation (>= 1)."""
        return self.update.generation

    def with_spec(self, spec_wire: bytes) -> EnvState:
        """The state with its spec known.

        Raises:
            WireFormatError: If the spec cannot be decoded.
        """
        return EnvState(self.update, spec_wire, parse_env_spec(spec_wire))

    def renumbered(self, generation: int) -> EnvState:
        """The same env as a new generation (its spec to be reported again)."""
        return EnvState(self.update.renumbered(generation))


def env_update_of(config: EnvConfig, generation: int) -> EnvChange:
    """The env change for a locally configured env."""
    return EnvChange(
        generation=generation,
        env_id=config.id,
        kwargs_json=json.dumps(dict(config.kwargs)),
        max_episode_length=config.max_episode_length,
        vectorization=config.vectorization or "",
    )


def check_env_update(update: EnvChange) -> None:
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
    try:
        EnvConfig(
            update.env_id,
            kwargs,
            update.max_episode_length,
            vectorization=update.vectorization or None,
        )
    except ConfigError as exc:
        raise invalid(str(exc)) from None


#: Highest AgentUpdate.version a learner may name (restoring its agent): far
#: below the int64 limit, so that versions counted on from it never overflow.
MAX_LEARNER_AGENT_VERSION = 1 << 53


def check_agent_update(update: AgentChange, limits: Limits) -> None:
    """Refuses agent updates that are malformed before any worker sees them.

    Parameter names and shapes are checked by the workers, which hold the
    policy; here only what needs no policy (the parameters decoded when the
    update was read).

    Raises:
        CallError: INVALID_ARGUMENT naming the bad field, RESOURCE_EXHAUSTED
            for a tensor over ``limits.max_tensor_elements``. A pickled
            policy is :func:`check_pickles`' to allow or refuse.
    """
    if not (update.policy is not None or update.pickled_policy or update.params):
        raise invalid("an AgentUpdate needs a policy spec, parameters, or both; it had neither")
    if update.version > MAX_LEARNER_AGENT_VERSION:
        raise invalid(
            f"AgentUpdate.version {update.version} is above {MAX_LEARNER_AGENT_VERSION}: a "
            "learner sends 0, or the version it restores on a restarted coordinator"
        )
    if update.policy is not None:
        kwargs = _json_object(update.policy.kwargs_json, "AgentUpdate.policy.kwargs_json")
        try:
            PolicySpec(update.policy.name, kwargs)
        except ConfigError as exc:
            raise invalid(str(exc)) from None
    try:
        limits.check_tensor_map(update.params, "AgentUpdate.params")
    except ResourceExhaustedError as exc:
        raise CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)) from None


def _json_object(text: str, where: str) -> dict[str, object]:
    try:
        return json_object(text, where)
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def check_pickles(
    update: AgentChange | EnvChange,
    gate: PickleGate,
    workers: Iterable[WorkerHandle],
) -> None:
    """Refuses pickled code unless this coordinator and every worker allow it.

    Raises:
        CallError: PERMISSION_DENIED (ERROR_KIND_PERMISSION) naming what
            is not allowed where.
    """
    if isinstance(update, AgentChange):
        field_name, data = "AgentUpdate.pickled_policy", update.pickled_policy
    else:
        field_name, data = "EnvUpdate.pickled_env_factory", update.pickled_env_factory
    if not data:
        return
    try:
        gate.check_peers(field_name, {h.name: h.hello.capabilities for h in workers})
    except PermissionDeniedError as exc:
        message = str(exc)
        detail = detail_of(ErrorKind.PERMISSION, message)
        raise CallError(grpc.StatusCode.PERMISSION_DENIED, message, detail) from None
