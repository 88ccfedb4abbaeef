"""What a sampler pushed to the fleet, to push it again after a coordinator restart.

A restarted coordinator starts from scratch: version 0, the random policy,
its own ``--env``. A learner that retries its request there must get the
batch it would have got before (same seeds: the request index; same
agent: this module). So the sampler remembers the agent and env it
established, merged as the coordinator merges updates, and, once a call
failed as UNAVAILABLE, checks whether the coordinator it talks to is a new
one; if so, its next request carries the remembered env and agent first.
"""

from __future__ import annotations

from rlfleet.v1 import learner_pb2, tensor_pb2, updates_pb2


class PushedState:
    """The env and agent this sampler established on the fleet."""

    def __init__(self) -> None:
        self.agent: updates_pb2.AgentUpdate | None = None
        self.env: updates_pb2.EnvUpdate | None = None
        self.coordinator_id: str | None = None
        self.agent_version = 0
        #: Set when a call failed as UNAVAILABLE: the coordinator may be new.
        self.suspect_restart = False

    @property
    def pushed_anything(self) -> bool:
        """True once this sampler sent an agent or env update."""
        return self.agent is not None or self.env is not None

    def agent_applied(self, update: updates_pb2.AgentUpdate, version: int) -> None:
        """Records an agent update the fleet applied as ``version``."""
        self.agent = merged_agent(self.agent, update)
        self.agent_version = version

    def env_applied(self, update: updates_pb2.EnvUpdate) -> None:
        """Records an env update the fleet applied."""
        self.env = updates_pb2.EnvUpdate()
        self.env.CopyFrom(update)
        self.env.ClearField("generation")
        self.env.ClearField("coordinator_id")

    def answered_by(self, coordinator_id: str) -> None:
        """Records the coordinator that answered a successful call."""
        if coordinator_id:
            self.coordinator_id = coordinator_id

    @property
    def expected_id(self) -> str:
        """The coordinator id later calls name ("" while nothing was pushed)."""
        return (self.coordinator_id or "") if self.pushed_anything else ""

    def restarted(self, status: learner_pb2.FleetStatus) -> bool:
        """Whether ``status`` comes from another coordinator than the one pushed to.

        Also learns the coordinator's id the first time.
        """
        if self.coordinator_id is None:
            self.coordinator_id = status.coordinator_id
            # Without a known id, a fleet behind our version cannot hold our agent.
            return status.agent_version < self.agent_version
        return status.coordinator_id != self.coordinator_id

    def restoring(
        self,
        agent: updates_pb2.AgentUpdate | None,
        env: updates_pb2.EnvUpdate | None,
    ) -> tuple[updates_pb2.AgentUpdate | None, updates_pb2.EnvUpdate | None]:
        """The updates that rebuild this state on a new coordinator, plus the caller's."""
        return merged_agent(self.agent, agent) if (agent or self.agent) else None, env or self.env


def merged_agent(
    state: updates_pb2.AgentUpdate | None, update: updates_pb2.AgentUpdate | None
) -> updates_pb2.AgentUpdate:
    """``state`` after ``update``, as the coordinator merges them.

    A new policy spec starts over from the parameters that come with it;
    parameters alone replace the same-named ones of the state.
    """
    merged = updates_pb2.AgentUpdate()
    if update is not None and (state is None or update.HasField("policy")):
        merged.CopyFrom(update)
    elif state is not None:
        merged.CopyFrom(state)
        if update is not None:
            merged.ClearField("params")
            merged.params.CopyFrom(_merged_params(state.params, update.params))
    merged.ClearField("version")
    merged.ClearField("coordinator_id")
    return merged


def _merged_params(old: tensor_pb2.TensorMap, new: tensor_pb2.TensorMap) -> tensor_pb2.TensorMap:
    merged = tensor_pb2.TensorMap()
    replaced = {entry.key: entry for entry in new.entries}
    for entry in old.entries:
        merged.entries.append(replaced.pop(entry.key, entry))
    merged.entries.extend(entry for entry in new.entries if entry.key in replaced)
    return merged
