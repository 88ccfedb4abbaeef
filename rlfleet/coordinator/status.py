"""GetStatus: the fleet as the coordinator sees it now."""

from __future__ import annotations

import dataclasses
import time

from rlfleet._version import __version__
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.state import FleetState
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.updates import EnvChange
from rlfleet.transport import rpc as _rpc

IMPLEMENTATION = f"rlfleet-python/{__version__}"


@dataclasses.dataclass
class WorkerSnapshot:
    """One connected worker now (learner.proto ``WorkerStatus``, same field names).

    Attributes:
        worker_id: Unique for the coordinator's lifetime.
        name: Unique among connected workers.
        host: Its host name.
        pid: Its process id.
        peer: Its transport address as the coordinator sees it.
        num_envs: Its env slots.
        implementation: E.g. ``"rlfleet-python/0.1.0"``.
        capabilities: What it declared.
        state: ``"starting"``, ``"idle"``, ``"busy"`` or ``"leaving"``.
        agent_version: The agent version it runs.
        env_generation: The env generation it runs.
        steps_total: Env steps since it started (its heartbeat).
        steps_per_second: Its recent rate (its heartbeat).
        seconds_since_heartbeat: Silence since its last message.
        units_in_flight: Units handed to it and not yet delivered.
        last_error: Its last reported error, or None.
        leased_envs: Leased envs it hosts.
    """

    worker_id: int
    name: str
    host: str
    pid: int
    peer: str
    num_envs: int
    implementation: str
    capabilities: tuple[str, ...]
    state: str
    agent_version: int
    env_generation: int
    steps_total: int
    steps_per_second: float
    seconds_since_heartbeat: float
    units_in_flight: int
    last_error: ErrorReport | None = None
    leased_envs: int = 0


@dataclasses.dataclass
class FleetSnapshot:
    """The fleet now (learner.proto ``FleetStatus``, same field names).

    Attributes:
        coordinator_id: Changes when the coordinator restarts.
        protocol_version: The protocol it speaks.
        implementation: This coordinator's implementation string.
        workers: Every connected worker.
        agent_version: The fleet's agent version.
        env: The fleet's env.
        env_spec_wire: Its spec, serialized as the first ready worker sent
            it; None until one did.
        steps_per_second: Sum of the workers' recent rates.
        steps_total: Env steps since the coordinator started (departed
            workers' included).
        requests_in_flight: Sample and update requests queued or served.
        subscribers: Open subscriptions.
        draining: The coordinator is shutting down.
        leases: Open leases.
        leased_envs: Envs they hold.
    """

    coordinator_id: str
    protocol_version: int
    implementation: str
    workers: list[WorkerSnapshot]
    agent_version: int
    env: EnvChange
    env_spec_wire: bytes | None
    steps_per_second: float
    steps_total: int
    requests_in_flight: int
    subscribers: int
    draining: bool
    leases: int = 0
    leased_envs: int = 0


def fleet_status(state: FleetState) -> FleetSnapshot:
    """The fleet now (takes the lock briefly)."""
    now = time.monotonic()
    with state.lock:
        workers = [_worker_status(state, handle, now) for handle in state.registry]
        return FleetSnapshot(
            coordinator_id=state.coordinator_id,
            protocol_version=_rpc.PROTOCOL_VERSION,
            implementation=IMPLEMENTATION,
            workers=workers,
            agent_version=state.agent.version,
            env=state.env.update,
            env_spec_wire=state.env.spec_wire,
            steps_per_second=sum(w.steps_per_second for w in workers),
            steps_total=state.departed_steps + sum(w.steps_total for w in workers),
            requests_in_flight=state.gate.waiting,
            subscribers=state.subscribers,
            draining=state.draining,
        )


def _worker_status(state: FleetState, handle: WorkerHandle, now: float) -> WorkerSnapshot:
    in_flight = state.scheduler.units_in_flight(handle.worker_id)
    if handle.leaving:
        phase = "leaving"
    elif not state.is_ready(handle):
        phase = "starting"  # building the env or applying the agent
    else:
        phase = "busy" if in_flight else "idle"
    hello, beat = handle.hello, handle.heartbeat
    return WorkerSnapshot(
        worker_id=handle.worker_id,
        name=handle.name,
        host=hello.host,
        pid=hello.pid,
        peer=handle.peer,
        num_envs=hello.num_envs,
        implementation=hello.implementation,
        capabilities=hello.capabilities,
        state=phase,
        agent_version=handle.agent_version,
        env_generation=handle.env_generation,
        steps_total=beat.steps_total,
        steps_per_second=beat.steps_per_second,
        seconds_since_heartbeat=handle.silent_for(now),
        units_in_flight=in_flight,
        last_error=handle.last_error,
    )
