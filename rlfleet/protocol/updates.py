"""Agent and env changes: what a learner pushes to the fleet, in rlfleet's terms.

A learner changes the agent (a policy to build, parameters to set) or the
env every worker runs; the coordinator numbers each change (agent version,
env generation), keeps the whole current state and sends it on to the
workers. :class:`AgentChange` and :class:`EnvChange` are those changes on
every side (client, coordinator, worker); the faces convert them to and
from ``AgentUpdate`` and ``EnvUpdate`` messages (updates.proto) with
``rlfleet.wire.encode_agent_change`` and its kin.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the local path loads no protobuf (rlfleet.wire does)
    from rlfleet.wire.tensors import TensorDict


@dataclasses.dataclass(frozen=True)
class PolicyChoice:
    """A policy for workers to build: a spec's name and its kwargs as JSON text.

    The text is kept as the learner wrote it (updates.proto ``PolicySpec``):
    each worker parses it, and JSON keeps ``500`` an int.
    """

    name: str
    kwargs_json: str = ""


@dataclasses.dataclass(frozen=True, eq=False)
class AgentChange:
    """An agent update (updates.proto ``AgentUpdate``).

    A new policy (``policy`` or ``pickled_policy``) starts from the
    parameters that come with it; parameters alone replace the same-named
    ones of the agent the fleet runs (:meth:`after`).

    Compared by identity: its parameters are arrays.

    Attributes:
        version: The agent version it creates (0 from a learner: the
            coordinator numbers versions).
        policy: The policy to build, or None.
        params: Parameters by name (arrays or nested dicts of arrays).
        pickled_policy: A pickled policy to run instead of a spec (only
            where both sides allow pickles), or empty.
    """

    version: int = 0
    policy: PolicyChoice | None = None
    params: TensorDict = dataclasses.field(default_factory=dict)
    pickled_policy: bytes = b""

    @property
    def new_policy(self) -> bool:
        """Whether it replaces the policy (a spec or a pickle), not only parameters."""
        return self.policy is not None or bool(self.pickled_policy)

    def after(self, update: AgentChange, version: int) -> AgentChange:
        """The agent this one becomes with ``update`` applied, as ``version``."""
        if update.new_policy:
            policy = None if update.pickled_policy else update.policy
            return AgentChange(version, policy, dict(update.params), update.pickled_policy)
        params = {**self.params, **update.params}
        return AgentChange(version, self.policy, params, self.pickled_policy)

    def renumbered(self, version: int) -> AgentChange:
        """The same change as ``version``."""
        return dataclasses.replace(self, version=version)


@dataclasses.dataclass(frozen=True)
class EnvChange:
    """An env update (updates.proto ``EnvUpdate``).

    Attributes:
        generation: The env generation it creates (0 from a learner: the
            coordinator numbers generations).
        env_id: A registered gymnasium id.
        kwargs_json: JSON object text of keyword arguments for
            ``gymnasium.make``, as the learner wrote it.
        max_episode_length: Steps after which an episode is cut, or None.
        pickled_env_factory: A pickled env factory to run instead of the
            id (only where both sides allow pickles), or empty.
        vectorization: How workers build the envs ("": one gymnasium env
            per slot; see ``EnvConfig.vectorization``).
    """

    generation: int = 0
    env_id: str = ""
    kwargs_json: str = ""
    max_episode_length: int | None = None
    pickled_env_factory: bytes = b""
    vectorization: str = ""

    def renumbered(self, generation: int) -> EnvChange:
        """The same env as ``generation``."""
        return dataclasses.replace(self, generation=generation)


__all__ = ["AgentChange", "EnvChange", "PolicyChoice"]
