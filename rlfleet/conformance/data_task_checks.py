"""The data tasks check: a worker that advertises ``rlfleet.data-tasks`` honours it.

The kit serves a lease data port of its own (:class:`KitDataPort`), names it
in the Welcome of a fresh worker with ``rlfleet.leases`` and
``rlfleet.data-tasks`` granted, accepts the worker's connection, sends the
switch marker on the Join stream and then its Tasks and Cancels on the
connection (docs/protocol.md, "The lease data channel", "Tasks and
Cancels"): a Task made for the next agent version, sent before its update,
must wait for it (no result, no error) and then run with that version; a
Task whose Cancel came first must never run.
"""

from __future__ import annotations

import socket

from rlfleet.conformance._expectations import check_pinned
from rlfleet.conformance._failure import CheckFailed
from rlfleet.conformance.agents import pinned_agent
from rlfleet.conformance.kit_messages import KitCommand, command_bytes, switch_marker
from rlfleet.conformance.link import WelcomeSettings, WorkerLink
from rlfleet.conformance.runner import WorkerHarness
from rlfleet.errors import ConnectionClosedError, ProtocolError, UsageError
from rlfleet.protocol.join import TaskAssignment, TaskCancel
from rlfleet.protocol.modes import Mode
from rlfleet.protocol.unit_columns import UnitColumns
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.lease_channel import FRAME_HEADER, HANDSHAKE_FRAME_BYTES, frame

#: Task ids of this check's tasks (far from the link's own, which count from 1).
_FIRST_TASK_ID = 1_000_001
#: Units per task of the check.
_UNITS = 4
#: Seconds the kit watches for a held Task being run or refused too early.
_HOLD_SECONDS = 0.5


class KitDataPort:
    """A lease data port that accepts one worker connection with any ticket."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._sock: socket.socket | None = None

    def accept(self, timeout: float) -> None:
        """Takes the worker's connection and its first frame (a LeaseDataHello),
        and accepts it.

        Raises:
            OSError: If no worker dials within ``timeout`` seconds (a
                ``ConnectionClosedError`` if it hangs up in its hello).
            ProtocolError: If its first frame is longer than a
                LeaseDataHello may be.
        """
        self._server.settimeout(timeout)
        sock, _ = self._server.accept()
        sock.settimeout(timeout)
        (length,) = FRAME_HEADER.unpack(_read(sock, FRAME_HEADER.size))
        if length > HANDSHAKE_FRAME_BYTES:
            sock.close()
            raise ProtocolError(f"a first frame of {length} bytes: not a LeaseDataHello")
        _read(sock, length)  # its ticket: the kit accepts any
        sock.sendall(frame(b""))  # LeaseDataAccepted
        self._sock = sock

    def send(self, payload: bytes) -> None:
        """Sends one frame to the worker."""
        if self._sock is None:
            raise UsageError("no worker connection was accepted: accept() one first")
        self._sock.sendall(frame(payload))

    def close(self) -> None:
        for sock in (self._sock, self._server):
            if sock is not None:
                sock.close()


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        more = sock.recv(count - len(data))
        if not more:
            raise ConnectionClosedError("the worker closed its data connection during its hello")
        data += more
    return data


def check_data_tasks(harness: WorkerHarness) -> str:
    """The data tasks check (see the module's docstring)."""
    hello = harness.shared().hello
    if not {_rpc.LEASE_CAPABILITY, _rpc.DATA_TASKS_CAPABILITY} <= set(hello.capabilities):
        return (
            "'rlfleet.data-tasks' (with 'rlfleet.leases') not advertised: coordinators send "
            "this worker every Task and Cancel on its Join stream, so nothing was tried"
        )
    port = KitDataPort()
    try:
        with harness.fresh(WelcomeSettings(data_port=port.port)) as (_, link):
            try:
                port.accept(link.timeout)
            except (OSError, ProtocolError) as exc:
                raise link.failure(
                    f"no lease data connection to the Welcome's port {port.port}: {exc}"
                ) from exc
            link.update_env(harness.env_id)
            link.session.send(switch_marker())
            return _gating(link, port) + "; " + _early_cancel(link, port)
    finally:
        port.close()


def _task(link: WorkerLink, offset: int, agent_version: int, seed: int) -> TaskAssignment:
    """A task of the check, booked on the link (its results are checked as they come)."""
    task = TaskAssignment(
        task_id=_FIRST_TASK_ID + offset,
        request_id=_FIRST_TASK_ID + offset,
        mode=int(Mode.EPISODES),
        agent_version=agent_version,
        env_generation=link.generation,
        units=UnitColumns.seeded(seed, 0, range(_UNITS)),
    )
    link.tasks[task.task_id] = task
    link.results[task.task_id] = []
    return task


def _send(link: WorkerLink, port: KitDataPort, command: KitCommand) -> None:
    _, data = command_bytes(command, unit_columns=link.grants(_rpc.UNIT_COLUMNS_CAPABILITY))
    try:
        port.send(data)
    except OSError as exc:
        raise link.failure(f"the worker's lease data connection broke: {exc}") from exc


def _gating(link: WorkerLink, port: KitDataPort) -> str:
    """A Task for the next agent version waits for its AgentUpdate."""
    version = link.next_version
    task = _task(link, 0, version, seed=31)
    _send(link, port, task)
    try:
        link.pump(_HOLD_SECONDS)
    except CheckFailed as exc:
        raise CheckFailed(
            f"task {task.task_id}, made for agent version {version}, came on the data "
            f"connection before its AgentUpdate: hold it until the update is applied, "
            f"without an error ({exc})"
        ) from exc
    if link.returned(task):
        raise link.failure(
            f"task {task.task_id}, made for agent version {version}, ran on version "
            f"{link.agent_version} before its AgentUpdate arrived: hold such a Task until "
            "the update is applied"
        )
    agent = pinned_agent(link.spec)
    link.update_agent(agent.params, policy=agent.policy, version=version)
    check_pinned(link, agent, link.collect(task), "in a Task that waited for its AgentUpdate")
    return (
        f"a Task for agent version {version} sent on the data connection before its "
        "AgentUpdate waited for it and ran with it"
    )


def _early_cancel(link: WorkerLink, port: KitDataPort) -> str:
    """A Task whose Cancel arrived first never runs."""
    cancelled = _task(link, 1, link.agent_version, seed=32)
    probe = _task(link, 2, link.agent_version, seed=33)
    _send(link, port, TaskCancel(cancelled.task_id))
    _send(link, port, cancelled)
    _send(link, port, probe)
    link.collect(probe)
    link.pump(_HOLD_SECONDS)
    if link.returned(cancelled):
        raise link.failure(
            f"task {cancelled.task_id} ran although its Cancel came before it: keep a "
            f"Cancel of a task not seen yet (units {sorted(link.returned(cancelled))} "
            "came back)"
        )
    return "a Task cancelled before it arrived never ran, the Task after it did"
