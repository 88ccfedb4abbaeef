"""CallError: how coordinator code says "end this call with that status"."""

from __future__ import annotations

import grpc

from rlfleet.v1 import updates_pb2


class CallError(Exception):
    """Ends a gRPC call with ``code`` and ``message`` (and an ErrorDetail).

    Raised anywhere below the faces; the face that owns the call turns it
    into the status (``rlfleet._rpc.abort``), so the rules live in one place.

    Attributes:
        code: The gRPC status code.
        message: What went wrong and what to do, for the peer.
        detail: A structured error, sent in the trailing metadata.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        detail: updates_pb2.ErrorDetail | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail

    def __repr__(self) -> str:
        return f"CallError({self.code.name}, {self.message!r})"


def invalid(message: str) -> CallError:
    """An INVALID_ARGUMENT failure (the request itself is wrong)."""
    return CallError(grpc.StatusCode.INVALID_ARGUMENT, message)


def detail_of(kind: int, message: str, *, worker: str = "") -> updates_pb2.ErrorDetail:
    """A coordinator-made ErrorDetail of ``kind`` (an ``ErrorKind`` value)."""
    return updates_pb2.ErrorDetail(
        kind=kind,  # type: ignore[arg-type]
        message=message,
        worker=worker,
    )


def describe(detail: updates_pb2.ErrorDetail) -> str:
    """One-line text of a worker's ErrorDetail: the message and where it happened."""
    where = []
    if detail.worker:
        where.append(f"worker {detail.worker!r}")
    if detail.HasField("env_index"):
        where.append(f"env {detail.env_index}")
    if detail.HasField("step"):
        where.append(f"step {detail.step}")
    if detail.HasField("episode_index"):
        where.append(f"episode {detail.episode_index}")
    text = detail.message or updates_pb2.ErrorKind.Name(detail.kind)
    return f"{text} ({', '.join(where)})" if where else text
