"""The coordinator: workers join it, learners sample from it.

``serve(CoordinatorConfig(...))`` starts one in-process; ``rlfleet
coordinator`` runs one as a process. See DESIGN.md and the .proto files for
the protocol it speaks on both faces.
"""

from rlfleet.coordinator.config import CoordinatorConfig
from rlfleet.coordinator.coordinator import Coordinator
from rlfleet.coordinator.server import CoordinatorServer, serve

__all__ = ["Coordinator", "CoordinatorConfig", "CoordinatorServer", "serve"]
