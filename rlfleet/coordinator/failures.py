"""CallError: how coordinator code says "end this call with that status"."""

from __future__ import annotations

from typing import TypeAlias

import grpc
from google.protobuf.message import Message

from rlfleet.protocol.error_reports import ErrorReport

#: The structured error a call ends with: a report, or the ``ErrorDetail`` a
#: worker's lease reply carried, which the lease relay passes on as it came.
CallDetail: TypeAlias = ErrorReport | Message


class CallError(Exception):
    """Ends a gRPC call with ``code`` and ``message`` (and an error report).

    Raised anywhere below the faces; the face that owns the call turns it
    into the status (``rlfleet.transport.rpc.abort``), so the rules live in one place.

    Attributes:
        code: The gRPC status code.
        message: What went wrong and what to do, for the peer.
        detail: A structured error, sent in the trailing metadata.
    """

    def __init__(
        self, code: grpc.StatusCode, message: str, detail: CallDetail | None = None
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


def unavailable(message: str) -> CallError:
    """An UNAVAILABLE failure (retrying may succeed)."""
    return CallError(grpc.StatusCode.UNAVAILABLE, message)


def exhausted(message: str) -> CallError:
    """A RESOURCE_EXHAUSTED failure (a limit of the coordinator's was reached)."""
    return CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def detail_of(kind: int, message: str, *, worker: str = "") -> ErrorReport:
    """A coordinator-made report of ``kind`` (an ``ErrorKind`` value)."""
    return ErrorReport(kind, message, worker=worker)
