"""The Python client library: sample on a fleet from a learner.

* :class:`RemoteSampler`: garage's Sampler API (``obtain_samples``,
  ``obtain_exact_episodes``, ...) over a coordinator, plus streaming,
  agent/env updates and status.
* :class:`RemoteVectorEnv`: tianshou's vector env with its envs leased on
  the fleet's workers (the counterpart of ``RayVectorEnv``).
* :class:`Fleet`: ``Fleet.local(workers=2)`` runs an embedded coordinator
  with worker subprocesses, the set-up-free default.
"""

from rlfleet.client.fleet import Fleet
from rlfleet.client.leases.remote_vector_env import RemoteVectorEnv
from rlfleet.client.sampler import RemoteSampler
from rlfleet.client.status import FleetStatus, WorkerStatus
from rlfleet.client.stream import SampleStream, StreamedBatch

__all__ = [
    "Fleet",
    "FleetStatus",
    "RemoteSampler",
    "RemoteVectorEnv",
    "SampleStream",
    "StreamedBatch",
    "WorkerStatus",
]
