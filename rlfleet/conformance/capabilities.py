"""The capabilities the conformance kit knows, and those its test coordinator grants."""

from __future__ import annotations

from collections.abc import Iterable

from rlfleet.transport import rpc as _rpc

#: Capabilities defined by protocol version 1 (worker.proto Hello).
KNOWN_CAPABILITIES = frozenset(
    {
        "rlfleet.episodes",
        "rlfleet.fragments",
        "rlfleet.pickle",
        "rlfleet.leases",
        "rlfleet.multi-agent",
        "rlfleet.stream-takeover",
        "rlfleet.unit-columns",
        "rlfleet.data-results",
        "rlfleet.results-switch",
        "rlfleet.data-tasks",
        "rlfleet.data-heartbeats",
    }
)
#: Those the test coordinator grants: never pickle (it needs an opt-in and TLS),
#: never data-results (it reads results on the Join stream, which a worker
#: without the grant keeps them on); data-tasks only where a check serves a
#: data port of its own (:func:`granted_capabilities`).
GRANTED_CAPABILITIES = frozenset(
    {
        "rlfleet.episodes",
        "rlfleet.fragments",
        "rlfleet.leases",
        "rlfleet.stream-takeover",
        "rlfleet.unit-columns",
    }
)
#: What a worker must list for the kit's data port to carry its Tasks and Cancels.
_DATA_TASKS = frozenset({_rpc.LEASE_CAPABILITY, _rpc.DATA_TASKS_CAPABILITY})


def granted_capabilities(offered: Iterable[str], data_port: int | None) -> frozenset[str]:
    """What Welcome grants a worker that lists ``offered``: the kit's grants, and
    with a data port of the kit's ``rlfleet.data-tasks`` (with ``rlfleet.leases``)."""
    offered = frozenset(offered)
    granted = GRANTED_CAPABILITIES & offered
    return granted | _DATA_TASKS if data_port and offered >= _DATA_TASKS else granted
