"""The coordinator: workers join it, learners sample from it.

``serve(CoordinatorConfig(...))`` starts one in-process; ``rlfleet
coordinator`` runs one as a process. See docs/architecture.md for its
modules and the .proto files for the protocol it speaks on both faces.

The names below load on first use, so that importing the package loads no
gRPC until one of them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlfleet._util.imports import LazyNames

if TYPE_CHECKING:
    from rlfleet.coordinator.config import CoordinatorConfig
    from rlfleet.coordinator.coordinator import Coordinator
    from rlfleet.coordinator.server import CoordinatorServer, serve

_LAZY = LazyNames(
    __name__,
    {
        "Coordinator": "rlfleet.coordinator.coordinator",
        "CoordinatorConfig": "rlfleet.coordinator.config",
        "CoordinatorServer": "rlfleet.coordinator.server",
        "serve": "rlfleet.coordinator.server",
    },
)


def __getattr__(name: str) -> Any:
    return _LAZY(name)


__all__ = ["Coordinator", "CoordinatorConfig", "CoordinatorServer", "serve"]
