"""FleetState: everything the coordinator knows, under one lock.

The registry, the scheduler, the agent and env state and the open learner
calls change together (a worker's EnvReady makes it eligible, which hands
out units, which sends tasks), so one lock guards them all and one
condition on it wakes every wait when anything changes. The parts of the
coordinator (worker events, learner requests, update roll-outs, liveness,
status) each hold this object; the small moves they share live here.

Every method documented "lock held" must be called inside ``with state.lock``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from rlfleet.coordinator.calls import CallOutbox, CallScope, FifoGate
from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.failures import CallError, detail_of
from rlfleet.coordinator.metrics import CoordinatorMetrics
from rlfleet.coordinator.progress import ProgressWatch
from rlfleet.coordinator.registry import Registry, TaskDispatch, WorkerHandle
from rlfleet.coordinator.updates import EnvState, env_update_of, whole_agent
from rlfleet.coordinator.worker_messages import work_frame
from rlfleet.protocol.error_reports import ErrorKind, ErrorReport, describe_report
from rlfleet.protocol.learner_calls import CallHeader
from rlfleet.protocol.multi_agent import MULTI_AGENT_CAPABILITY, can_run_env, can_run_policy
from rlfleet.protocol.stream_replay import StreamBook
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.scheduling.scheduler import CancelOrder, Scheduler
from rlfleet.transport import rpc as _rpc

logger = logging.getLogger("rlfleet.coordinator")


@dataclass
class OpenCall:
    """A Sample or Subscribe call with work on the fleet.

    Attributes:
        outbox: Its events.
        wait_for_workers: Seconds it may go without a ready worker.
        starved_since: ``time.monotonic()`` since when no worker is ready.
        refused_results: Results of it the coordinator refused (their
            workers dropped, their units re-queued), bounded by
            ``MAX_REFUSED_RESULTS`` in ``worker_events``.
    """

    outbox: CallOutbox
    wait_for_workers: float
    starved_since: float | None = None
    refused_results: int = 0


@dataclass
class UpdateWait:
    """An update being applied: who must answer, and who refused it.

    Attributes:
        targets: The workers that must answer.
        env_generation: The generation it creates (an env update), else None.
        agent_version: The version it creates (an agent update), else None.
        errors: The refusals, by worker id.
    """

    targets: set[int]
    env_generation: int | None = None
    agent_version: int | None = None
    errors: dict[int, ErrorReport] = field(default_factory=dict)

    def refused_by(self, detail: ErrorReport) -> bool:
        """Whether ``detail`` refuses this update (and not an earlier one, or a task)."""
        if detail.env_generation is not None:
            return detail.env_generation == self.env_generation
        if detail.agent_version is not None:
            return detail.agent_version == self.agent_version
        return False


class FleetState:
    """The coordinator's state and the moves its parts share.

    Args:
        config: The coordinator's settings.

    Attributes:
        config: The settings.
        coordinator_id: Changes when the coordinator restarts.
        lock: Guards everything below.
        changed: Notified on every change; every wait waits on it.
        registry: Connected workers.
        scheduler: Units, tasks and requests.
        agent: The agent ready workers run.
        env: The env ready workers run.
        gate: Serves Sample and update requests one at a time.
        calls: Open learner calls by request id.
        update_wait: The update being rolled out, if any.
        progress: When busy workers last delivered a result.
        draining: No new requests or workers.
        departed_steps: Env steps of workers that left.
        metrics: Prometheus metrics (their own lock; not guarded by ``lock``).
    """

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.coordinator_id = uuid.uuid4().hex[:16]
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.registry = Registry(
            config.max_workers,
            config.max_result_bytes,
            config.limits.max_inflight_bytes_per_worker,
        )
        self.scheduler = Scheduler(
            prefetch_factor=config.prefetch_factor,
            capacity_steps=config.capacity_steps,
            move_units=config.tail_moves,
        )
        # What every fragment stream delivered: replays for workers taking one over.
        self.streams = StreamBook()
        # The whole agent: every update since its policy, merged.
        self.agent = AgentChange()
        self.env = EnvState(env_update_of(config.env, 1))
        self.gate = FifoGate(self.changed, config.max_queued_requests)
        self.calls: dict[int, OpenCall] = {}
        self.progress = ProgressWatch(config.progress_deadline_seconds)
        self.update_wait: UpdateWait | None = None
        self.draining = False
        self.departed_steps = 0
        # Workers that sat a multi-agent env out (no capability): they get the
        # whole agent with the next env they may run.
        self.sat_out: set[int] = set()
        # Workers that run the env but sat the agent out (a joint policy they
        # cannot build): they get the whole agent once they can build it.
        self.agent_sat_out: set[int] = set()
        self.metrics = CoordinatorMetrics()  # its gauges: Coordinator watches

    # --- waiting (lock held) -----------------------------------------------------

    def wait(self, predicate: Callable[[], bool], seconds: float, scope: CallScope) -> bool:
        """Waits on :attr:`changed` until ``predicate()``; False after ``seconds``.

        Raises:
            CallError: CANCELLED if the learner's call ends meanwhile.
        """
        deadline = time.monotonic() + seconds
        while not predicate():
            scope.check()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.changed.wait(remaining)
        return True

    def no_workers(self, seconds: float) -> CallError:
        """The UNAVAILABLE error of a request that waited ``seconds`` for a worker."""
        connected = len(self.registry)
        if connected and not any(self.takes_env(h) for h in self.registry):
            message = (
                f"no worker became ready within {seconds:g} seconds: the fleet runs the "
                f"multi-agent env {self.env.update.env_id!r} and none of the {connected} "
                f"connected workers declares the capability {MULTI_AGENT_CAPABILITY!r} (the "
                "Python worker does; the Node worker does not); start Python workers with "
                "--import of the module that registers the env"
            )
        elif connected:
            errors = [h.last_error for h in self.registry if h.last_error is not None]
            why = f"; last worker error: {describe_report(errors[-1])}" if errors else ""
            message = (
                f"no worker became ready within {seconds:g} seconds ({connected} connected, "
                f"none ready for env generation {self.env.generation} and agent version "
                f"{self.agent.version}){why}"
            )
        else:
            message = (
                f"no worker joined within {seconds:g} seconds; start workers with "
                "`rlfleet worker --coordinator ADDR` (ADDR: this coordinator's address)"
            )
        detail = detail_of(ErrorKind.NO_WORKERS, message)
        return CallError(grpc.StatusCode.UNAVAILABLE, message, detail)

    # --- workers (lock held) -----------------------------------------------------

    def takes_env(self, handle: WorkerHandle) -> bool:
        """Whether a worker may run the current env: a multi-agent env needs the capability."""
        return can_run_env(self.env.update.env_id, handle.hello.capabilities)

    def takes_agent(self, handle: WorkerHandle) -> bool:
        """Whether a worker may build the current agent: the joint policy needs the capability."""
        policy = self.agent.policy
        return policy is None or can_run_policy(policy.name, handle.hello.capabilities)

    def send_agent(self, handle: WorkerHandle) -> None:
        """Sends a worker that runs the env the whole current agent, if it can build it.

        A worker that cannot (the Node worker and a joint policy) is sent
        nothing, so it refuses nothing; it waits for the next agent.
        """
        if not self.takes_agent(handle):
            self.agent_sat_out.add(handle.worker_id)
            return
        self.agent_sat_out.discard(handle.worker_id)
        if self.agent.version > 0:
            handle.send(whole_agent(self.agent))

    def is_ready(self, handle: WorkerHandle) -> bool:
        """Whether a worker runs the current env and agent and takes work."""
        return (
            handle.alive
            and self.takes_env(handle)
            and not handle.leaving
            and handle.env_generation == self.env.generation
            and handle.agent_version == self.agent.version
        )

    def refresh(self, handle: WorkerHandle) -> None:
        """Re-derives whether a worker may get work, and hands some out."""
        if handle.alive:
            self.scheduler.set_eligible(handle.worker_id, self.is_ready(handle))
        self.dispatch()
        self.changed.notify_all()

    def dispatch(self) -> None:
        """Sends the work the scheduler hands out now (and the cancels of
        units it moved from one worker to another)."""
        orders = self.scheduler.dispatch()
        moves = self.scheduler.take_cancels()
        if moves:
            self.send_cancels(moves)
            self.metrics.moved(sum(len(cancel.episode_indices) for cancel in moves))
        if not orders:  # the common case after a result: nothing handed out
            return
        on_data = on_join = 0
        for order in orders:
            handle = self.registry.get(order.worker_id)
            if handle is not None:
                replays = tuple(
                    replay
                    for stream in order.streams
                    if (replay := self.streams.replay(order.base_seed, stream, order.worker_id))
                )
                columns = _rpc.UNIT_COLUMNS_CAPABILITY in handle.hello.capabilities
                carrier = handle.send_work(
                    TaskDispatch(order, replays, unit_columns=columns), work_frame
                )
                if carrier is not None:
                    on_data += carrier
                    on_join += not carrier
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug(
                        "task %d of request %d to worker %r",
                        order.task_id,
                        order.request_id,
                        handle.name,
                        extra={
                            "task_id": order.task_id,
                            "request_id": order.request_id,
                            "worker": handle.name,
                        },
                    )
        self.metrics.dispatched(orders)
        self.metrics.work_frames.tasks(on_data, on_join)

    def send_cancels(self, cancels: list[CancelOrder]) -> None:
        """Tells workers to drop units."""
        on_data = on_join = 0
        for cancel in cancels:
            handle = self.registry.get(cancel.worker_id)
            if handle is not None:
                carrier = handle.send_work(cancel, work_frame)
                if carrier is not None:
                    on_data += carrier
                    on_join += not carrier
        self.metrics.work_frames.cancels(on_data, on_join)

    def broadcast(self, message: AgentChange | EnvChange) -> set[int]:
        """Sends an env or agent update to every worker that may run it; returns their ids.

        Workers without the multi-agent capability sit a multi-agent env out
        (they get neither it nor its agents), and a joint policy (with any
        env): they are never sent what they would refuse. When the fleet
        leaves the env, they get the new env, and the whole current agent
        once it is one they can build.
        """
        targets = set()
        for handle in self.registry:
            worker_id = handle.worker_id
            if not self.takes_env(handle):
                self.sat_out.add(worker_id)
                self.refresh(handle)
                continue
            if isinstance(message, EnvChange):
                handle.send(message)
                targets.add(worker_id)
                if worker_id in self.sat_out or worker_id in self.agent_sat_out:
                    self.sat_out.discard(worker_id)
                    self.send_agent(handle)
            elif worker_id in self.agent_sat_out or not self.takes_agent(handle):
                self.send_agent(handle)  # the whole agent: it missed the earlier versions
                if worker_id not in self.agent_sat_out:
                    targets.add(worker_id)
            else:
                handle.send(message)
                targets.add(worker_id)
            self.refresh(handle)
        return targets

    # --- learner calls (lock held) -----------------------------------------------

    def header(self, request_id: int, agent_version: int) -> CallHeader:
        """The header of a call in the current env."""
        return CallHeader(
            request_id=request_id,
            agent_version=agent_version,
            env_generation=self.env.generation,
            coordinator_id=self.coordinator_id,
            env_spec_wire=self.env.spec_wire,
        )

    def announce_env(self) -> None:
        """Sends subscribers the header of the env generation now known."""
        for request_id, call in self.calls.items():
            if call.outbox.subscription:
                call.outbox.put(self.header(request_id, -1))

    def finish_request(self, request_id: int) -> None:
        """Closes a request: cancels its units on workers (idempotent)."""
        self.calls.pop(request_id, None)
        self.send_cancels(self.scheduler.finish(request_id))
        self.dispatch()
        self.changed.notify_all()

    def fail_call(self, request_id: int, failure: CallError) -> None:
        """Ends a learner call with an error and closes its request."""
        call = self.calls.get(request_id)
        if call is not None:
            call.outbox.put(failure)
        self.finish_request(request_id)

    @property
    def subscribers(self) -> int:
        """Open subscriptions."""
        return sum(1 for call in self.calls.values() if call.outbox.subscription)
