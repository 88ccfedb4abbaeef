"""A session's leases: commands in from the Join stream or the data connection, replies out.

The remote worker's :class:`~rlfleet.worker._session.Session` owns one
:class:`SessionLeases` per joined stream. Lease commands arrive on the Join
stream (its receiver thread hands them here) or, once the coordinator
switched this worker over, on the lease data connection; replies go out
on the data connection once it is open, else on the stream.

Results (``rlfleet.data-results``) go on the stream until the data
connection is open, then on the connection for the rest of the session.
With ``rlfleet.results-switch`` agreed, they move at the first result
boundary after the connection opened, the results switch marker on the
stream saying where (the coordinator books the connection's results only
once it has read the marker, so none overtakes one sent before it);
without it, a session keeps the carrier of its first result.

With ``rlfleet.data-tasks`` agreed, the connection also brings the session's
Tasks and Cancels after the switch marker; they go to the session's main
loop (``on_work``), which holds a Task until its updates, which stay on the
stream, were applied (``rlfleet.worker._held_tasks``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from rlfleet.errors import UnavailableError
from rlfleet.protocol.join import ResultsSwitch, WorkerBeat, WorkerLeaving, WorkerWelcome
from rlfleet.security import ClientTLS, PickleGate
from rlfleet.transport import rpc as _rpc
from rlfleet.transport.data_address import coordinator_host
from rlfleet.wire.leases import data_hello
from rlfleet.worker._connection import JoinStream
from rlfleet.worker._join_messages import (
    DataChannelWork,
    LeaseCommandIn,
    LeaseDataSwitch,
    lease_reply,
    parse_lease_frame,
    serialize_outgoing,
)
from rlfleet.worker.leases.data_link import DEFAULT_SEND_SECONDS, WorkerLeaseChannel
from rlfleet.worker.leases.host import LeaseHost

logger = logging.getLogger("rlfleet.worker")


class SessionLeases:
    """The envs leased on this worker during one session, and their data connection.

    Args:
        stream: The session's Join stream.
        welcome: The coordinator's Welcome (it names the data channel's port and ticket).
        name: The worker's name, in replies.
        imports: Modules leased envs may be imported from.
        pickle: This worker's pickle gate: whether it takes pickled env factories.
        coordinator: The coordinator's address (its host serves the data channel).
        tls: TLS settings of the data connection.
        lease_slots: The worker's lease slots (0: it hosts no leases, no data connection).
        max_frame_bytes: Largest frame on the data connection.
        leaving: Whether the session is leaving (the data connection then stops redialling).
        on_broken: Called with the reason when the data connection broke.
        on_work: Takes a Task or Cancel of the data connection (with
            ``rlfleet.data-tasks`` agreed), in order, from its reader thread.
    """

    def __init__(
        self,
        stream: JoinStream,
        welcome: WorkerWelcome,
        *,
        name: str,
        imports: tuple[str, ...],
        pickle: PickleGate,
        coordinator: str,
        tls: ClientTLS | None,
        lease_slots: int | None,
        max_frame_bytes: int,
        leaving: Callable[[], bool],
        on_broken: Callable[[str], None],
        on_work: Callable[[DataChannelWork], None],
    ) -> None:
        self._stream = stream
        self._on_work = on_work
        self._tasks_agreed = _rpc.DATA_TASKS_CAPABILITY in welcome.capabilities
        self._leaving = leaving
        self.host = LeaseHost(imports, lambda report: self.send(lease_reply(report, name)), pickle)
        self._channel: WorkerLeaseChannel | None = None
        self._results_agreed = _rpc.DATA_RESULTS_CAPABILITY in welcome.capabilities
        # Without the switch agreed, the carrier is fixed at the session's first result.
        self._switch_agreed = _rpc.RESULTS_SWITCH_CAPABILITY in welcome.capabilities
        self._beats_agreed = _rpc.DATA_HEARTBEATS_CAPABILITY in welcome.capabilities
        self._results_on_data: bool | None = None  # None: no result sent yet
        self._join_results = 0  # results sent on the stream
        stream.lease_handler = self.submit
        if welcome.lease_data is not None and lease_slots != 0:
            port, ticket = welcome.lease_data
            self._channel = WorkerLeaseChannel(
                coordinator_host(coordinator),
                port,
                data_hello(ticket),
                tls=tls,
                max_frame_bytes=max_frame_bytes,
                on_command=self._data_command,
                on_broken=on_broken,
                join_ended=self._join_ended,
                send_timeout=welcome.heartbeat_timeout_seconds or DEFAULT_SEND_SECONDS,
            )

    def start(self) -> None:
        """Dials the data connection, if the coordinator offered one."""
        if self._channel is not None:
            self._channel.start()

    def submit(self, command: LeaseCommandIn | LeaseDataSwitch) -> None:
        """Hands a lease command to the LeaseHost (from the receiver thread too)."""
        if isinstance(command, LeaseDataSwitch):
            if self._channel is not None:
                self._channel.switch()
            return
        if command.order is None:
            logger.warning("ignored an empty LeaseCommand for lease %d", command.lease_id)
        else:
            self.host.submit(command.order)

    def send(self, reply: bytes) -> None:
        """Sends a serialized lease reply on the data connection once it is open, else on
        the stream."""
        channel = self._channel
        if channel is not None and channel.connected:
            channel.send(reply)
        else:
            self._stream.send(reply)

    @property
    def results_on_data(self) -> bool:
        """Whether the next result goes on the data connection: once it is open
        (at a result boundary, with the results switch agreed: the marker goes
        on the stream first), then for the rest of the session; without the
        switch, whatever the session's first result took. Asked from the
        stepping thread only, before each result is encoded and sent."""
        on_data = self._results_on_data
        if on_data or (on_data is not None and not self._switch_agreed):
            return on_data
        channel = self._channel
        if self._results_agreed and channel is not None and channel.connected:
            if self._switch_agreed:
                # Every result before it is on the stream already: the
                # coordinator books those before the connection's.
                self._stream.send(ResultsSwitch())
            self._results_on_data = True
            if on_data is None:
                logger.info("this session's results go on the lease data channel")
            else:
                logger.info(
                    "this session's results move to the lease data channel, now open, after %d "
                    "on the Join stream",
                    self._join_results,
                )
            return True
        if on_data is None and self._results_agreed:
            logger.info(
                "this session's results go on the Join stream (no data connection yet)%s",
                "; they move to the data channel once it opens" if self._switch_agreed else "",
            )
        self._results_on_data = False
        return False

    def send_results(self, messages: Sequence[bytes | memoryview], results: int = 1) -> bool:
        """Sends ``results`` results' serialized WorkerMessages on the data
        connection, in one send, if they travel there (:attr:`results_on_data`);
        False: the caller sends them on the stream. The messages are the
        kernel's once this returns."""
        if self.results_on_data and self._channel is not None:
            self._channel.send_frames(messages)
            return True
        self._join_results += results
        return False

    def send_beat(self, beat: WorkerBeat) -> bool:
        """Sends a heartbeat on the data connection while it is open, if agreed
        (``rlfleet.data-heartbeats``); False: the caller sends it on the stream.

        On the coordinator a heartbeat there is one read of its data loop,
        where on the stream it wakes gRPC's threads, each worker's every second.
        """
        channel = self._channel
        if self._beats_agreed and channel is not None and channel.connected:
            try:
                channel.send_beat(serialize_outgoing(beat))
            except UnavailableError:  # closed meanwhile: the stream takes it
                return False
            return True
        return False

    def end_results(self) -> None:
        """Before the stream's half-close: tells the coordinator, on the data
        connection, that no result follows there (it waits for that before it
        books the session's end, so no result still on the socket is lost)."""
        if self._results_agreed and self._channel is not None:
            self._channel.end_results(serialize_outgoing(WorkerLeaving("no more results")))

    def close(self) -> None:
        """Closes the data connection and every leased env."""
        if self._channel is not None:
            self._channel.close()
        self.host.shutdown()

    def _data_command(self, payload: bytes) -> None:
        """A frame of the data connection: a CoordinatorMessage holding a lease
        command, or with ``rlfleet.data-tasks`` agreed a Task or Cancel.

        Raises:
            WireFormatError: If it is anything else (the connection then ends).
        """
        command = parse_lease_frame(payload, tasks=self._tasks_agreed)
        if isinstance(command, DataChannelWork):
            self._on_work(command)
        else:
            self.submit(command)

    def _join_ended(self, seconds: float) -> bool:
        """Whether this session is leaving, or its Join stream ends within ``seconds``."""
        if self._leaving():
            return True
        return self._stream.wait_closed(seconds)
