"""GetStatus: the fleet as the coordinator sees it now."""

from __future__ import annotations

import time

from rlfleet import _rpc
from rlfleet._version import __version__
from rlfleet.coordinator.registry import WorkerHandle
from rlfleet.coordinator.state import FleetState
from rlfleet.v1 import learner_pb2

IMPLEMENTATION = f"rlfleet-python/{__version__}"


def fleet_status(state: FleetState) -> learner_pb2.FleetStatus:
    """The FleetStatus message (takes the lock briefly)."""
    now = time.monotonic()
    with state.lock:
        workers = [_worker_status(state, handle, now) for handle in state.registry]
        status = learner_pb2.FleetStatus(
            coordinator_id=state.coordinator_id,
            protocol_version=_rpc.PROTOCOL_VERSION,
            implementation=IMPLEMENTATION,
            workers=workers,
            agent_version=state.agent.version,
            env=state.env.update,
            steps_per_second=sum(w.steps_per_second for w in workers),
            steps_total=state.departed_steps + sum(w.steps_total for w in workers),
            requests_in_flight=state.gate.waiting,
            subscribers=state.subscribers,
            draining=state.draining,
        )
        if state.env.spec_proto is not None:
            status.env_spec.CopyFrom(state.env.spec_proto)
    return status


def _worker_status(state: FleetState, handle: WorkerHandle, now: float) -> learner_pb2.WorkerStatus:
    in_flight = state.scheduler.units_in_flight(handle.worker_id)
    if handle.leaving:
        phase = "leaving"
    elif not state.is_ready(handle):
        phase = "starting"  # building the env or applying the agent
    else:
        phase = "busy" if in_flight else "idle"
    hello, beat = handle.hello, handle.heartbeat
    status = learner_pb2.WorkerStatus(
        worker_id=handle.worker_id,
        name=handle.name,
        host=hello.host,
        pid=hello.pid,
        peer=handle.peer,
        num_envs=hello.num_envs,
        implementation=hello.implementation,
        capabilities=list(hello.capabilities),
        state=phase,
        agent_version=handle.agent_version,
        env_generation=handle.env_generation,
        steps_total=beat.steps_total,
        steps_per_second=beat.steps_per_second,
        seconds_since_heartbeat=handle.silent_for(now),
        units_in_flight=in_flight,
    )
    if handle.last_error is not None:
        status.last_error.CopyFrom(handle.last_error)
    return status
