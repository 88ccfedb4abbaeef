"""The workers connected to the coordinator: identity, readiness, liveness.

A :class:`WorkerHandle` is one Join stream. Its fields are read and written
under the coordinator's lock, except the chunk-assembly state, which only
the stream's reader thread touches, and the outbox, a thread-safe queue the
stream's handler drains.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

import grpc
from google.protobuf.message import Message

from rlfleet.coordinator.failures import CallDetail, CallError
from rlfleet.coordinator.leases.data_connections import LeaseConnection
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.protocol.join import DrainOrder, WorkerBeat, WorkerHello, WorkerWelcome
from rlfleet.protocol.stream_replay import StreamReplay
from rlfleet.protocol.updates import AgentChange, EnvChange
from rlfleet.scheduling.scheduler import CancelOrder, TaskOrder
from rlfleet.security import InflightBudget, Limits
from rlfleet.wire.result_layout import ResultLayoutCheck
from rlfleet.wire.results import ResultAssembler


@dataclass(frozen=True)
class TaskDispatch:
    """A task for a worker, with the replays of the streams it takes over.

    Attributes:
        order: The scheduler's order.
        replays: How to rebuild the episodes of streams another worker ran.
        unit_columns: Its units travel as columns (the worker declared
            ``rlfleet.unit-columns``), else as one EpisodeUnit message each.
    """

    order: TaskOrder
    replays: tuple[StreamReplay, ...] = ()
    unit_columns: bool = False


#: What the coordinator sends a worker on its Join stream. A lease command
#: (``Message``) is the lease face's, built and sent as it made it.
WorkerCommand: TypeAlias = (
    WorkerWelcome | EnvChange | AgentChange | TaskDispatch | CancelOrder | DrainOrder | Message
)


@dataclass(frozen=True)
class Ending:
    """Put in a worker's outbox: end its call with this status."""

    code: grpc.StatusCode
    message: str
    detail: CallDetail | None = None


@dataclass(eq=False)
class WorkerHandle:
    """One connected worker (one Join stream).

    Attributes:
        worker_id: Unique for the coordinator's lifetime.
        name: Unique among connected workers.
        hello: The worker's Hello.
        peer: Transport address as gRPC reports it.
        first_stream: Global index of its first env slot (fragment streams;
            a worker that can take streams over runs those its tasks name).
        outbox: Messages for the worker, then an :class:`Ending`.
        last_seen: ``time.monotonic()`` of its last message.
        alive: False once declared dead or gone; its results are ignored.
        leaving: It said Leaving: no new work.
        env_generation: Generation of its last EnvReady (0: none yet).
        agent_version: Version of its last AgentReady (0: the default policy).
        heartbeat: Its last Heartbeat.
        last_error: Its last WorkerError.
        assembler: Joins its result chunks of the Join stream (reader thread only).
        data_assembler: Joins its result chunks of the lease data
            connection (the data loop thread only).
        inflight: The bytes of its unfinished results, held against
            max_inflight_bytes_per_worker over both carriers (each takes
            ``inflight.carrier()``).
        result_layout: Checks its episode results in one pass once it knows
            their layout (learned from the first, on either carrier).
        data_results_done: Set once no more results can come on its lease
            data connection (its end-of-results marker, or the connection's
            end); None while results cannot come there (no data connection,
            or no ``rlfleet.data-results`` capability).
        join_results_over: Set once no more results can come on its Join
            stream (its results switch marker, or the stream's end, was
            read): with ``rlfleet.results-switch``, its data connection's
            results are booked only after that, so none overtakes one sent
            before it on the stream.
        lease_data: Its lease data connection, once accepted: lease
            commands go there (:meth:`send_lease`).
        task_data: Its lease data connection once Tasks and Cancels go there
            (it agreed on ``rlfleet.data-tasks``; set with ``lease_data``,
            after the switch marker on the stream): :meth:`send_work`.
        lease_ticket: The ticket its Welcome carried ("" without one).
        forged_replies: Its lease replies for envs it does not host (an
            honest worker sends none; too many drop it).
    """

    worker_id: int
    name: str
    hello: WorkerHello
    peer: str
    first_stream: int
    outbox: queue.SimpleQueue[WorkerCommand | Ending]
    last_seen: float
    alive: bool = True
    leaving: bool = False
    env_generation: int = 0
    agent_version: int = 0
    heartbeat: WorkerBeat = field(default_factory=WorkerBeat)
    last_error: ErrorReport | None = None
    assembler: ResultAssembler = field(default_factory=ResultAssembler)
    data_assembler: ResultAssembler = field(default_factory=ResultAssembler)
    inflight: InflightBudget = field(
        default_factory=lambda: InflightBudget(Limits().max_inflight_bytes_per_worker, "")
    )
    result_layout: ResultLayoutCheck = field(default_factory=ResultLayoutCheck)
    data_results_done: threading.Event | None = None
    join_results_over: threading.Event = field(default_factory=threading.Event)
    lease_data: LeaseConnection | None = None
    task_data: LeaseConnection | None = None
    lease_ticket: bytes = b""
    forged_replies: int = 0

    @property
    def num_envs(self) -> int:
        """Env slots the worker steps together."""
        return self.hello.num_envs

    def send(self, message: WorkerCommand) -> None:
        """Queues a message for the worker (no-op once it is gone)."""
        if self.alive:
            self.outbox.put(message)

    def send_lease(self, message: Message) -> None:
        """Queues a lease command: on the data connection once the worker has one
        (the switch marker went ahead of it on the stream), else on the stream."""
        connection = self.lease_data
        if connection is None:
            self.send(message)
        elif self.alive:
            connection.send(message.SerializeToString())

    def send_work(
        self,
        command: TaskDispatch | CancelOrder,
        encode: Callable[[TaskDispatch | CancelOrder], bytes],
    ) -> bool | None:
        """Sends a Task or a Cancel: once tasks go on the data connection, as the
        frame ``encode`` makes of it (its serialized CoordinatorMessage), in one
        send from the caller's thread; else queued for the stream.

        A connection that broke takes nothing: its end drops the worker, whose
        units are re-queued as for a broken stream.

        Returns:
            True if it went on the data connection, False if on the Join
            stream, None if the worker is gone (nothing sent).
        """
        if not self.alive:
            return None
        connection = self.task_data
        if connection is None:
            self.outbox.put(command)
            return False
        connection.send(encode(command))
        return True

    def end(self, code: grpc.StatusCode, message: str, detail: CallDetail | None = None) -> None:
        """Makes the stream's handler end the call with this status."""
        self.outbox.put(Ending(code, message, detail))

    def touch(self) -> None:
        """Records that a message arrived (liveness)."""
        self.last_seen = time.monotonic()

    def silent_for(self, now: float) -> float:
        """Seconds since its last message."""
        return now - self.last_seen


