"""FleetStatus: what ``RemoteSampler.status()`` returns, as plain dataclasses."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.core import EnvSpec
from rlfleet.envs import EnvConfig
from rlfleet.errors import NoWorkersError

#: Worker states in which a worker takes work.
READY_STATES = ("idle", "busy")


@dataclass(frozen=True)
class WorkerStatus:
    """One connected worker, as the coordinator sees it.

    Attributes:
        worker_id: Unique for the coordinator's lifetime.
        name: Unique among connected workers.
        host: The worker's host name.
        pid: Its process id.
        envs: Its env slots.
        state: ``"starting"`` (applying an update), ``"idle"``, ``"busy"``
            or ``"leaving"``.
        steps_per_second: Its recent sampling rate.
        steps_total: Env steps since it started.
        agent_version: The agent version it runs.
        env_generation: The env generation it runs.
        seconds_since_heartbeat: Silence since its last message.
        units_in_flight: Episodes handed to it and not yet returned.
        implementation: E.g. ``"rlfleet-python/0.1.0"``.
        peer: Its transport address.
        last_error: Its last reported error, or None.
    """

    worker_id: int
    name: str
    host: str
    pid: int
    envs: int
    state: str
    steps_per_second: float
    steps_total: int
    agent_version: int
    env_generation: int
    seconds_since_heartbeat: float
    units_in_flight: int
    implementation: str
    peer: str
    last_error: str | None

    @property
    def ready(self) -> bool:
        """True if the worker takes work now."""
        return self.state in READY_STATES


@dataclass(frozen=True)
class FleetStatus:
    """The fleet as the coordinator sees it.

    Attributes:
        coordinator_id: Changes when the coordinator restarts.
        implementation: The coordinator's implementation string.
        workers: Every connected worker.
        steps_per_second: Sum of the workers' recent rates.
        steps_total: Env steps of the fleet since the coordinator started.
        agent_version: The current agent version (0: no update yet).
        env: The current env, or None if it cannot be expressed as an
            EnvConfig (malformed kwargs).
        env_generation: The current env generation.
        env_spec: Its spaces, once a worker built it; else None.
        draining: True while the coordinator shuts down.
        requests_in_flight: Sample and update requests queued or served.
        subscribers: Open subscriptions.
        leases: Open env leases (RemoteVectorEnvs).
        leased_envs: Envs those leases hold.
    """

    coordinator_id: str
    implementation: str
    workers: tuple[WorkerStatus, ...]
    steps_per_second: float
    steps_total: int
    agent_version: int
    env: EnvConfig | None
    env_generation: int
    env_spec: EnvSpec | None
    draining: bool
    requests_in_flight: int
    subscribers: int
    leases: int = 0
    leased_envs: int = 0

    @property
    def ready_workers(self) -> int:
        """Workers that take work now."""
        return sum(worker.ready for worker in self.workers)

    @property
    def total_envs(self) -> int:
        """Env slots of all connected workers."""
        return sum(worker.envs for worker in self.workers)


#: How often :func:`count_workers` polls for a first worker.
WORKER_POLL_SECONDS = 0.2


def count_workers(status: Callable[[], FleetStatus], wait: float, address: str) -> int:
    """Connected workers that are not leaving; waits up to ``wait`` seconds for a first one.

    Args:
        status: Asks the fleet for its status.
        wait: Seconds to wait for a first worker.
        address: The coordinator(s), for the error.

    Raises:
        NoWorkersError: If no worker joined within ``wait`` seconds.
    """
    deadline = time.monotonic() + wait
    while True:
        workers = sum(w.state != "leaving" for w in status().workers)
        if workers:
            return workers
        if time.monotonic() >= deadline:
            raise NoWorkersError(
                f"no worker joined within {wait:g} seconds; start workers with "
                f"`rlfleet worker --coordinator {address}`"
            )
        time.sleep(WORKER_POLL_SECONDS)


__all__ = ["READY_STATES", "FleetStatus", "WorkerStatus"]
