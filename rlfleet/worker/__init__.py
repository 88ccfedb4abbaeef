"""Workers: run episodes of a policy in gymnasium envs on one machine.

:class:`VecWorker` is the engine (n env copies, one batched policy call per
step, an incremental API for the remote worker); :class:`DefaultWorker` is
garage's one-env worker on top of it.
"""

from rlfleet.worker._restarts import EnvRestartBudget
from rlfleet.worker.default import DefaultWorker
from rlfleet.worker.units import EpisodeUnit, make_units
from rlfleet.worker.vec import VecWorker

__all__ = ["DefaultWorker", "EnvRestartBudget", "EpisodeUnit", "VecWorker", "make_units"]
