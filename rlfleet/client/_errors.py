"""Failed calls as the learner sees them: rlfleet's typed errors."""

from __future__ import annotations

import grpc

from rlfleet.errors import RlfleetError, UnavailableError
from rlfleet.protocol.error_reports import ErrorReport
from rlfleet.transport import rpc as _rpc

#: RESOURCE_EXHAUSTED's number, as a ``CallFailure`` carries a status code.
RESOURCE_EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]

RETRY_HINT = (
    "the coordinator is unreachable or went away; retry (the channel reconnects by itself, "
    "and a retried obtain_* call gets the same seeds)"
)


def call_error(exc: grpc.RpcError, *, what: str, timeout: float | None) -> RlfleetError:
    """The typed error of a failed call (see ``_rpc.error_from_rpc``).

    UnavailableError messages also say that retrying is the remedy.
    """
    return _hinted(_rpc.error_from_rpc(exc, what=what, timeout=timeout))


def failure_error(
    code: int, message: str, detail: ErrorReport | None, *, what: str, timeout: float | None
) -> RlfleetError:
    """The typed error of a request on a results connection that ended with a
    ``CallFailure``: the one its Sample call's status would have raised."""
    error = _rpc.error_from_status(
        _rpc.status_code(code), message, detail, what=what, timeout=timeout
    )
    return _hinted(error)


def _hinted(error: RlfleetError) -> RlfleetError:
    if isinstance(error, UnavailableError) and "retry" not in str(error):
        return UnavailableError(f"{error}: {RETRY_HINT}")
    return error
