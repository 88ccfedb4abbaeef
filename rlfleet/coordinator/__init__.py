"""The coordinator: workers join it, learners sample from it.

``serve(CoordinatorConfig(...))`` starts one in-process; ``rlfleet
coordinator`` runs one as a process. See DESIGN.md and the .proto files for
the protocol it speaks on both faces.

The names below load on first use, so that ``rlfleet.scheduling.scheduler``
(pure Python, also driven by :class:`~rlfleet.sampling.local.LocalSampler`)
imports without gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlfleet.coordinator.config import CoordinatorConfig
    from rlfleet.coordinator.coordinator import Coordinator
    from rlfleet.coordinator.server import CoordinatorServer, serve

_HOMES = {
    "Coordinator": "rlfleet.coordinator.coordinator",
    "CoordinatorConfig": "rlfleet.coordinator.config",
    "CoordinatorServer": "rlfleet.coordinator.server",
    "serve": "rlfleet.coordinator.server",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rlfleet.coordinator' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = ["Coordinator", "CoordinatorConfig", "CoordinatorServer", "serve"]
