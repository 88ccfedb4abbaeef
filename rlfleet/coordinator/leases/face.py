"""The Lease stream of the learner face: from gRPC to the LeaseManager and back.

The handler opens the lease, then yields the lease's outbox; a reader thread
feeds the learner's calls to the manager in order. When the learner closes,
hangs up or its connection breaks, the lease is released: a learner that
dies frees its envs (gRPC's done-callback fires on a broken stream, and
keepalive pings notice a vanished host). Requests arrive decoded and
responses leave serialized (rlfleet.coordinator.leases.translation).

With the lease data channel served, LeaseOpened carries a ticket; once the
learner's data connection presents it, the lease's requests and responses
travel there (data_peers.py) and go through the same :meth:`LeaseFace.handle`;
this stream still carries the open, the lease's end and its errors.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

import grpc

from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.leases.data_connections import LeaseConnection, LeaseDataPeer
from rlfleet.coordinator.leases.data_server import LeaseDataServer
from rlfleet.coordinator.leases.manager import Lease, LeaseManager, learner_identity
from rlfleet.coordinator.leases.translation import (
    RelayClose,
    RelayOpen,
    RelayRequest,
    opened_response,
    parse_request,
)
from rlfleet.coordinator.worker_face import Malformed, tolerant
from rlfleet.errors import UnavailableError
from rlfleet.transport import rpc as _rpc
from rlfleet.wire.leases import LeaseCallOrder

logger = logging.getLogger("rlfleet.coordinator")


class LeaseFace:
    """Serves ``rlfleet.v1.LearnerService/Lease``.

    Args:
        leases: The fleet's leases.
        lease_data: The lease data channel, or None when it is off.
        count_frame: Counts a frame received on it (metrics).
    """

    def __init__(
        self,
        leases: LeaseManager,
        lease_data: LeaseDataServer | None = None,
        count_frame: Callable[[str], None] = lambda party: None,
    ) -> None:
        self.leases = leases
        self._lease_data = lease_data
        self.count_frame = count_frame

    def lease(
        self,
        requests: Iterator[RelayRequest | Malformed],
        context: grpc.ServicerContext,
    ) -> Iterator[bytes]:
        """The Lease handler: open, then replies until the learner closes."""
        gone = threading.Event()
        lease: Lease | None = None

        def hung_up() -> None:
            gone.set()
            if lease is not None:
                self.leases.close(lease)
                lease.outbox.put(None)

        if not context.add_callback(hung_up):
            return
        try:
            first = next(requests)
        except StopIteration:
            return
        try:
            if isinstance(first, Malformed):
                raise CallError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"malformed LeaseRequest: {first.error}"
                )
            if not isinstance(first, RelayOpen):
                raise CallError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "the first message of a Lease stream must be LeaseRequest.open, got "
                    f"{_body_name(first)}",
                )
            learner = learner_identity(first.learner, context.peer())
            lease = self.leases.open(first, learner, gone.is_set)
        except CallError as exc:
            _rpc.abort(context, exc.code, exc.message, exc.detail)
        if gone.is_set():  # hung up while the envs were built
            self.leases.close(lease)
            return
        threading.Thread(
            target=self._read,
            args=(requests, lease),
            name=f"rlfleet-lease-{lease.lease_id}",
            daemon=True,
        ).start()
        server, data = self._lease_data, None
        if server is not None:
            data = (server.port, server.issue(lambda c: self._attach(lease, c)))
        spec, specs = lease.opened_specs()
        yield opened_response(lease.lease_id, spec, self.leases.worker_names(lease), data, specs)
        try:
            while True:
                event = lease.outbox.get()
                if event is None:
                    return
                if isinstance(event, CallError):
                    _rpc.abort(context, event.code, event.message, event.detail)
                yield event
        finally:
            self.leases.close(lease)
            if server is not None and data is not None:
                server.revoke(data[1])
            if lease.data is not None:
                lease.data.close(f"lease {lease.lease_id} ended")

    def _attach(self, lease: Lease, connection: LeaseConnection) -> LeaseDataPeer:
        """The learner presented the lease's ticket: its traffic moves to ``connection``."""
        if lease.closed:
            raise UnavailableError(f"lease {lease.lease_id} ended before its data connection")
        # No call is in flight yet (the learner sends none before
        # LeaseDataAccepted), so no response can be left on the stream's side.
        lease.data = connection
        return _LearnerDataPeer(self, lease, connection)

    def _read(self, requests: Iterator[RelayRequest | Malformed], lease: Lease) -> None:
        """The reader thread: the learner's requests on this stream, in order,
        until close or the stream ends (on the data channel: its end only)."""
        try:
            for request in requests:
                if not self.handle(lease, request):
                    return
        except grpc.RpcError:
            pass  # the learner's stream broke: release below
        self.leases.close(lease)
        lease.outbox.put(None)

    def handle(self, lease: Lease, request: RelayRequest | Malformed) -> bool:
        """One request of the learner, whichever carrier it came on; False once
        the lease is over (closed, or failed with a protocol error)."""
        try:
            if isinstance(request, Malformed):
                raise CallError(
                    grpc.StatusCode.INVALID_ARGUMENT, f"malformed LeaseRequest: {request.error}"
                )
            if isinstance(request, LeaseCallOrder):
                self.leases.call(lease, request)
                return True
            if isinstance(request, RelayClose):
                self.leases.close(lease)
                lease.outbox.put(None)
                return False
            raise CallError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"lease {lease.lease_id}: expected a call or close, got {_body_name(request)}",
            )
        except CallError as exc:
            self.leases.fail(lease, exc)
        except Exception as exc:  # a bug here must not leave the lease's envs held
            logger.exception("internal error on lease %d", lease.lease_id)
            self.leases.fail(
                lease, CallError(grpc.StatusCode.INTERNAL, f"coordinator bug: {exc!r}")
            )
        return False


class _LearnerDataPeer:
    """A lease's data connection: requests in (:meth:`LeaseFace.handle`),
    responses out (``Lease.post``)."""

    def __init__(self, face: LeaseFace, lease: Lease, connection: LeaseConnection) -> None:
        self._face = face
        self._lease = lease
        self._connection = connection

    def on_frames(self, payloads: list[bytes | memoryview]) -> None:
        for payload in payloads:
            self._face.count_frame("learner")
            # A large request arrives as a bytearray: read as bytes (one copy, as ever).
            if not self._face.handle(self._lease, _parse_request(bytes(payload))):
                self._connection.close(f"lease {self._lease.lease_id} is over")

    def on_closed(self, reason: str) -> None:
        lease = self._lease
        if not lease.closed:
            self._face.leases.fail(
                lease,
                CallError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"lease {lease.lease_id}: its data connection ended ({reason}); its envs "
                    "were released, open a new lease",
                ),
            )


_parse_request = tolerant(parse_request)


def _body_name(request: RelayRequest) -> str:
    """The LeaseRequest field a request came in, for errors."""
    if request is None:
        return "an empty LeaseRequest"
    if isinstance(request, LeaseCallOrder):
        return "call"
    return "open" if isinstance(request, RelayOpen) else "close"
