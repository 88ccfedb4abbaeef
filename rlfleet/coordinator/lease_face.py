"""The Lease stream of the learner face: from gRPC to the LeaseManager and back.

The handler opens the lease, then yields the lease's outbox; a reader thread
feeds the learner's calls to the manager in order. When the learner closes,
hangs up or its connection breaks, the lease is released: a learner that
dies frees its envs (gRPC's done-callback fires on a broken stream, and
keepalive pings notice a vanished host).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from rlfleet import _rpc
from rlfleet.coordinator.failures import CallError
from rlfleet.coordinator.leases import Lease, LeaseManager, learner_identity
from rlfleet.coordinator.worker_face import Malformed
from rlfleet.v1 import leases_pb2

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
        requests: Iterator[leases_pb2.LeaseRequest | Malformed],
        context: grpc.ServicerContext,
    ) -> Iterator[leases_pb2.LeaseResponse]:
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
            if first.WhichOneof("body") != "open":
                raise CallError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "the first message of a Lease stream must be LeaseRequest.open, got "
                    f"{first.WhichOneof('body') or 'an empty LeaseRequest'}",
                )
            learner = learner_identity(first.open.learner, context.peer())
            lease = self._leases.open(first.open, learner, gone.is_set)
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
        opened = leases_pb2.LeaseOpened(lease_id=lease.lease_id, env_spec=lease.spec)
        opened.env_workers.extend(self._leases.worker_names(lease))
        yield leases_pb2.LeaseResponse(opened=opened)
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

    def _read(self, requests: Iterator[leases_pb2.LeaseRequest | Malformed], lease: Lease) -> None:
        """The reader thread: the learner's calls, in order, until close or the stream ends."""
        try:
            for request in requests:
                if isinstance(request, Malformed):
                    raise CallError(
                        grpc.StatusCode.INVALID_ARGUMENT, f"malformed LeaseRequest: {request.error}"
                    )
                body = request.WhichOneof("body")
                if body == "call":
                    self._leases.call(lease, request.call)
                elif body == "close":
                    break
                else:
                    raise CallError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"lease {lease.lease_id}: expected a call or close, got "
                        f"{body or 'an empty LeaseRequest'}",
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
