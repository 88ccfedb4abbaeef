"""The conformance kit: does a worker, in any language, speak rlfleet's protocol?

``rlfleet conformance --worker-cmd "..."`` runs a worker command against a
scripted test coordinator and checks the handshake, sampling modes, updates,
chunking, errors, heartbeats, cancels and draining (docs/conformance.md).
``rlfleet conformance --coordinator HOST:PORT`` checks that a running
coordinator refuses bad lease data tickets and answers Sample requests sent
on a learner's results connection.

    from rlfleet.conformance import run_conformance

    results = run_conformance("node bin/rlfleet-node-worker.js --coordinator {address}",
                              env_id="rlfleet/CartPoleJS-v0")
    assert all(r.passed for r in results)

Names are imported on first use, so that the ``rlfleet`` command line does
not load gRPC and gymnasium for every subcommand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlfleet._util.imports import LazyNames
from rlfleet.conformance.defaults import DEFAULT_ENV_ID, DEFAULT_TIMEOUT

if TYPE_CHECKING:
    from rlfleet.conformance.checks import CHECKS, Check, CheckResult
    from rlfleet.conformance.coordinator_checks import (
        COORDINATOR_CHECKS,
        run_coordinator_conformance,
    )
    from rlfleet.conformance.scripted_coordinator import ScriptedCoordinator
    from rlfleet.conformance.suite import run_conformance

_LAZY = LazyNames(
    __name__,
    {
        "CHECKS": "rlfleet.conformance.checks",
        "Check": "rlfleet.conformance.checks",
        "CheckResult": "rlfleet.conformance.checks",
        "ScriptedCoordinator": "rlfleet.conformance.scripted_coordinator",
        "run_conformance": "rlfleet.conformance.suite",
        "COORDINATOR_CHECKS": "rlfleet.conformance.coordinator_checks",
        "run_coordinator_conformance": "rlfleet.conformance.coordinator_checks",
    },
)


def __getattr__(name: str) -> Any:
    return _LAZY(name)


__all__ = [
    "CHECKS",
    "COORDINATOR_CHECKS",
    "DEFAULT_ENV_ID",
    "DEFAULT_TIMEOUT",
    "Check",
    "CheckResult",
    "ScriptedCoordinator",
    "run_conformance",
    "run_coordinator_conformance",
]
