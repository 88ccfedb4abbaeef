"""What a sampler pushed to the fleet, to push it again after a coordinator restart.

A restarted coordinator starts from scratch: version 0, the random policy,
its own ``--env``. A learner that retries its request there must get the
batch it would have got before (same seeds: the request index; same
agent: this module). So the sampler remembers the agent and env it
established, merged as the coordinator merges updates, and, once a call
failed as UNAVAILABLE, checks whether the coordinator it talks to is a new
one; if so, its next request carries the remembered env and agent first.
The restored agent names the version it had (the next one with a new
update merged in), and the coordinator numbers it at least that: agent
versions go on across the restart instead of starting over at 1.
"""

from __future__ import annotations

from rlfleet.client.status import FleetStatus
from rlfleet.protocol.updates import AgentChange, EnvChange


class PushedState:
    """The env and agent this sampler established on the fleet."""

    def __init__(self) -> None:
        self.agent: AgentChange | None = None
        self.env: EnvChange | None = None
        self.coordinator_id: str | None = None
        self.agent_version = 0
        #: Set when a call failed as UNAVAILABLE: the coordinator may be new.
        self.suspect_restart = False

    @property
    def pushed_anything(self) -> bool:
        """True once this sampler sent an agent or env update."""
        return self.agent is not None or self.env is not None

    def agent_applied(self, update: AgentChange, version: int) -> None:
        """Records an agent update the fleet applied as ``version``."""
        self.agent = merged_agent(self.agent, update)
        self.agent_version = version

    def env_applied(self, update: EnvChange) -> None:
        """Records an env update the fleet applied."""
        self.env = update.renumbered(0)

    def answered_by(self, coordinator_id: str) -> None:
        """Records the coordinator that answered a successful call."""
        if coordinator_id:
            self.coordinator_id = coordinator_id

    @property
    def expected_id(self) -> str:
        """The coordinator id later calls name ("" while nothing was pushed)."""
        return (self.coordinator_id or "") if self.pushed_anything else ""

    def restarted(self, status: FleetStatus) -> bool:
        """Whether ``status`` comes from another coordinator than the one pushed to.

        Also learns the coordinator's id the first time.
        """
        if self.coordinator_id is None:
            self.coordinator_id = status.coordinator_id
            # Without a known id, a fleet behind our version cannot hold our agent.
            return status.agent_version < self.agent_version
        return status.coordinator_id != self.coordinator_id

    def restoring(
        self, agent: AgentChange | None, env: EnvChange | None
    ) -> tuple[AgentChange | None, EnvChange | None]:
        """The updates that rebuild this state on a new coordinator, plus the caller's.

        The agent names the version to go on from: the one it had, or the
        next with the caller's update.
        """
        if not (agent or self.agent):
            return None, env or self.env
        version = self.agent_version + (agent is not None)
        return merged_agent(self.agent, agent).renumbered(version), env or self.env


def merged_agent(state: AgentChange | None, update: AgentChange | None) -> AgentChange:
    """``state`` after ``update``, as the coordinator merges them (version 0).

    A new policy (a spec or a pickle) starts over from the parameters that
    come with it; parameters alone replace the same-named ones of the state
    (:meth:`AgentChange.after`).
    """
    base = state or AgentChange()
    return base.renumbered(0) if update is None else base.after(update, 0)