class Registry:
    """Connected workers by id, with unique names (their streams come from the Scheduler).

    Not thread-safe: used under the coordinator's lock.

    Args:
        max_workers: Workers admitted at once.
        max_result_bytes: Largest serialized result a worker may send.
        max_inflight_bytes: Most bytes of unfinished results one worker
            session holds (its ``inflight`` budget; the limits' default if None).
    """

    def __init__(
        self,
        max_workers: int,
        max_result_bytes: int | None = None,
        max_inflight_bytes: int | None = None,
    ) -> None:
        self.max_workers = max_workers
        self.max_result_bytes = max_result_bytes
        self.max_inflight_bytes = (
            Limits().max_inflight_bytes_per_worker
            if max_inflight_bytes is None
            else max_inflight_bytes
        )
        self._workers: dict[int, WorkerHandle] = {}
        self._ids = itertools.count(1)

    def admit(self, hello: WorkerHello, peer: str) -> WorkerHandle:
        """Adds a worker that said Hello.

        Raises:
            CallError: RESOURCE_EXHAUSTED when the fleet is full.
        """
        if len(self._workers) >= self.max_workers:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the fleet is full ({self.max_workers} workers); start the coordinator "
                "with a larger --max-workers or stop some workers",
            )
        worker_id = next(self._ids)
        name = self._unique_name(hello, worker_id)
        handle = WorkerHandle(
            worker_id=worker_id,
            name=name,
            hello=hello,
            peer=peer,
            first_stream=0,  # set from the scheduler's streams
            outbox=queue.SimpleQueue(),
            last_seen=time.monotonic(),
            assembler=ResultAssembler(max_total_bytes=self.max_result_bytes),
            data_assembler=ResultAssembler(max_total_bytes=self.max_result_bytes),
            inflight=InflightBudget(self.max_inflight_bytes, name),
        )
        self._workers[worker_id] = handle
        return handle

    def _unique_name(self, hello: WorkerHello, worker_id: int) -> str:
        base = hello.name or (f"{hello.host}:{hello.pid}" if hello.host else f"worker-{worker_id}")
        taken = {handle.name for handle in self._workers.values()}
        if base not in taken:
            return base
        return next(f"{base}-{n}" for n in itertools.count(2) if f"{base}-{n}" not in taken)

    def remove(self, worker_id: int) -> None:
        """Forgets a worker (idempotent)."""
        self._workers.pop(worker_id, None)

    def get(self, worker_id: int) -> WorkerHandle | None:
        """The worker with this id, if connected."""
        return self._workers.get(worker_id)

    def __iter__(self) -> Iterator[WorkerHandle]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)

    def silent(self, now: float, timeout: float) -> list[WorkerHandle]:
        """Workers whose last message is older than ``timeout`` seconds."""
        return [w for w in self._workers.values() if w.silent_for(now) > timeout]
