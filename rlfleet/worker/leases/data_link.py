"""A worker session's lease data connection (leases.proto, "The lease data channel").

The Welcome of a worker that hosts leases carries a ticket. The session
dials the coordinator's data port with it in the background; once accepted,
its lease replies go there instead of the Join stream. Lease commands start
coming there after the coordinator's switch marker on the Join stream
(LeaseCommand.data_switch): frames that arrive before the worker has seen
the marker are held back, so a command on the connection never overtakes
one still on its way on the stream. If the port cannot be reached,
everything stays on the Join stream (one WARNING says what to open).

A session that agreed on ``rlfleet.data-results`` also sends its results
here (:meth:`WorkerLeaseChannel.send_frames`, from the stepping thread, no
queue between), and, before it half-closes its Join stream on leaving, the
end-of-results marker (:meth:`WorkerLeaseChannel.end_results`). Sends wait
at most the send timeout (the coordinator's heartbeat timeout): past it the
connection counts as broken.

A connection that ends while the Join stream lives is a fault: WARNING, and
the session ends. One that ends with the Join stream (the coordinator stops,
or this worker leaves) is part of that end, which the Join stream's own line
reports: INFO.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from rlfleet.errors import RlfleetError, UnavailableError
from rlfleet.security import ClientTLS
from rlfleet.transport.data_address import warn_unreachable
from rlfleet.transport.lease_channel import DATA_DIAL_SECONDS, LeaseDataLink, dial

logger = logging.getLogger("rlfleet.worker")

#: Seconds a cleanly closed data connection waits for the Join stream to end
#: too: a stopping coordinator closes its data port a moment before it ends
#: the Join streams, and the two connections' ends race to the worker.
JOIN_END_GRACE_SECONDS = 1.0
#: Send timeout when the Welcome names no heartbeat timeout.
DEFAULT_SEND_SECONDS = 10.0


class WorkerLeaseChannel:
    """The data connection of one worker session.

    Args:
        host: The coordinator's host.
        port: Its data port (Welcome.lease_data.port).
        hello: The serialized LeaseDataHello.
        tls: The fleet's TLS settings, or None.
        max_frame_bytes: Longest frame accepted.
        on_command: Takes a frame from the coordinator (a serialized
            CoordinatorMessage holding a lease command), in order.
        on_broken: Called with the reason when an accepted connection
            breaks while the session runs (the session then ends and the
            worker rejoins, as after a lost stream).
        join_ended: Waits up to the given seconds for the Join stream to
            end (0: only looks); whether it ended, or the session is
            leaving on purpose.
        send_timeout: Seconds a send may wait for the coordinator to take
            the bytes.
    """

    def __init__(
        self,
        host: str,
        port: int,
        hello: bytes,
        *,
        tls: ClientTLS | None,
        max_frame_bytes: int,
        on_command: Callable[[bytes], None],
        on_broken: Callable[[str], None],
        join_ended: Callable[[float], bool],
        send_timeout: float = DEFAULT_SEND_SECONDS,
    ) -> None:
        self._address = (host, port)
        self._send_timeout = send_timeout
        self._hello = hello
        self._tls = tls
        self._max = max_frame_bytes
        self._on_command = on_command
        self._on_broken = on_broken
        self._join_ended = join_ended
        self._lock = threading.Lock()
        self._switched = False
        self._held: list[bytes] = []
        self._closed = False
        self._link: LeaseDataLink | None = None

    def start(self) -> None:
        """Dials in the background (started apart from the constructor: the
        switch marker may come back before the constructor's caller has
        stored this object where the Join stream's receiver finds it)."""
        threading.Thread(target=self._run, name="rlfleet-worker-lease-data", daemon=True).start()

    @property
    def connected(self) -> bool:
        """Whether replies go on the data connection."""
        return self._link is not None

    def send(self, payload: bytes) -> None:
        """Sends a reply frame (a serialized WorkerMessage holding ``lease_reply``).

        A broken connection ends the session (``on_broken``); the reply is
        lost with it, as the coordinator writes the worker off.
        """
        self._send([payload], "a lease reply")

    def send_frames(self, payloads: Sequence[bytes | memoryview]) -> None:
        """Sends results' serialized WorkerMessages, in order, from the caller's thread,
        in one send (:meth:`LeaseDataLink.send_frames`).

        A broken connection ends the session (``on_broken``): the result is
        lost with it, as the coordinator writes the worker off and re-runs
        its episodes.
        """
        self._send(payloads, "a result")

    def send_beat(self, payload: bytes) -> None:
        """Sends a heartbeat's serialized WorkerMessage; a broken connection ends
        the session (``on_broken``), as for a result."""
        self._send([payload], "a heartbeat")

    def _send(self, payloads: Sequence[bytes | memoryview], what: str) -> None:
        link = self._link
        if link is None:
            raise UnavailableError("the lease data connection is not open")
        try:
            link.send_frames(payloads)
        except OSError as exc:
            self._broken(f"sending {what} failed: {exc}")

    def end_results(self, marker: bytes) -> None:
        """Tells the coordinator that no result follows: sends ``marker`` (a
        serialized WorkerMessage holding ``leaving``) if the connection is open;
        else makes sure it never opens (a dial under way closes what it gets),
        as a closed connection says the same."""
        with self._lock:
            link = self._link
            if link is None:
                self._closed = True
                return
        try:
            link.send(marker)
        except OSError as exc:
            self._broken(f"sending the end of results failed: {exc}")

    def switch(self) -> None:
        """The coordinator's switch marker arrived on the Join stream: commands held
        back so far are handed on, and the next ones as they come."""
        with self._lock:
            self._switched = True
            held, self._held = self._held, []
            for payload in held:
                self._on_command(payload)

    def close(self) -> None:
        """Closes the connection (the session ended; idempotent)."""
        with self._lock:
            self._closed = True
            link = self._link
        if link is not None:
            link.close()

    def _run(self) -> None:
        host, port = self._address
        try:
            link = dial(
                host,
                port,
                self._hello,
                tls=self._tls,
                timeout=DATA_DIAL_SECONDS,
                max_frame_bytes=self._max,
            )
        except (OSError, UnavailableError) as exc:
            if not self._closed:
                warn_unreachable(host, port, "this worker", f"{type(exc).__name__}: {exc}")
            return
        link.set_send_timeout(self._send_timeout)
        with self._lock:
            if self._closed:
                link.close()
                return
            self._link = link
        logger.info("lease traffic uses the data channel at %s:%d", host, port)
        why = "the coordinator closed it"
        clean = False
        try:
            while (payload := link.receive()) is not None:
                with self._lock:
                    if self._switched:
                        self._on_command(payload)
                    else:
                        self._held.append(payload)
            clean = True
        except OSError as exc:
            why = f"connection broken: {exc}"
        except RlfleetError as exc:
            why = str(exc)
        self._broken(why, clean=clean)

    def _broken(self, why: str, *, clean: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # Only a clean close waits: a broken connection (reset, cut, bad frame)
        # is a fault even if the coordinator then ends the Join stream for it.
        if self._join_ended(JOIN_END_GRACE_SECONDS if clean else 0.0):
            # The Join stream's end ends the session and names why; telling the
            # session here too would race it and could name this connection.
            logger.info("the lease data connection ended with the Join stream (%s)", why)
            return
        logger.warning("the lease data connection ended (%s); rejoining", why)
        self._on_broken(why)
