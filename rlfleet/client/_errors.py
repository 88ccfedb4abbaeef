"""Failed calls as the learner sees them: rlfleet's typed errors."""

from __future__ import annotations

import grpc

from rlfleet.errors import RlfleetError, UnavailableError
from rlfleet.transport import rpc as _rpc

RETRY_HINT = (
    "the coordinator is unreachable or went away; retry (the channel reconnects by itself, "
    "and a retried obtain_* call gets the same seeds)"
)


def call_error(exc: grpc.RpcError, *, what: str, timeout: float | None) -> RlfleetError:
    """The typed error of a failed call (see ``_rpc.error_from_rpc``).

    UnavailableError messages also say that retrying is the remedy.
    """
    error = _rpc.error_from_rpc(exc, what=what, timeout=timeout)
    if isinstance(error, UnavailableError) and "retry" not in str(error):
        return UnavailableError(f"{error}: {RETRY_HINT}")
    return error
