"""The worker face's Join stream in rlfleet's own types, as both ends see them.

A worker joins the coordinator on one bidirectional stream (worker.proto
``WorkerService.Join``): it says Hello and gets a Welcome, then reports
envs built, agents applied, heartbeats, errors and results, and is sent
updates, tasks, cancels and drains. Each end converts these types to and
from the messages in its own translation module
(``rlfleet.coordinator.worker_messages``, ``rlfleet.worker._join_messages``).
Updates are :mod:`rlfleet.protocol.updates`' types and errors
:class:`~rlfleet.protocol.error_reports.ErrorReport`\\ s, as on the learner face.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from rlfleet.protocol.unit_columns import EMPTY_UNITS, UnitColumns

if TYPE_CHECKING:
    from rlfleet.protocol.stream_replay import StreamReplay


@dataclasses.dataclass(frozen=True)
class WorkerHello:
    """A worker's first message (worker.proto ``Hello``).

    Attributes:
        protocol_version: The protocol it speaks.
        capabilities: What it can do (e.g. ``"rlfleet.leases"``).
        num_envs: Env slots it steps together.
        name: Its name (e.g. the pod's); may be empty.
        host: Its host name.
        pid: Its process id.
        implementation: E.g. ``"rlfleet-python/0.1.0"``.
        lease_slots: Leased envs it hosts at most.
    """

    protocol_version: int
    capabilities: tuple[str, ...] = ()
    num_envs: int = 0
    name: str = ""
    host: str = ""
    pid: int = 0
    implementation: str = ""
    lease_slots: int = 0


@dataclasses.dataclass(frozen=True)
class WorkerWelcome:
    """The coordinator's answer to Hello (worker.proto ``Welcome``).

    Attributes:
        protocol_version: The protocol the coordinator speaks.
        worker_id: Unique for the coordinator's lifetime.
        name: The name the fleet uses (made unique).
        heartbeat_interval_seconds: How often to send a heartbeat.
        heartbeat_timeout_seconds: Silence after which the worker is dropped.
        max_message_bytes: Every message either side sends stays below this.
        capabilities: Those both sides have.
        first_stream: Global index of the worker's first env slot.
        coordinator_id: Changes when the coordinator restarts.
        lease_data: ``(port, ticket)`` of the coordinator's lease data
            channel, or None when it offers none.
    """

    protocol_version: int
    worker_id: int
    name: str
    heartbeat_interval_seconds: float
    heartbeat_timeout_seconds: float
    max_message_bytes: int
    capabilities: tuple[str, ...]
    first_stream: int
    coordinator_id: str
    lease_data: tuple[int, bytes] | None = None


@dataclasses.dataclass(frozen=True)
class EnvBuilt:
    """A worker built the envs of a generation (worker.proto ``EnvReady``).

    Attributes:
        generation: The env generation.
        env_spec_wire: Their spec as a serialized ``EnvSpec``, as sent.
    """

    generation: int
    env_spec_wire: bytes


@dataclasses.dataclass(frozen=True)
class AgentApplied:
    """A worker applied an agent version (worker.proto ``AgentReady``)."""

    version: int


@dataclasses.dataclass(frozen=True)
class WorkerBeat:
    """A worker's heartbeat (worker.proto ``Heartbeat``).

    Attributes:
        steps_total: Env steps since the worker started.
        steps_per_second: Its recent rate.
        active_envs: Slots running an episode.
        queued_units: Units waiting for a slot.
    """

    steps_total: int = 0
    steps_per_second: float = 0.0
    active_envs: int = 0
    queued_units: int = 0


@dataclasses.dataclass(frozen=True)
class WorkerLeaving:
    """A worker will leave: it takes no new work (worker.proto ``Leaving``)."""

    reason: str = ""


@dataclasses.dataclass(frozen=True)
class ResultsSwitch:
    """The worker's results switch marker (worker.proto ``results_switch``): every
    result after it comes on the session's lease data connection."""


class TaskAssignment(NamedTuple):
    """A task as the coordinator sends it (worker.proto ``Task``), before any check.

    A NamedTuple, not a frozen dataclass: a worker reads one per task (many
    a second), and it builds in a tenth of the time.

    Attributes:
        task_id: The coordinator's task id.
        request_id: The learner request it serves.
        mode: A ``SampleMode`` number (``rlfleet.protocol.modes.Mode``).
        agent_version: The version its episodes must be produced by (-1: latest).
        env_generation: The env generation they must come from.
        units: The units to run, as columns (episodes).
        fragment_length: Steps per slot and window (fragments).
        rounds: Windows to run (fragments).
        base_seed: Seed of the episodes its streams start (fragments).
        streams: The streams its slots run (empty: Welcome.first_stream + slot).
        replays: How to rebuild the streams it takes over.
        unreadable: What of the Task could not be decoded, and why (""
            if all of it was), for the worker to refuse the task.
    """

    task_id: int
    request_id: int
    mode: int
    agent_version: int
    env_generation: int
    units: UnitColumns = EMPTY_UNITS
    fragment_length: int = 0
    rounds: int = 0
    base_seed: int = 0
    streams: tuple[int, ...] = ()
    replays: tuple[StreamReplay, ...] = ()
    unreadable: str = ""


@dataclasses.dataclass(frozen=True)
class TaskCancel:
    """The coordinator takes units of a task back (worker.proto ``Cancel``).

    Attributes:
        task_id: The task.
        episode_indices: Its units to drop; empty: the whole task.
    """

    task_id: int
    episode_indices: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class DrainOrder:
    """The coordinator asks a worker to finish what it runs and leave (``Drain``).

    Attributes:
        reason: Why, for its logs.
        grace_seconds: How long its episodes in flight may take.
    """

    reason: str
    grace_seconds: float


__all__ = [
    "AgentApplied",
    "DrainOrder",
    "EnvBuilt",
    "TaskAssignment",
    "TaskCancel",
    "WorkerBeat",
    "WorkerHello",
    "WorkerLeaving",
    "WorkerWelcome",
]
