"""The Lease stream of the learner face: from gRPC to the LeaseManager and back.

The handler opens the lease, then yields the lease's outbox; a reader thread
feeds the learner's calls to the manager in order. When the learner closes,
hangs up or its connection breaks, the lease is released: a learner that
dies frees its envs (gRPC's done-callback fires on a broken stream, and
keepalive pings notice a vanished host). Requests arrive decoded and
responses leave serialized (rlfleet.coordinator.lease_translation).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from rlfleet import _rpc
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.lease_translation import (
    RelayClose,
    RelayOpen,
    RelayRequest,
    opened_response,
)
from rlfleet.coordinator.leases import Lease, LeaseManager, learner_identity
from rlfleet.coordinator.worker_face import Malformed
from rlfleet.lease_messages import LeaseCallOrder

logger = logging.getLogger("rlfleet.coordinator")


class LeaseFace:
    """Serves ``rlfleet.v1.LearnerService/Lease``.

    Args:
        leases: The fleet's leases.
    """

    def __init__(self, leases: LeaseManager) -> None:
        self._leases = leases

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
                self._leases.close(lease)
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
            lease = self._leases.open(first, learner, gone.is_set)
        except CallError as exc:
            _rpc.abort(context, exc.code, exc.message, exc.detail)
        if gone.is_set():  # hung up while the envs were built
            self._leases.close(lease)
            return
        threading.Thread(
            target=self._read,
            args=(requests, lease),
            name=f"rlfleet-lease-{lease.lease_id}",
            daemon=True,
        ).start()
        yield opened_response(lease.lease_id, lease.spec or b"", self._leases.worker_names(lease))
        try:
            while True:
                event = lease.outbox.get()
                if event is None:
                    return
                if isinstance(event, CallError):
                    _rpc.abort(context, event.code, event.message, event.detail)
                yield event
        finally:
            self._leases.close(lease)

    def _read(self, requests: Iterator[RelayRequest | Malformed], lease: Lease) -> None:
        """The reader thread: the learner's calls, in order, until close or the stream ends."""
        try:
            for request in requests:
                if isinstance(request, Malformed):
                    raise CallError(
                        grpc.StatusCode.INVALID_ARGUMENT, f"malformed LeaseRequest: {request.error}"
                    )
                if isinstance(request, LeaseCallOrder):
                    self._leases.call(lease, request)
                elif isinstance(request, RelayClose):
                    break
                else:
                    raise CallError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"lease {lease.lease_id}: expected a call or close, got "
                        f"{_body_name(request)}",
                    )
        except CallError as exc:
            self._leases.fail(lease, exc)
            return
        except grpc.RpcError:
            pass  # the learner's stream broke: release below
        except Exception as exc:  # a bug here must not leave the lease's envs held
            logger.exception("internal error on lease %d", lease.lease_id)
            self._leases.fail(
                lease, CallError(grpc.StatusCode.INTERNAL, f"coordinator bug: {exc!r}")
            )
            return
        self._leases.close(lease)
        lease.outbox.put(None)


def _body_name(request: RelayRequest) -> str:
    """The LeaseRequest field a request came in, for errors."""
    if request is None:
        return "an empty LeaseRequest"
    if isinstance(request, LeaseCallOrder):
        return "call"
    return "open" if isinstance(request, RelayOpen) else "close"
